"""The benchmark scripts, a package so that they share `common.py` by a plain import.

Run them from the repository root as modules, e.g. `python -m benchmarks.accuracy --quick`
(`python -m benchmarks.<name> --help` lists the options). Not installed with the library.
"""
