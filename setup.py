"""Install tf_spectrain: the library, with the `models/` folder as `tf_spectrain.models`."""
import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent


def read_requirements(path):
    """The requirement lines of a requirements file, without comments and blank lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


# requirements.txt is the one list of runtime dependencies (MANIFEST.in ships it).
INSTALL_REQUIRES = read_requirements(HERE / "requirements.txt")
TENSORFLOW = next(r for r in INSTALL_REQUIRES if r.startswith("tensorflow>"))
EXTRAS_REQUIRE = {
    # matplotlib: tests/test_benchmarks.py runs the benchmarks, plots included. ruff: the
    # linter, pinned so that every machine checks the same rules. pytest-xdist: the suite
    # runs on one worker per core (pytest.ini). import-linter: the floors of the package
    # (pyproject.toml's contracts), pinned like the linter; grimp, its import graph, also
    # read by tests/test_layout.py.
    "test": [
        "pytest>=8,<10", "pytest-xdist>=3.5,<4", "matplotlib>=3.8,<4", "ruff==0.17.6",
        "import-linter==2.17", "grimp>=3.5,<4",
    ],
    "gpu": [TENSORFLOW.replace("tensorflow", "tensorflow[and-cuda]", 1)],  # the same range
    "bench": ["matplotlib>=3.8,<4"],  # the PNG plots of benchmarks/
}

setup(
    name="tf_spectrain",
    version="0.1.0",
    description=(
        "Pipelined model parallelism with SpecTrain weight prediction for TensorFlow/Keras"
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tf_spectrain", "tf_spectrain.*"]) + ["tf_spectrain.models"],
    # The zoo lives in the top-level `models/` folder but installs as `tf_spectrain.models`:
    # a top-level package named `models` would collide with others in users' environments.
    package_dir={"tf_spectrain": "tf_spectrain", "tf_spectrain.models": "models"},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    license="Apache-2.0",
)
