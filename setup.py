"""Install tf_spectrain: the library, with the `models/` folder as `tf_spectrain.models`."""
import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent

# Keep these ranges identical to requirements.txt (tests/test_packaging.py checks it).
INSTALL_REQUIRES = [
    "tensorflow>=2.21,<2.22",
    "keras>=3.15,<4",
    "tensorflow-datasets>=4.9.10,<5",
    "tensorboard>=2.20,<3",
    "importlib_resources>=6",
    "numpy>=1.26,<3",
    "scikit-learn>=1.5,<2",
]
EXTRAS_REQUIRE = {
    # matplotlib: tests/test_benchmarks.py runs the benchmarks, plots included.
    "test": ["pytest>=8,<10", "matplotlib>=3.8,<4"],
    "gpu": ["tensorflow[and-cuda]>=2.21,<2.22"],
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
