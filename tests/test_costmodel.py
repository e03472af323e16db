"""Tests for the cost model: hand-computed tables, a brute-force planner, a lock-step cross
check of the timed schedule, bad input, and the TensorFlow profiler on tiny models."""

import ast
import itertools
import math
import pathlib
import random

import pytest

from tf_spectrain import costmodel, schedule
from tf_spectrain.costmodel import Hardware, LayerProfile, ModelProfile

L = LayerProfile


def hw(num_gpus=2, speed=1.0, bandwidth=10.0, latency=0.0, concurrency=None):
    return Hardware(num_gpus, speed, bandwidth, latency, concurrency)


# Four layers at profiled batch 1: (forward, backward, output bytes per example, weight bytes).
CHAIN = ModelProfile(
    [L("l0", 1, 2, 10, 100), L("l1", 1, 1, 20, 0), L("l2", 2, 2, 5, 40), L("l3", 1, 3, 0, 60)],
    batch_size=1,
    name="chain",
)


# --- Hardware -----------------------------------------------------------------------------


def test_presets_follow_the_issue():
    assert costmodel.PCIE3_X16.bandwidth == pytest.approx(12e9, rel=0.1)
    assert costmodel.NVLINK.bandwidth == pytest.approx(150e9, rel=0.1)
    assert costmodel.PCIE3_X16.num_gpus == costmodel.NVLINK.num_gpus == 4


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_gpus=0), ValueError, r"num_gpus=0"),
        (dict(num_gpus=True), TypeError, r"num_gpus=True"),
        (dict(num_gpus=2.0), TypeError, r"`num_gpus` must be an int"),
        (dict(relative_speed=0), ValueError, r"number > 0 .*relative_speed=0$"),
        (dict(relative_speed=float("nan")), ValueError, r"relative_speed=nan"),
        (dict(relative_speed="fast"), TypeError, r"relative_speed='fast'"),
        (dict(bandwidth=0), ValueError, r"PCIe 3.0 x16 is about 12e9"),
        (dict(bandwidth=-1e9), ValueError, r"bandwidth=-1000000000.0"),
        (dict(latency=-1e-6), ValueError, r"latency=-1e-06"),
        (dict(latency=math.inf), ValueError, r"finite"),
        (dict(concurrency=0), ValueError, r"concurrency=0"),
        (dict(concurrency=5), ValueError, r"cannot exceed `num_gpus`.*num_gpus=4"),
        (dict(name=3), TypeError, r"name=3"),
    ],
)
def test_hardware_rejects_bad_arguments(kwargs, error, match):
    args = dict(num_gpus=4, relative_speed=1.0, bandwidth=1e9, latency=0.0)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        Hardware(**args)


@pytest.mark.parametrize(
    "bandwidth, latency, num_bytes, expected",
    [
        (10.0, 0.5, 0, 0.0),  # nothing to send: no latency either
        (10.0, 0.5, 10, 1.5),
        (10.0, 0.0, 25, 2.5),
        (math.inf, 0.25, 1e9, 0.25),  # a free link still has latency
    ],
)
def test_transfer_time(bandwidth, latency, num_bytes, expected):
    machine = hw(bandwidth=bandwidth, latency=latency)
    assert machine.transfer_time(num_bytes) == pytest.approx(expected)


@pytest.mark.parametrize(
    "n, bandwidth, latency, num_bytes, expected",
    [
        (1, 10.0, 1.0, 100, 0.0),  # one device: nothing to reduce
        (2, 10.0, 1.0, 100, 12.0),  # 2*1/2 * 100/10 + 2*1 * 1
        (4, 10.0, 0.0, 100, 15.0),  # 2*3/4 * 100/10
        (4, 60.0, 0.1, 120, 3.6),  # 2*3/4 * 2 + 6 * 0.1
        (3, 10.0, 1.0, 0, 0.0),  # no weights
    ],
)
def test_ring_allreduce_time(n, bandwidth, latency, num_bytes, expected):
    machine = Hardware(n, 1.0, bandwidth, latency)
    assert machine.allreduce_time(num_bytes) == pytest.approx(expected)


def test_replace_keeps_default_concurrency_in_step_with_num_gpus():
    eight = costmodel.NVLINK.replace(num_gpus=8)
    assert (eight.num_gpus, eight.concurrency) == (8, 8.0)
    assert eight.bandwidth == costmodel.NVLINK.bandwidth
    shared = hw(num_gpus=4, concurrency=1.5).replace(num_gpus=2)
    assert shared.concurrency == 1.5
    with pytest.raises(TypeError, match=r"Unknown Hardware field.*'speed'"):
        costmodel.PCIE3_X16.replace(speed=2.0)


