"""Tests for tf_spectrain.costmodel.simulate: the timed schedule of an epoch by hand,
against the lock-step clock table, and long epochs against the steady cycle."""

import itertools
import random

import pytest

from tf_spectrain import costmodel, schedule

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
