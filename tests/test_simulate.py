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


@pytest.mark.parametrize("send, overlap, window, call, carried, expected", [
    # N = 2, T = 2, unit passes. Windows of one: window 0 holds s0 F0 F1 and s1 F0 B0,
    # window 1 s0 B0, s1 F1 B1, s0 B1. No sends: w0 s0 F0 0-1, F1 1-2; s1 F0 1-2, B0 2-3;
    # w1 from 3: s0 B0 3-4; s1 F1 3-4, B1 4-5; s0 B1 5-6.
    ([0.0], False, None, 0.0, None, 6.0),
    ([0.0], False, 1, 0.0, None, 6.0),
    # both of s0's backwards had their forward in window 0: each recomputes (+0.5)
    ([0.0], False, 1, 0.0, [0.5, 0.0], 6.5),
    ([0.0], False, None, 0.0, [0.5, 0.0], 6.0),  # one window: nothing is carried
    ([0.0], False, 1, 0.25, None, 6.5),  # two calls of 0.25 s
    ([0.0], False, 2, 0.25, None, 6.25),  # T = 2 in one window: one call
    # Sends of 0.5 beside compute. w0: s0 F0 0-1 (arrives 1.5), F1 1-2 (its consumer is
    # in w1: not sent yet); s1 F0 1.5-2.5, B0 2.5-3.5 (likewise). w1 from 3.5: s0's
    # gradient of 0 and s1's activation of 1 arrive at 4; s0 B0 4-5; s1 F1 4-5, B1 5-6
    # (arrives 6.5); s0 B1 6.5-7.5. One window: s1 B0 ends 3.5 (arrives 4), F1 3.5-4.5,
    # B1 4.5-5.5 (arrives 6); s0 B1 6-7.
    ([0.5], True, 1, 0.0, None, 7.5),
    ([0.5], True, None, 0.0, None, 7.0),
    # Without overlap the sender is busy while it sends, a carried value at the window's
    # start: w0: s0 F0 0-1, sends 1-1.5; F1 1.5-2.5 (not sent in w0); s1 F0 1.5-2.5, B0
    # 2.5-3.5. w1 from 3.5: s0 sends F1's activation and s1 B0's gradient, both 3.5-4;
    # s0 B0 4-5; s1 F1 4-5, B1 5-6, sends 6-6.5; s0 B1 6.5-7.5.
    ([0.5], False, 1, 0.0, None, 7.5),
])
def test_windows_by_hand(send, overlap, window, call, carried, expected):
    got = costmodel.simulate_epoch([1.0, 1.0], [1.0, 1.0], send, send, 2, overlap,
                                   window=window, call_seconds=call, carried_forward=carried)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("num_stages, num_batches, window", [(2, 24, 8), (3, 10, 4), (4, 7, 3)])
def test_one_window_per_epoch_is_the_plain_epoch_and_barriers_only_slow_it(
        num_stages, num_batches, window):
    rng = random.Random(num_stages)
    forward = [rng.uniform(0.1, 2) for _ in range(num_stages)]
    backward = [rng.uniform(0.1, 4) for _ in range(num_stages)]
    send = [rng.uniform(0, 1) for _ in range(num_stages - 1)]
    plain = costmodel.simulate_epoch(forward, backward, send, send, num_batches, True)
    whole = costmodel.simulate_epoch(forward, backward, send, send, num_batches, True,
                                     window=num_batches)
    assert whole == pytest.approx(plain)
    cut = costmodel.simulate_epoch(forward, backward, send, send, num_batches, True,
                                   window=window)
    called = costmodel.simulate_epoch(forward, backward, send, send, num_batches, True,
                                      window=window, call_seconds=0.1)
    windows = -(-num_batches // window)
    assert plain <= cut + 1e-9
    assert called >= cut + windows * 0.1 - 1e-9


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
