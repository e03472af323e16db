"""The house's bounds, read from the source: a small root, small rooms, no import loops.

The floors themselves (which folder may import which) are import-linter contracts in
pyproject.toml, checked by `lint-imports` in .ci/run; here the bounds a contract cannot say.
"""

import ast
import pathlib

import grimp
import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tf_spectrain"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_ROOT_MODULES, MAX_MODULE_LINES, MAX_CLASS_LINES = 8, 400, 300


def test_the_root_keeps_at_most_eight_modules():
    root = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(root) <= MAX_ROOT_MODULES, sorted(root)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_classes_stay_small(path):
    source = path.read_text(encoding="utf-8")
    assert source.count("\n") <= MAX_MODULE_LINES
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno - node.lineno + 1 <= MAX_CLASS_LINES, node.name


def top_level_imports():
    """{top-level module or folder (or the package root): the top-level ones it imports}."""
    graph = grimp.build_graph("tf_spectrain")
    edges = {}
    for module in graph.modules:
        source = ".".join(module.split(".")[:2])
        for imported in graph.find_modules_directly_imported_by(module):
            target = ".".join(imported.split(".")[:2])
            if target != source:
                edges.setdefault(source, set()).add(target)
    return edges


def loops(edges):
    """The import loops of `edges`: each strongly connected set of two or more nodes."""
    found, seen = [], set()
    for start in sorted(edges):
        if start in seen:
            continue
        reach = _reachable(edges, start)
        loop = {n for n in reach if start in _reachable(edges, n)}
        if len(loop) > 1:
            found.append(sorted(loop))
            seen |= loop
    return found


def _reachable(edges, start):
    """Every node reachable from `start` by one or more edges."""
    stack, reached = [start], set()
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in reached:
                reached.add(nxt)
                stack.append(nxt)
    return reached


def test_loops_finds_a_loop_and_only_loops():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert loops(edges) == [["a", "b", "c"]]


def test_no_import_loops_between_top_level_modules_and_folders():
    edges = top_level_imports()
    assert "tf_spectrain.runtime" in edges["tf_spectrain.pipeline_model"]  # the graph was read
    assert loops(edges) == []