# --- profiles and stage sums --------------------------------------------------------------


@pytest.mark.parametrize(
    "cuts, expected",
    [
        # (first, last, forward, backward, weight bytes, input bytes, output bytes) per stage
        ([], [(0, 3, 5, 8, 200, 0, 0)]),
        (["l0"], [(0, 0, 1, 2, 100, 0, 10), (1, 3, 4, 6, 100, 10, 0)]),
        ([1], [(0, 1, 2, 3, 100, 0, 20), (2, 3, 3, 5, 100, 20, 0)]),
        ([0, 2], [(0, 0, 1, 2, 100, 0, 10), (1, 2, 3, 3, 40, 10, 5), (3, 3, 1, 3, 60, 5, 0)]),
        (
            ("l0", "l1", "l2"),
            [(0, 0, 1, 2, 100, 0, 10), (1, 1, 1, 1, 0, 10, 20), (2, 2, 2, 2, 40, 20, 5),
             (3, 3, 1, 3, 60, 5, 0)],
        ),
    ],
)
def test_stage_costs(cuts, expected):
    stages = CHAIN.stage_costs(cuts)
    got = [
        (s.first, s.last, s.forward_time, s.backward_time, s.weight_bytes, s.input_bytes,
         s.output_bytes)
        for s in stages
    ]
    assert got == expected
    assert [s.index for s in stages] == list(range(len(expected)))


