"""Tests for the pure cut planner: hand-made tables, brute force, errors."""

import ast
import itertools
import math
import pathlib
import random

import pytest

from tf_spectrain.partition import planner
from tf_spectrain.partition.planner import plan_cuts


def _stage_costs(costs, cuts):
    bounds = [-1] + list(cuts) + [len(costs) - 1]
    return [sum(costs[a + 1 : b + 1]) for a, b in zip(bounds, bounds[1:])]


def _brute_force(costs, num_stages, allowed):
    """Best cuts by enumeration: least max, then least sum of squares, then latest cuts."""
    usable = sorted(p for p in set(allowed) if p != len(costs) - 1)
    best_key, best_cuts = None, None
    for cuts in itertools.combinations(usable, num_stages - 1):
        stage = _stage_costs(costs, cuts)
        key = (max(stage), sum(c * c for c in stage), [-p for p in cuts])
        if best_key is None or key < best_key:
            best_key, best_cuts = key, list(cuts)
    return best_cuts


# Each expected answer is worked out by hand in the comment.
@pytest.mark.parametrize(
    "costs, num_stages, allowed, expected",
    [
        # 2 | 2
        ([1, 1, 1, 1], 2, None, [1]),
        # the heavy last layer alone; everything else before it: 4 | 10
        ([1, 1, 1, 1, 10], 2, None, [3]),
        # 5 | 1+1+1+1+1 | 5: the heavy ends must be alone
        ([5, 1, 1, 1, 1, 1, 5], 3, None, [0, 5]),
        # max 5 allows 5|1|4 (sum sq 42), 5|2|3 and 5|3|2 (38): the tie goes to later cuts
        ([5, 1, 1, 1, 1, 1], 3, None, [0, 3]),
        # only positions 0 and 2 allowed: 3|9 and 9|3 tie, later cut wins
        ([3, 3, 3, 3], 2, [0, 2], [2]),
        # weightless layers in the middle join the stage before the cut: 4+0+0 | 4
        ([4, 0, 0, 4], 2, None, [2]),
        # every stage needs a layer: 1 | 2 | 3
        ([1, 2, 3], 3, None, [0, 1]),
        # one allowed position, used even though unbalanced: 10 | 4
        ([10, 1, 1, 1, 1], 2, {0}, [0]),
        # 2+2 | 2+2 | 2+2
        ([2, 2, 2, 2, 2, 2], 3, None, [1, 3]),
        # the only two allowed positions: 1 | 4 | 1
        ([1, 1, 1, 1, 1, 1], 3, [0, 4], [0, 4]),
        # listing the last position changes nothing
        ([1, 1, 1, 1], 2, [1, 3], [1]),
        # 1+9 | 8 beats 1 | 17 and 11 | 7
        ([1, 9, 1, 1, 1, 1, 1, 1, 1, 1], 2, None, [1]),
        # floats: 0.5+0.5 | 1.0
        ([0.5, 0.5, 1.0], 2, None, [1]),
        # one stage: no cut
        ([7, 3], 1, None, []),
        # one stage per layer
        ([3, 1, 2, 5], 4, None, [0, 1, 2]),
    ],
)
def test_plan_cuts_table(costs, num_stages, allowed, expected):
    assert plan_cuts(costs, num_stages, allowed) == expected


def test_plan_cuts_matches_brute_force_on_random_cases():
    rng = random.Random(1234)
    for _ in range(300):
        n = rng.randint(1, 9)
        costs = [rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 40]) for _ in range(n)]
        num_stages = rng.randint(1, min(n, 4))
        allowed = [p for p in range(n) if rng.random() < 0.7]
        if len([p for p in allowed if p != n - 1]) < num_stages - 1:
            continue
        cuts = plan_cuts(costs, num_stages, allowed)
        expected = _brute_force(costs, num_stages, allowed)
        # The max stage cost is the primary objective; the full rule fixes the cuts.
        assert max(_stage_costs(costs, cuts)) == max(_stage_costs(costs, expected))
        assert cuts == expected, (costs, num_stages, allowed)
        assert all(p in allowed for p in cuts)
        assert all(c > 0 for c in [b - a for a, b in zip([-1] + cuts, cuts + [n - 1])])


@pytest.mark.parametrize(
    "costs, num_stages, allowed, error, match",
    [
        ("abc", 2, None, TypeError, "`costs` must be a sequence"),
        (5, 2, None, TypeError, "`costs` must be a sequence"),
        ([], 1, None, ValueError, "at least one layer"),
        ([1, "2"], 1, None, TypeError, r"costs\[1\]='2'"),
        ([1, True], 1, None, TypeError, r"costs\[1\]=True"),
        ([1, -2], 1, None, ValueError, r"non-negative.*costs\[1\]=-2"),
        ([1, math.nan], 1, None, ValueError, r"costs\[1\]=nan"),
        ([1, 2], 0, None, ValueError, "between 1 and the number of layers .2.*num_stages=0"),
        ([1, 2], 3, None, ValueError, "num_stages=3"),
        ([1, 2], 1.5, None, TypeError, "num_stages=1.5"),
        ([1, 2, 3], 2, [5], ValueError, r"\[0, 2\].*Received: 5 in allowed"),
        ([1, 2, 3], 2, ["0"], TypeError, "int positions"),
        ([1, 2, 3], 2, "01", TypeError, "iterable of int positions"),
        ([1, 2, 3, 4], 3, [0, 3], ValueError, r"needs 2 cut positions but only 1 .*\[0\]"),
    ],
)
def test_plan_cuts_rejects_bad_input(costs, num_stages, allowed, error, match):
    with pytest.raises(error, match=match):
        plan_cuts(costs, num_stages, allowed)


def test_planner_is_pure_python():
    tree = ast.parse(pathlib.Path(planner.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"math", "numbers"}, imported
