"""The NumPy reference's mode "2bw" (PipeDream-2BW, docs/SPECTRAIN.md section 6e).

The versions each forward reads follow `v = floor(max(0, i - s_k) / A)` (a table over
stages, group sizes and epoch lengths), no stage ever holds more than two versions, one
stage with groups of A equals sequential SGD on the groups' merged batches, and the mode's
result differs from stashing's and does not depend on the event loop's order.
"""

import numpy as np
import pytest
import spectrain_reference as ref
from test_spectrain_reference import LAYERS, _max_diff


def _run(accumulate, stage_sizes=(1, 1, 1, 1), num_batches=11, trace=None, **kwargs):
    params, batches = ref.make_problem(6, LAYERS, num_batches, 4)
    kwargs.setdefault("momentum", 0.9)
    return ref.train_reference(params, list(stage_sizes), batches, mode="2bw", lr=0.05,
                               accumulate=accumulate, trace=trace, **kwargs)


@pytest.mark.parametrize("stage_sizes, accumulate, num_batches", [
    ((1, 1, 1, 1), 4, 11), ((1, 1, 1, 1), 5, 12), ((1, 2, 1), 3, 7), ((2, 2), 2, 9),
    ((1, 1, 1, 1), 4, 3)])  # an epoch shorter than a group
def test_forward_versions_follow_the_formula(stage_sizes, accumulate, num_batches):
    trace = []
    _run(accumulate, stage_sizes, num_batches, trace, epochs=2)
    n = len(stage_sizes)
    forwards = [e for e in trace if e.kind == "F"]
    assert len(forwards) == 2 * n * num_batches
    for e in forwards:
        delay = n - 1 - e.stage
        assert e.updates == max(0, e.batch - delay) // accumulate, e


@pytest.mark.parametrize("accumulate", [4, 5, 9])
def test_a_stage_never_holds_more_than_two_versions(accumulate):
    trace = []
    _run(accumulate, num_batches=13, trace=trace)
    for k in range(4):
        live = {}  # mini-batch -> the version its forward read, until its backward
        for e in (e for e in trace if e.stage == k):
            if e.kind == "F":
                live[e.batch] = e.updates
            else:
                del live[e.batch]
            assert len(set(live.values())) <= 2


def test_one_stage_equals_sync_on_merged_batches():
    params, batches = ref.make_problem(7, LAYERS, 6, 4)
    got, _ = ref.train_reference(params, [4], batches, mode="2bw", lr=0.05, momentum=0.9,
                                 accumulate=2)
    merged = [(np.concatenate([batches[j][0], batches[j + 1][0]]),
               np.concatenate([batches[j][1], batches[j + 1][1]])) for j in range(0, 6, 2)]
    want, _ = ref.train_reference(params, [4], merged, mode="sync", lr=0.05, momentum=0.9)
    assert _max_diff(got, want) < 1e-13
    per_batch, _ = ref.train_reference(params, [4], batches, mode="sync", lr=0.05, momentum=0.9)
    assert _max_diff(got, per_batch) > 1e-3


def test_differs_from_stash_and_not_from_pick_order():
    params, batches = ref.make_problem(6, LAYERS, 9, 4)
    runs = [ref.train_reference(params, [1, 1, 1, 1], batches, mode="2bw", lr=0.05,
                                momentum=0.9, accumulate=4, pick=pick)[0] for pick in (min, max)]
    assert _max_diff(*runs) == 0
    stash, _ = ref.train_reference(params, [1, 1, 1, 1], batches, mode="stash", lr=0.05,
                                   momentum=0.9)
    assert _max_diff(runs[0], stash) > 1e-3


@pytest.mark.parametrize("overrides, message", [
    ({"mode": "2bw", "accumulate": 3}, r"accumulate` >= the number of stages \(4\)"),
    ({"mode": "2bw", "accumulate": True}, "accumulate"),
    ({"mode": "stash", "accumulate": 4}, "applies to mode '2bw' only"),
])
def test_bad_accumulate_is_named(overrides, message):
    params, batches = ref.make_problem(2, LAYERS, 2, 4)
    with pytest.raises(ValueError, match=message):
        ref.train_reference(params, [1, 1, 1, 1], batches, lr=0.05, momentum=0.9, **overrides)