@pytest.mark.parametrize(
    "cuts, error, match",
    [
        ("l1", TypeError, r"not a single string.*did you mean cuts=\['l1'\]"),
        (["l9"], ValueError, r"profile 'chain'.*'l9' is not one. Layers: \['l0', 'l1'"),
        ([3], ValueError, r"must be in \[0, 2\].*cuts=\[3\]"),
        ([-1], ValueError, r"must be in \[0, 2\]"),
        (["l3"], ValueError, r"last stage.*'l3' is the last layer"),
        ([1, 1], ValueError, r"in model order without repeats"),
        (["l2", "l0"], ValueError, r"positions \[2, 0\]"),
        ([0, "l1"], TypeError, r"all layer names \(str\) or all int"),
        ([True], TypeError, r"all layer names"),
        (None, TypeError, r"cuts=None"),
    ],
)
def test_bad_cuts(cuts, error, match):
    with pytest.raises(error, match=match):
        CHAIN.stage_costs(cuts)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: L("a", -1, 0), ValueError, r"forward_time=-1"),
        (lambda: L("a", 0, float("inf")), ValueError, r"backward_time=inf"),
        (lambda: L("a", 0, 0, output_bytes="big"), TypeError, r"output_bytes='big'"),
        (lambda: L("", 0, 0), TypeError, r"non-empty string"),
        (lambda: ModelProfile([], 1), ValueError, r"at least one LayerProfile"),
        (lambda: ModelProfile([L("a", 0, 0), L("a", 1, 1)], 1), ValueError, r"Repeated: \['a'\]"),
        (lambda: ModelProfile([("a", 0, 0)], 1), TypeError, r"layers\[0\]"),
        (lambda: ModelProfile([L("a", 0, 0)], 0), ValueError, r"batch_size=0"),
        (lambda: ModelProfile(L("a", 0, 0), 1), TypeError, r"list of LayerProfile"),
        (lambda: ModelProfile.from_dict({"layers": []}), TypeError, r"'layers' and 'batch_size'"),
    ],
)
def test_bad_profiles(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_misspelt_cut_gets_a_hint():
    profile = ModelProfile([L("block1_pool", 1, 1), L("fc", 1, 1)], batch_size=1, name="vgg")
    with pytest.raises(ValueError, match=r"cuts=\['bloc1_pool'\]; did you mean 'block1_pool'\?"):
        profile.cut_positions(["bloc1_pool"])


def test_profile_round_trips_through_a_dict():
    again = ModelProfile.from_dict(CHAIN.to_dict())
    assert again.layers == CHAIN.layers
    assert (again.batch_size, again.name) == (CHAIN.batch_size, CHAIN.name)


# --- one device and data parallelism ------------------------------------------------------


def test_single_device_scales_with_batch_and_speed():
    # (5 + 8) seconds at batch 1, batch 4, 2x faster device: 13 * 4 / 2 = 26 s.
    estimate = costmodel.predict_single(CHAIN, hw(speed=2.0), 4)
    assert estimate.seconds_per_batch == pytest.approx(26.0)
    assert estimate.images_per_second == pytest.approx(4 / 26.0)
    assert estimate.communication_seconds == 0.0


# Profile at batch 4: forward 2 s, backward 4 s in all, 120 bytes of weights.
DP_PROFILE = ModelProfile([L("a", 1.5, 1.0, 8, 20), L("b", 0.5, 3.0, 4, 100)], batch_size=4)


@pytest.mark.parametrize(
    "n, bandwidth, latency, overlap, concurrency, expected",
    [
        (1, 60.0, 1.0, False, None, 6.0),  # one device: 2 + 4, no all-reduce
        (2, 60.0, 0.0, False, None, 5.0),  # batch 2 each: 1 + 2, all-reduce 2*1/2*120/60 = 2
        (2, 60.0, 0.0, True, None, 3.0),  # 1 + max(2, 2)
        (4, 60.0, 0.1, False, None, 5.1),  # 0.5 + 1 + (3 + 0.6)
        (4, 60.0, 0.1, True, None, 4.1),  # 0.5 + max(1, 3.6)
        (4, math.inf, 0.0, False, 1, 6.0),  # 4 replicas on one compute unit: (0.5 + 1) * 4
        (4, math.inf, 0.0, False, 2, 3.0),  # two at a time: (0.5 + 1) * 2
    ],
)
def test_data_parallel(n, bandwidth, latency, overlap, concurrency, expected):
    machine = Hardware(n, 1.0, bandwidth, latency, concurrency)
    estimate = costmodel.predict_data_parallel(DP_PROFILE, machine, 4, overlap=overlap)
    assert estimate.seconds_per_batch == pytest.approx(expected)
    assert estimate.images_per_second == pytest.approx(4 / expected)


def test_data_parallel_on_one_device_is_single():
    machine = Hardware(1, 3.0, 1e3, 0.01)
    assert costmodel.predict_data_parallel(CHAIN, machine, 8).seconds_per_batch == pytest.approx(
        costmodel.predict_single(CHAIN, machine, 8).seconds_per_batch
    )


# --- the pipeline: steady state -----------------------------------------------------------


@pytest.mark.parametrize(
    "cuts, overlap, recompute, concurrency, expected",
    [
        # one stage: the whole model, 5 + 8
        ([], False, False, None, 13.0),
        # l0-l1 | l2-l3, send 20 B / 10 B/s = 2 s: max(2 + 3 + 2, 3 + 5 + 2)
        ([1], False, False, None, 10.0),
        # overlap: max(5, 8, link 2, both stages with both transfers (5 + 8 + 2 + 2) / 2)
        ([1], True, False, None, 8.5),
        # l0 | l1-l2 | l3, sends 1 s and 0.5 s: max(3 + 1, 6 + 1 + 0.5, 4 + 0.5)
        ([0, 2], False, False, None, 7.5),
        # recompute: stage 0 backward 3 + 2: max(2 + 5 + 2, 10)
        ([1], False, True, None, 10.0),
        # recompute: max(1 + 3 + 1, 3 + 6 + 1.5, 4.5)
        ([0, 2], False, True, None, 10.5),
        # two stages sharing one compute unit: no faster than all compute, 13
        ([1], False, False, 1, 13.0),
        # ... or two compute units for 3 stages: 13 / 2 = 6.5 < 7.5
        ([0, 2], False, False, 2, 7.5),
    ],
)
def test_pipeline_steady_state(cuts, overlap, recompute, concurrency, expected):
    machine = hw(num_gpus=3, concurrency=concurrency)
    estimate = costmodel.predict_pipeline(
        CHAIN, machine, 1, cuts, overlap=overlap, recompute=recompute
    )
    assert estimate.seconds_per_batch == pytest.approx(expected)
    assert estimate.epoch_seconds is None


def test_pipeline_bounding_stage_split():
    # l0 | l1-l2 | l3: stage 1 bounds, compute 6, sends 1 + 0.5.
    estimate = costmodel.predict_pipeline(CHAIN, hw(num_gpus=3), 1, [0, 2])
    assert (estimate.compute_seconds, estimate.communication_seconds) == pytest.approx((6.0, 1.5))


def test_pipeline_scales_with_batch():
    # No latency: doubling the batch doubles compute and bytes alike.
    one = costmodel.predict_pipeline(CHAIN, hw(), 1, [1])
    two = costmodel.predict_pipeline(CHAIN, hw(), 2, [1])
    assert two.seconds_per_batch == pytest.approx(2 * one.seconds_per_batch)
    assert two.images_per_second == pytest.approx(one.images_per_second)


def test_one_stage_pipeline_is_single_device():
    machine = hw(num_gpus=1, speed=4.0, latency=1.0)
    assert costmodel.predict_pipeline(CHAIN, machine, 3, [], num_batches=5).seconds_per_batch == (
        pytest.approx(costmodel.predict_single(CHAIN, machine, 3).seconds_per_batch)
    )


# --- the pipeline: timed schedule ---------------------------------------------------------


@pytest.mark.parametrize(
    "forward, backward, send, num_batches, overlap, expected",
    [
        ([1], [2], [], 5, False, 15.0),  # one stage: T * (f + b)
        ([1, 1], [1, 1], [0], 1, False, 4.0),  # F0 F0 B0 B0
        ([1, 1], [1, 1], [0], 2, False, 6.0),  # (N - 1) * 2 + T * 2
        ([1, 1, 1], [1, 1, 1], [0, 0], 5, False, 14.0),
        # worked out by hand in test_timed_schedule_by_hand's comments
        ([1, 2], [3, 4], [0.5], 1, False, 11.0),
        ([1, 2], [3, 4], [0.5], 2, False, 17.5),
        ([1, 2], [3, 4], [0.5], 2, True, 17.0),
    ],
)
def test_timed_schedule_by_hand(forward, backward, send, num_batches, overlap, expected):
    # T = 2, no overlap (stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1; sends add 0.5 to the
    # sender's pass): s0 F0 0-1.5, F1 1.5-3; s1 F0 1.5-3.5, B0 3.5-8, F1 8-10, B1 10-14.5;
    # s0 B0 8-11, B1 14.5-17.5. With overlap the sends leave the stages free: s0 F1 ends
    # at 2 (arrives 2.5); s1 B0 ends 7.5 (arrives 8), F1 7.5-9.5, B1 9.5-13.5 (arrives 14);
    # s0 B1 14-17.
    got = costmodel.simulate_epoch(forward, backward, send, send, num_batches, overlap)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("num_stages, num_batches", itertools.product(range(1, 5), range(1, 7)))
def test_unit_passes_take_as_long_as_the_lock_step_table(num_stages, num_batches):
    ops = [schedule.async_ops(k, num_stages, num_batches) for k in range(num_stages)]
    slots = len(schedule.clock_table(ops)[0])
    ones, zeros = [1.0] * num_stages, [0.0] * (num_stages - 1)
    assert costmodel.simulate_epoch(ones, ones, zeros, zeros, num_batches) == slots


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("overlap", [False, True])
def test_long_epochs_approach_the_steady_cycle(seed, overlap):
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    forward = [rng.uniform(0.1, 2) for _ in range(n)]
    backward = [rng.uniform(0.1, 4) for _ in range(n)]
    # Some links much slower than the stages, so that overlap cannot hide them.
    send_f = [rng.choice([0.0, rng.uniform(0, 1), rng.uniform(2, 8)]) for _ in range(n - 1)]
    send_b = [rng.choice([0.0, rng.uniform(0, 1), rng.uniform(2, 8)]) for _ in range(n - 1)]
    short = costmodel.simulate_epoch(forward, backward, send_f, send_b, 200, overlap)
    long = costmodel.simulate_epoch(forward, backward, send_f, send_b, 600, overlap)
    cycle = costmodel.steady_cycle(forward, backward, send_f, send_b, overlap)
    assert (long - short) / 400 == pytest.approx(cycle, rel=0.01)


def test_epoch_includes_fill_and_drain():
    # Two equal stages, free links: (N - 1 + T) * (f + b) = (1 + 4) * 2 over 4 mini-batches.
    profile = ModelProfile([L("a", 1, 1), L("b", 1, 1)], batch_size=1)
    estimate = costmodel.predict_pipeline(profile, hw(), 1, ["a"], num_batches=4)
    assert estimate.epoch_seconds == pytest.approx(10.0)
    assert estimate.seconds_per_batch == pytest.approx(2.5)
    steady = costmodel.predict_pipeline(profile, hw(), 1, ["a"])
    assert steady.seconds_per_batch == pytest.approx(2.0)


def test_epoch_on_one_shared_compute_unit_is_all_compute():
    # Concurrency 1: no overlap of stages at all, so T * (all compute) = 3 * 13.
    estimate = costmodel.predict_pipeline(
        CHAIN, hw(num_gpus=2, bandwidth=math.inf, concurrency=1), 1, [1], num_batches=3
    )
    assert estimate.epoch_seconds == pytest.approx(39.0)


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


# --- bad input to the predictions ---------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: costmodel.predict_single({"layers": []}, hw(), 1), TypeError,
         r"`profile` must be a ModelProfile"),
        (lambda: costmodel.predict_single(CHAIN, "pcie", 1), TypeError,
         r"`hardware` must be a Hardware"),
        (lambda: costmodel.predict_single(CHAIN, hw(), 0), ValueError, r"batch_size=0"),
        (lambda: costmodel.predict_single(CHAIN, hw(), 2.5), TypeError, r"batch_size=2.5"),
        (lambda: costmodel.predict_data_parallel(CHAIN, hw(), 4, overlap=1), TypeError,
         r"overlap=1"),
        (lambda: costmodel.predict_pipeline(CHAIN, hw(num_gpus=2), 1, [0, 1]), ValueError,
         r"3 stages .* but hardware.num_gpus=2.*at most 1 cuts"),
        (lambda: costmodel.predict_pipeline(CHAIN, hw(), 1, [0], num_batches=0), ValueError,
         r"num_batches=0"),
        (lambda: costmodel.predict_pipeline(CHAIN, hw(), 1, [0], recompute="yes"), TypeError,
         r"recompute='yes'"),
        (lambda: costmodel.simulate_epoch([1, 1], [1], [0], [0], 2), ValueError,
         r"`backward` must be a list of 2"),
        (lambda: costmodel.simulate_epoch([1, -1], [1, 1], [0], [0], 2), ValueError,
         r"forward\[1\]=-1"),
        (lambda: costmodel.steady_cycle([], [], [], []), ValueError, r"non-empty list"),
    ],
)
def test_bad_prediction_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- the pure parts stay pure -------------------------------------------------------------

