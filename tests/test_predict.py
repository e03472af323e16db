"""Tests for tf_spectrain.costmodel.predict, async_pipeline and sync_pipeline: the time
per mini-batch on one device, with data parallelism, and of a pipeline (steady state and
whole epochs), worked out by hand; bad arguments refused."""

import math

import pytest
from costmodel_helpers import CHAIN, L, hw

from tf_spectrain import costmodel
from tf_spectrain.costmodel import Hardware, ModelProfile

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


# --- the pipeline: whole epochs ------------------------------------------------------------


def test_epoch_includes_fill_and_drain():
    # Two equal stages, free links: (N - 1 + T) * (f + b) = (1 + 4) * 2 over 4 mini-batches.
    profile = ModelProfile([L("a", 1, 1), L("b", 1, 1)], batch_size=1)
    estimate = costmodel.predict_pipeline(profile, hw(), 1, ["a"], num_batches=4)
    assert estimate.epoch_seconds == pytest.approx(10.0)
    assert estimate.seconds_per_batch == pytest.approx(2.5)
    steady = costmodel.predict_pipeline(profile, hw(), 1, ["a"])
    assert steady.seconds_per_batch == pytest.approx(2.0)


def test_epoch_in_windows_of_one_recomputes_only_what_the_schedule_does():
    # Two unit stages, free links, T = 2: in windows of one (test_simulate's table) stage
    # 0's two backwards had their forwards in window 0, whose intermediates they take
    # (runtime.split_pass): 6 s as the plain epoch; paper SpecTrain's stage 0 recomputes
    # anyway (backward 2): 7 s either way; two calls of 0.5 s add 1.
    profile = ModelProfile([L("a", 1, 1), L("b", 1, 1)], batch_size=1)

    def epoch(**kwargs):
        return costmodel.predict_pipeline(profile, hw(), 1, ["a"], num_batches=2,
                                          **kwargs).epoch_seconds

    assert epoch() == pytest.approx(6.0)
    assert epoch(window=2) == pytest.approx(6.0)
    assert epoch(window=1) == pytest.approx(6.0)
    assert epoch(window=1, recompute=True) == pytest.approx(7.0)
    assert epoch(recompute=True) == pytest.approx(7.0)  # B0 and B1 of stage 0 take 2
    assert epoch(window=1, call_seconds=0.5) == pytest.approx(7.0)
    with pytest.raises(ValueError, match="`window` needs `num_batches`"):
        costmodel.predict_pipeline(profile, hw(), 1, ["a"], window=1)


def test_epoch_on_one_shared_compute_unit_is_all_compute():
    # Concurrency 1: no overlap of stages at all, so T * (all compute) = 3 * 13.
    estimate = costmodel.predict_pipeline(
        CHAIN, hw(num_gpus=2, bandwidth=math.inf, concurrency=1), 1, [1], num_batches=3
    )
    assert estimate.epoch_seconds == pytest.approx(39.0)


# --- micro-batches and recomputing on every stage -----------------------------------------


@pytest.mark.parametrize(
    "cuts, recompute, micro, latency, expected",
    [
        # l0-l1 | l2-l3 (F, B = 2, 3 | 3, 5), send 20 B / 10 B/s = 2 s.
        # True: stage 0's backward + 2: max(2 + 5 + 2, 3 + 5 + 2) = 10
        ([1], True, 1, 0.0, 10.0),
        # "always": the last stage's too: max(9, 3 + 8 + 2) = 13
        ([1], "always", 1, 0.0, 13.0),
        # M = 4 micro-batches, latency 0.25: the send is 4 * 0.25 + 2 = 3: max(8, 11) = 11
        ([1], False, 4, 0.25, 11.0),
        # ... once per mini-batch with M = 1: 2.25: max(7.25, 10.25)
        ([1], False, 1, 0.25, 10.25),
        # l0 | l1-l2 | l3, "always", M = 2, latency 0.5: sends 2 * 0.5 + 1 = 2 and
        # 2 * 0.5 + 0.5 = 1.5: max(1 + 3 + 2, 3 + 6 + 2 + 1.5, 1 + 4 + 1.5) = 12.5
        ([0, 2], "always", 2, 0.5, 12.5),
    ],
)
def test_pipeline_with_micro_batches_and_recompute(cuts, recompute, micro, latency, expected):
    machine = hw(num_gpus=3, latency=latency)
    estimate = costmodel.predict_pipeline(
        CHAIN, machine, 1, cuts, recompute=recompute, micro_batches=micro
    )
    assert estimate.seconds_per_batch == pytest.approx(expected)
    # A hybrid of one replica is the pipeline.
    hybrid = costmodel.predict_hybrid(
        CHAIN, machine, 1, cuts, 1, recompute=recompute, micro_batches=micro
    )
    assert hybrid.seconds_per_batch == pytest.approx(expected)


