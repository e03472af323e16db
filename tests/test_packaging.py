"""setup.py takes its dependencies from requirements.txt, the one list of them, and ships it."""

import os
import re
import runpy

import pytest
import setuptools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup_kwargs():
    """The keyword arguments setup.py passes to `setuptools.setup` (nothing is built)."""
    captured = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
        patch.chdir(ROOT)  # as pip runs it: find_packages looks in the working directory
        runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="__main__")
    return captured


def requirements_txt():
    lines = open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8").read().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_setup_py_installs_what_requirements_txt_lists(setup_kwargs):
    assert requirements_txt()  # both files exist, and the list is not empty
    assert setup_kwargs["install_requires"] == requirements_txt()


def test_setup_py_names_no_runtime_range_of_its_own():
    text = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    for requirement in requirements_txt():
        assert requirement not in text, f"{requirement!r} is written out in setup.py too"


def test_source_distributions_ship_requirements_txt():
    manifest = open(os.path.join(ROOT, "MANIFEST.in"), encoding="utf-8").read().splitlines()
    assert "include requirements.txt" in manifest


def test_gpu_extra_takes_the_tensorflow_range(setup_kwargs):
    tensorflow = next(r for r in requirements_txt() if r.startswith("tensorflow>"))
    assert setup_kwargs["extras_require"]["gpu"] == [
        tensorflow.replace("tensorflow", "tensorflow[and-cuda]", 1)
    ]


def test_test_extra_pins_ruff_exactly(setup_kwargs):
    pins = [r for r in setup_kwargs["extras_require"]["test"] if r.startswith("ruff")]
    assert len(pins) == 1 and re.fullmatch(r"ruff==\d+\.\d+\.\d+", pins[0]), pins


def test_zoo_installs_as_tf_spectrain_models(setup_kwargs):
    assert setup_kwargs["package_dir"]["tf_spectrain.models"] == "models"
    assert "tf_spectrain.models" in setup_kwargs["packages"]
    assert not [p for p in setup_kwargs["packages"] if not p.startswith("tf_spectrain")]


def test_undeclared_but_needed_packages_are_declared():
    # TF-NOTES: TF 2.21 does not pull in tensorboard, tfds 4.9.10 does not declare
    # importlib_resources; the digits set comes from scikit-learn.
    names = {r.split(">")[0].split("<")[0].split("=")[0] for r in requirements_txt()}
    assert {"tensorboard", "importlib_resources", "scikit-learn", "tensorflow",
            "keras", "tensorflow-datasets", "numpy"} <= names
