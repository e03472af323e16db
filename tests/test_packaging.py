"""setup.py and requirements.txt name the same dependencies with the same ranges."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def setup_requirements():
    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.targets[0].id == "INSTALL_REQUIRES":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no INSTALL_REQUIRES")


def test_requirements_txt_matches_setup_py():
    lines = open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8").read().splitlines()
    listed = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert listed == setup_requirements()


def test_undeclared_but_needed_packages_are_declared():
    # TF-NOTES: TF 2.21 does not pull in tensorboard, tfds 4.9.10 does not declare
    # importlib_resources; the digits set comes from scikit-learn.
    names = {r.split(">")[0].split("<")[0].split("=")[0] for r in setup_requirements()}
    assert {"tensorboard", "importlib_resources", "scikit-learn", "tensorflow",
            "keras", "tensorflow-datasets", "numpy"} <= names
