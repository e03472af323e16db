"""modes: which weights each pass uses, as tables (SPECTRAIN.md section 4)."""

import pathlib

import pytest

from tf_spectrain.schedule import modes
from tf_spectrain.schedule.modes import PassPlan


@pytest.mark.parametrize(
    "mode, target, expected",
    [
        # N = 4, stages 0..3: (forward steps, backward steps or None = reuse the forward's)
        ("sync", "paper", [(0, None)] * 4),
        ("stash", "paper", [(0, None)] * 4),
        ("vanilla", "paper", [(0, 0)] * 4),
        ("spectrain", "paper", [(3, 0), (2, 0), (2, 1), (1, 1)]),
        ("spectrain", "consistent", [(3, None), (2, None), (1, None), (0, None)]),
    ],
)
def test_pass_plans_for_four_stages(mode, target, expected):
    plans = [modes.pass_plan(mode, k, 4, target) for k in range(4)]
    assert [(p.forward_steps, p.backward_steps) for p in plans] == expected


@pytest.mark.parametrize("num_stages", range(1, 9))
def test_paper_gaps_follow_the_formula(num_stages):
    for k in range(num_stages):
        plan = modes.pass_plan("spectrain", k, num_stages)
        assert plan.forward_steps == k // 2 + num_stages - 1 - k
        assert plan.backward_steps == k // 2


@pytest.mark.parametrize(
    "plan, between, expected",
    [
        (PassPlan(0, None), 3, True),  # stash: reuses by definition
        (PassPlan(2, None), 1, True),  # consistent SpecTrain
        (PassPlan(0, 0), 0, True),  # vanilla, no update in between
        (PassPlan(0, 0), 2, False),  # vanilla, stale: recompute
        (PassPlan(1, 1), 0, True),  # last stage of SpecTrain
        (PassPlan(3, 0), 0, False),  # different predictions: recompute
        (PassPlan(2, 1), 1, False),
    ],
)
def test_same_weights(plan, between, expected):
    assert plan.same_weights(between) is expected
    assert plan.reuses_forward is (plan.backward_steps is None)


@pytest.mark.parametrize(
    "mode, target, message",
    [
        ("spectran", "paper",
         r"`mode` must be one of .*Received: mode='spectran'; did you mean 'spectrain'"),
        ("pipedream", "paper",
         r"`mode` must be one of \['sync', 'vanilla', 'stash', 'spectrain', 'nesterov', '2bw'\]"),
        ("spectrain", "consistant",
         r"`spectrain_target` must be one of .*did you mean 'consistent'"),
    ],
)
def test_bad_mode_or_target(mode, target, message):
    with pytest.raises(ValueError, match=message):
        modes.check_mode(mode, target)
    with pytest.raises(ValueError, match=message):
        modes.pass_plan(mode, 0, 2, target)


def test_one_list_of_modes():
    assert modes.MODES == modes.PIPELINE_MODES == ("sync", "vanilla", "stash", "spectrain",
                                                    "nesterov", "2bw")
    assert modes.ALL_MODES == modes.PIPELINE_MODES + modes.BASELINES
    assert modes.BASELINES == ("single", "dp")


def test_the_readme_lists_every_mode():
    readme = pathlib.Path(__file__).resolve().parent.parent / "README.md"
    row = next(line for line in readme.read_text().splitlines() if line.startswith("| `--mode`"))
    assert all(f"`{mode}`" in row for mode in modes.ALL_MODES), row
