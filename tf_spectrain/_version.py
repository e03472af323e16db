"""The package's version, readable without importing the rest of the package."""

__version__ = "0.1.0"
