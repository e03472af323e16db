"""Tests for the cost model package as a whole: its pure modules import no TensorFlow.

Each module has its own tests: test_hardware.py, test_profile.py, test_simulate.py,
test_predict.py, test_planning.py and test_measure.py.
"""

import ast
import pathlib

import pytest

from tf_spectrain import costmodel

# --- the pure parts stay pure -------------------------------------------------------------

PURE = ["../checks", "hardware", "links", "profile", "simulate", "predict", "async_pipeline",
        "sync_pipeline", "planning", "stage_terms", "term_checks", "plan", "run_plan",
        "__init__"]


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_tensorflow(module):
    path = pathlib.Path(costmodel.__file__).parent / f"{module}.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"tensorflow", "keras", "numpy"}