def test_pipeline_times_recompute_always_adds_every_forward():
    forward, backward, send = costmodel.pipeline_times(
        CHAIN, hw(num_gpus=3, latency=0.5), 1, [0, 2], recompute="always", micro_batches=2
    )
    assert forward == pytest.approx([1, 3, 1])
    assert backward == pytest.approx([2 + 1, 3 + 3, 3 + 1])  # the last stage's too
    assert send == pytest.approx([2.0, 1.5])


# --- the synchronous pipeline ---------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(
    "cuts, micro, latency, recompute, concurrency, expected",
    [
        # l0-l1 | l2-l3 (F, B = 2, 3 | 3, 5), send 2 s. M = 1 is sequential: F0, send, F1,
        # B1, send back, B0 = 2 + 2 + 3 + 5 + 2 + 3 = 17
        ([1], 1, 0.0, False, None, 17.0),
        # M = 2: per micro-batch, forwards with sends (2 + 2) / 2, 3 / 2 and backwards
        # 3 / 2, (5 + 2) / 2: (2 + 1.5 + 2) + (1.5 + 3.5 + 3.5) = 5.5 + 8.5 = 14
        ([1], 2, 0.0, False, None, 14.0),
        # latency 0.5 paid per micro-batch: the send is 2 * 0.5 + 2 = 3: forwards 2.5, 1.5,
        # backwards 1.5, 4: (2.5 + 1.5 + 2.5) + (1.5 + 4 + 4) = 16
        ([1], 2, 0.5, False, None, 16.0),
        # "always" recomputes on both stages: backwards 3 + 2, 5 + 3 (+ 2 sent): per
        # micro-batch 2.5, 5: (2 + 1.5 + 2) + (2.5 + 5 + 5) = 18
        ([1], 2, 0.0, "always", None, 18.0),
        # one compute unit for both stages: no faster than all compute, 13
        ([1], 4, 0.0, False, 1, 13.0),
        # one stage: the whole model, whatever M: 5 + 8
        ([], 4, 0.0, False, None, 13.0),
    ],
)
def test_sync_pipeline_by_hand(cuts, micro, latency, recompute, concurrency, expected, schedule):
    machine = hw(num_gpus=2, latency=latency, concurrency=concurrency)
    estimate = costmodel.predict_sync(
        CHAIN, machine, 1, cuts, micro_batches=micro, schedule=schedule, recompute=recompute
    )
    assert estimate.kind == "sync"
    assert estimate.seconds_per_batch == pytest.approx(expected)


def test_sync_pipeline_bubble_and_epoch():
    # N equal one-layer stages (F = 1, B = 2 each), free links: (M + N - 1) / M * 3 per
    # mini-batch, the bubble (N - 1) / (M + N - 1) idle; the same for 1F1B-flush.
    machine = hw(num_gpus=4, bandwidth=math.inf)
    for n, m in [(2, 4), (4, 8), (4, 1), (3, 2)]:
        profile = ModelProfile([L(f"x{p}", 1, 2) for p in range(n)], batch_size=1)
        for schedule in ("gpipe", "1f1b"):
            estimate = costmodel.predict_sync(profile, machine, 1, list(range(n - 1)), m,
                                              schedule)
            assert estimate.seconds_per_batch == pytest.approx((m + n - 1) / m * 3)
            busy = 3 / estimate.seconds_per_batch
            assert 1 - busy == pytest.approx((n - 1) / (m + n - 1))
    profile = ModelProfile([L(f"x{p}", 1, 2) for p in range(4)], batch_size=1)
    estimate = costmodel.predict_sync(profile, machine, 1, [0, 1, 2], 8, num_batches=5)
    assert estimate.epoch_seconds == pytest.approx(5 * 11 / 8 * 3)
    assert estimate.seconds_per_batch == pytest.approx(11 / 8 * 3)
    # recompute="always": B + F = 3 per stage: (M + N - 1) / M * 4
    always = costmodel.predict_sync(profile, machine, 1, [0, 1, 2], 8, recompute="always")
    assert always.seconds_per_batch == pytest.approx(11 / 8 * 4)


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
        (lambda: costmodel.predict_pipeline(CHAIN, hw(), 1, [0], recompute="auto"), TypeError,
         r"`recompute` must be True, False or 'always'\. Received: recompute='auto'"),
        (lambda: costmodel.predict_pipeline(CHAIN, hw(), 1, [0], micro_batches=0), ValueError,
         r"micro_batches=0"),
        (lambda: costmodel.predict_hybrid(CHAIN, hw(), 1, [0], 1, recompute=1), TypeError,
         r"recompute=1"),
        (lambda: costmodel.predict_sync(CHAIN, hw(), 1, [0], 2, schedule="pipedream"),
         ValueError, r"`schedule` must be one of \['gpipe', '1f1b'\]\. "
         r"Received: schedule='pipedream'"),
        (lambda: costmodel.predict_sync(CHAIN, hw(), 1, [0], micro_batches=1.5), TypeError,
         r"micro_batches=1.5"),
        (lambda: costmodel.predict_sync(CHAIN, hw(), 1, [0], num_batches=0), ValueError,
         r"num_batches=0"),
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
