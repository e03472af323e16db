"""Tests for tf_spectrain.costmodel.planning: `best_cuts` by hand and against a brute-force
search."""

import itertools
import random

import pytest
from costmodel_helpers import CHAIN, L, hw

from tf_spectrain import costmodel
from tf_spectrain.costmodel import ModelProfile

# --- choosing cuts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layers, num_stages, recompute, expected",
    [
        # compute alone would cut after b (4 | 4), but b's output costs 10 s to send:
        # after a: 2.1 | 6.1, after c: 6.1 | 2.1; equal totals, the earliest wins
        ([("a", 2, 0, 1), ("b", 2, 0, 100), ("c", 2, 0, 1), ("d", 2, 0, 0)], 2, False, ["a"]),
        # cheap hand-off after the pooling layer p: 2.1 | 2.1 beats 12 | 12
        ([("a", 1, 1, 100), ("p", 0, 0, 1), ("b", 2, 0, 0)], 2, False, ["p"]),
        # free links: 2 | 2 (cut after b) beats 1 | 3
        ([("a", 1, 0, 0), ("b", 1, 0, 0), ("c", 0, 2, 0)], 2, False, ["b"]),
        # recomputing the forward on stage 0: 2 | 3 (after a) beats 4 | 2
        ([("a", 1, 0, 0), ("b", 1, 0, 0), ("c", 0, 2, 0)], 2, True, ["a"]),
        # three stages of 1 | 1 | 1
        ([("a", 1, 0, 0), ("b", 1, 0, 0), ("c", 1, 0, 0)], 3, False, ["a", "b"]),
    ],
)
def test_best_cuts_by_hand(layers, num_stages, recompute, expected):
    profile = ModelProfile([L(n, f, b, out) for n, f, b, out in layers], batch_size=1)
    machine = hw(num_gpus=3, bandwidth=10.0)
    cuts = costmodel.best_cuts(profile, machine, 1, num_stages, recompute=recompute)
    assert cuts == expected


def _stage_times(profile, cuts, bandwidth, recompute):
    """Each stage's compute plus its sends, computed directly from the layers."""
    bounds = [-1] + list(cuts) + [len(profile) - 1]
    times = []
    for k in range(len(bounds) - 1):
        part = profile.layers[bounds[k] + 1 : bounds[k + 1] + 1]
        forward = sum(layer.forward_time for layer in part)
        time = forward + sum(layer.backward_time for layer in part)
        if k < len(bounds) - 2:
            time += forward * recompute + profile.layers[bounds[k + 1]].output_bytes / bandwidth
        if k > 0:
            time += profile.layers[bounds[k]].output_bytes / bandwidth
        times.append(time)
    return times


@pytest.mark.parametrize("seed", range(8))
def test_best_cuts_match_brute_force(seed):
    rng = random.Random(seed)
    size = rng.randint(3, 8)
    layers = [
        L(f"x{p}", rng.choice([0, rng.uniform(0, 3)]), rng.uniform(0, 3), rng.uniform(0, 30))
        for p in range(size)
    ]
    profile = ModelProfile(layers, batch_size=1)
    num_stages = rng.randint(1, min(4, size))
    recompute = rng.random() < 0.5
    best_key = None
    for cuts in itertools.combinations(range(size - 1), num_stages - 1):
        times = _stage_times(profile, cuts, 10.0, recompute)
        key = (max(times), sum(times))
        if best_key is None or key[0] < best_key[0] - 1e-9 or (
            abs(key[0] - best_key[0]) <= 1e-9 and key[1] < best_key[1] - 1e-9
        ):
            best_key = key
    machine = hw(num_gpus=4, bandwidth=10.0)
    got = costmodel.best_cuts(profile, machine, 1, num_stages, recompute=recompute)
    got_times = _stage_times(profile, profile.cut_positions(got), 10.0, recompute)
    assert max(got_times) == pytest.approx(best_key[0])
    assert sum(got_times) == pytest.approx(best_key[1])
    # ... and the cost model agrees on the slowest stage (no overlap, free latency).
    steady = costmodel.predict_pipeline(profile, machine, 1, got, recompute=recompute)
    assert steady.seconds_per_batch == pytest.approx(best_key[0])


def test_best_cuts_defaults_and_limits():
    machine = hw(num_gpus=3)
    assert len(costmodel.best_cuts(CHAIN, machine, 1)) == 2  # min(4 layers, 3 devices) stages
    # after l1: max(2 + 3 + 2, 3 + 5 + 2) = 10; after l2: max(4 + 5 + 0.5, 1 + 3 + 0.5) = 9.5
    assert costmodel.best_cuts(CHAIN, machine, 1, allowed=["l1", 2], num_stages=2) == ["l2"]
    with pytest.raises(ValueError, match=r"`num_stages` must be at most 3"):
        costmodel.best_cuts(CHAIN, machine, 1, num_stages=4)
    with pytest.raises(ValueError, match=r"needs 2 cut positions but only 1"):
        costmodel.best_cuts(CHAIN, machine, 1, num_stages=3, allowed=["l1"])
    with pytest.raises(ValueError, match=r"'l3' is the last layer"):
        costmodel.best_cuts(CHAIN, machine, 1, allowed=["l3"])
    with pytest.raises(TypeError, match=r"allowed='l1'"):
        costmodel.best_cuts(CHAIN, machine, 1, allowed="l1")