PURE = ["../checks", "hardware", "profile", "simulate", "predict", "planning", "__init__"]


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


# --- measuring with TensorFlow (tiny models) ----------------------------------------------


def test_profile_model_sizes_match_the_layers():
    import keras

    inputs = keras.Input((6,), name="x")
    h = keras.layers.Dense(5, name="d1")(inputs)
    r = keras.layers.Activation("relu", name="act")(h)
    y = keras.layers.Add(name="add")([h, r])  # h skips over `act`
    out = keras.layers.Dense(3, name="d2")(y)
    model = keras.Model(inputs, out)
    profile = costmodel.profile_model(model, batch_size=4, repeats=1, warmup=1)
    assert profile.names == ["d1", "act", "add", "d2"]
    assert profile.batch_size == 4
    # float32 bytes per example crossing a cut after each layer; after `act` both h and r.
    assert [layer.output_bytes for layer in profile.layers] == [20, 40, 20, 12]
    assert [layer.weight_bytes for layer in profile.layers] == [
        4 * model.get_layer(n).count_params() for n in profile.names
    ]
    assert all(layer.forward_time > 0 and layer.backward_time >= 0 for layer in profile.layers)


def test_profile_model_rejects_bad_arguments():
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(TypeError, match=r"batch_size=1.5"):
        costmodel.profile_model(model, 1.5)
    with pytest.raises(ValueError, match=r"repeats=0"):
        costmodel.profile_model(model, 2, repeats=0)


def test_link_and_concurrency_measurements_are_in_range():
    bandwidth, latency = costmodel.measure_link("/CPU:0", "/CPU:1", large_bytes=2**20, repeats=3)
    assert bandwidth > 0 and 0 <= latency < 1
    calls = []

    def workload(device):
        calls.append(device)
        return lambda: sum(range(1000))

    concurrency = costmodel.measure_concurrency(["/CPU:0", "/CPU:1"], workload, repeats=2)
    assert 0 < concurrency <= 2
    assert calls == ["/CPU:0", "/CPU:1"]
    Hardware(2, 1.0, bandwidth, latency, concurrency)  # fits the hardware description
    with pytest.raises(ValueError, match=r"at least 2 device names"):
        costmodel.measure_concurrency(["/CPU:0"])
    with pytest.raises(TypeError, match=r"workload=3"):
        costmodel.measure_concurrency(["/CPU:0", "/CPU:1"], workload=3)
