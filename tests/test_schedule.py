"""Tests for the `tf_spectrain.schedule` package as a whole: pure Python, every name exported.

The instruction lists and versions are tested in test_instructions.py, the clock tables in
test_clock.py.
"""

import ast
from pathlib import Path

from tf_spectrain import schedule

# What `tf_spectrain.schedule` exported as a single module: the runtime, the cost model,
# the callbacks and the tests use these names.
PUBLIC = [
    "BACKWARD", "FORWARD", "KINDS", "SYNC_SCHEDULES", "TARGETS", "UPDATE", "Op", "async_ops",
    "backward_version", "bubble_fraction", "clock_table", "forward_version", "format_table",
    "max_in_flight", "max_stashed", "op_lists", "sync_ops", "version_gaps", "versions_seen",
    "warmup_forwards",
]


PACKAGE = Path(schedule.__file__).parent
LIBRARY = PACKAGE.parent  # the tf_spectrain folder


def _imports(path):
    """The modules a source file imports, as absolute names (relative imports resolved)."""
    package = ["tf_spectrain", *path.parent.relative_to(LIBRARY).parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + [base]).strip(".")
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def _source(module):
    """The file of a `tf_spectrain` module or package, or None for other names."""
    parts = module.split(".")[1:]
    for path in (LIBRARY.joinpath(*parts).with_suffix(".py"),
                 LIBRARY.joinpath(*parts, "__init__.py")):
        if parts and path.is_file():
            return path
    return None


def test_package_imports_no_tensorflow_keras_or_numpy_even_indirectly():
    """Every module of the package, and every tf_spectrain module they import (the checks,
    the messages), imports neither TensorFlow nor Keras nor NumPy."""
    todo = sorted(PACKAGE.glob("*.py"))
    assert len(todo) >= 3  # __init__, instructions, clock
    seen, imported = set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            imported.add(name.split(".")[0])
            source = _source(name) if name.startswith("tf_spectrain.") else None
            if source is not None:
                todo.append(source)
    assert {"dataclasses", "tf_spectrain"} <= imported
    assert not imported & {"tensorflow", "keras", "numpy"}, sorted(seen)
    assert {p.name for p in seen} >= {"checks.py", "messages.py"}


def test_every_public_name_is_exported():
    for name in PUBLIC:
        assert hasattr(schedule, name), name
    assert sorted(schedule.__all__) == sorted(PUBLIC)
    assert schedule.Op is schedule.instructions.Op
    assert schedule.clock_table is schedule.clock.clock_table
