"""The `train.py` application and the worker command. Nothing in the library imports it."""
