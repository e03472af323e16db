"""Tests for `tf_spectrain.schedule.instructions`: `Op`, instruction lists, weight versions.

Expected values are written out by hand (from SPECTRAIN.md) or computed by small, differently
written re-implementations below; none is taken from the module under test.
"""

import dataclasses
import re

import pytest

from tf_spectrain import schedule
from tf_spectrain.schedule import Op

_LETTER_KINDS = {"F": "forward", "B": "backward", "U": "update"}


def ops_of(text):
    """Parses `"F0 B0 U0 F1.2"` into Ops (test helper, independent of `Op.label`)."""
    ops = []
    for token in text.split():
        match = re.fullmatch(r"([FBU])(\d+)(?:\.(\d+))?", token)
        ops.append(Op(_LETTER_KINDS[match[1]], int(match[2]), int(match[3] or 0)))
    return ops


def reference_async(k, n, t):
    """Async order written as "keep w_k mini-batches in flight", not as the spec's loop."""
    window = min(n - k, t)
    ops, next_forward, backwards_done = [], 0, 0
    while backwards_done < t:
        # Issue forwards while fewer than `window` mini-batches are in flight.
        while next_forward < t and next_forward - backwards_done < window:
            ops.append(Op("forward", next_forward))
            next_forward += 1
        ops += [Op("backward", backwards_done), Op("update", backwards_done)]
        backwards_done += 1
    return ops


def in_flight_peak(ops):
    """Largest number of mini-batches forwarded but not yet backwarded."""
    live, peak = set(), 0
    for op in ops:
        if op.kind == "forward":
            live.add(op.batch)
        elif op.kind == "backward":
            live.remove(op.batch)
        peak = max(peak, len(live))
    return peak


def paper_gaps(k, n):
    """SpecTrain's gaps, counted instead of using floor division."""
    half = sum(1 for j in range(1, k + 1) if j % 2 == 0)
    return half + (n - 1 - k), half


# --- Op ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, show_micro, text",
    [
        (Op("forward", 3), None, "F3"),
        (Op("backward", 3), None, "B3"),
        (Op("update", 3), None, "U3"),
        (Op("forward", 3, 1), None, "F3.1"),
        (Op("backward", 12, 4), None, "B12.4"),
        (Op("forward", 3, 0), True, "F3.0"),
        (Op("forward", 3, 2), False, "F3"),
    ],
)
def test_op_label(op, show_micro, text):
    assert op.label(show_micro) == text
    if show_micro is None:
        assert str(op) == text


def test_op_is_frozen_and_hashable():
    op = Op("forward", 1, 2)
    assert op.key == ("forward", 1, 2)
    assert {op: 1}[Op("forward", 1, 2)] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.batch = 3


# --- asynchronous schedule ---------------------------------------------------------------

ASYNC_BY_HAND = [
    (1, 3, ["F0 B0 U0 F1 B1 U1 F2 B2 U2"]),
    (2, 3, ["F0 F1 B0 U0 F2 B1 U1 B2 U2", "F0 B0 U0 F1 B1 U1 F2 B2 U2"]),
    (
        3,
        5,
        [
            "F0 F1 F2 B0 U0 F3 B1 U1 F4 B2 U2 B3 U3 B4 U4",
            "F0 F1 B0 U0 F2 B1 U1 F3 B2 U2 F4 B3 U3 B4 U4",
            "F0 B0 U0 F1 B1 U1 F2 B2 U2 F3 B3 U3 F4 B4 U4",
        ],
    ),
    (4, 2, ["F0 F1 B0 U0 B1 U1"] * 3 + ["F0 B0 U0 F1 B1 U1"]),
    (4, 1, ["F0 B0 U0"] * 4),
]


@pytest.mark.parametrize("n, t, texts", ASYNC_BY_HAND)
def test_async_ops_by_hand(n, t, texts):
    for k, text in enumerate(texts):
        assert schedule.async_ops(k, n, t) == ops_of(text)


@pytest.mark.parametrize("n", range(1, 9))
def test_async_ops_match_reference_and_invariants(n):
    for t in range(1, 11):
        for k in range(n):
            ops = schedule.async_ops(k, n, t)
            assert ops == reference_async(k, n, t)
            for kind in ("forward", "backward", "update"):
                assert sorted(op.batch for op in ops if op.kind == kind) == list(range(t))
            for i in range(t):
                b = ops.index(Op("backward", i))
                assert ops.index(Op("forward", i)) < b
                assert ops[b + 1] == Op("update", i)
            assert all(op.micro == 0 for op in ops)


@pytest.mark.parametrize(
    "k, n, t, expected", [(0, 1, 5, 1), (0, 4, 10, 4), (1, 4, 10, 3), (3, 4, 10, 1), (0, 4, 2, 2)]
)
def test_warmup_forwards(k, n, t, expected):
    assert schedule.warmup_forwards(k, n, t) == expected


@pytest.mark.parametrize("n", range(1, 9))
def test_max_stashed_matches_op_list(n):
    for t in range(1, 11):
        for k in range(n):
            peak = in_flight_peak(schedule.async_ops(k, n, t))
            assert schedule.max_stashed(k, n, t) == peak


# --- synchronous schedule ----------------------------------------------------------------


@pytest.mark.parametrize(
    "t, m, text",
    [
        (2, 1, "F0 B0 U0 F1 B1 U1"),
        (1, 2, "F0.0 F0.1 B0.0 B0.1 U0"),
        (2, 3, "F0.0 F0.1 F0.2 B0.0 B0.1 B0.2 U0 F1.0 F1.1 F1.2 B1.0 B1.1 B1.2 U1"),
    ],
)
def test_sync_ops_by_hand(t, m, text):
    for k in range(3):
        assert schedule.sync_ops(k, 3, t, micro_batches=m) == ops_of(text)


@pytest.mark.parametrize("m", [1, 2, 3])
def test_sync_ops_see_sequential_versions(m):
    # Sequential SGD: every pass of mini-batch i sees exactly i updates.
    for n in range(1, 5):
        for t in range(1, 5):
            ops = schedule.sync_ops(n - 1, n, t, micro_batches=m)
            passes = [(kind, i, j) for kind in ("forward", "backward") for i in range(t)
                      for j in range(m)]
            expected = {key: key[1] for key in passes}
            assert schedule.versions_seen(ops) == expected


# --- 1F1B-flush and micro-batches in the asynchronous schedule ---------------------------


@pytest.mark.parametrize(
    "n, t, m, rows",
    [
        # Written out by hand: w = min(N - k, M) warm-up forwards, then B(j) and F(j + w).
        (3, 1, 4, ["F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 B0.2 B0.3 U0",
                   "F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3 U0",
                   "F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 F0.3 B0.3 U0"]),
        (2, 2, 2, ["F0.0 F0.1 B0.0 B0.1 U0 F1.0 F1.1 B1.0 B1.1 U1",
                   "F0.0 B0.0 F0.1 B0.1 U0 F1.0 B1.0 F1.1 B1.1 U1"]),
        (4, 1, 2, ["F0.0 F0.1 B0.0 B0.1 U0"] * 3 + ["F0.0 B0.0 F0.1 B0.1 U0"]),
        (3, 1, 1, ["F0 B0 U0"] * 3),
    ],
)
def test_one_f_one_b_ops_by_hand(n, t, m, rows):
    for k in range(n):
        assert schedule.sync_ops(k, n, t, m, schedule="1f1b") == ops_of(rows[k]), k


@pytest.mark.parametrize("n, m", [(1, 1), (2, 3), (3, 4), (4, 8), (5, 2)])
def test_one_f_one_b_keeps_fewer_in_flight_and_same_versions(n, m):
    for k in range(n):
        gpipe = schedule.sync_ops(k, n, 3, m)
        flush = schedule.sync_ops(k, n, 3, m, schedule="1f1b")
        assert sorted(gpipe, key=str) == sorted(flush, key=str)  # the same ops, reordered
        # Both see sequential SGD's versions, so they compute the same result.
        assert schedule.versions_seen(flush) == schedule.versions_seen(gpipe)
        assert schedule.max_in_flight(gpipe) == m
        assert schedule.max_in_flight(flush) == min(n - k, m)


@pytest.mark.parametrize("n, m, bubble", [
    # Theory for both orders: (N - 1) / (M + N - 1) of the slots of a flushed mini-batch.
    (4, 4, 3 / 7), (4, 8, 3 / 11), (2, 1, 1 / 2), (3, 4, 2 / 6),
])
def test_gpipe_and_one_f_one_b_have_the_theoretical_bubble(n, m, bubble):
    for order in schedule.SYNC_SCHEDULES:
        table = schedule.clock_table([schedule.sync_ops(k, n, 1, m, schedule=order)
                                      for k in range(n)])
        assert schedule.bubble_fraction(table) == pytest.approx(bubble)


def test_one_f_one_b_clock_table_as_drawn_in_the_docstring():
    table = schedule.clock_table([schedule.sync_ops(k, 3, 1, 4, schedule="1f1b")
                                  for k in range(3)])
    assert schedule.format_table(table) == (
        "stage 0: F0.0 F0.1 F0.2 .    .    B0.0 F0.3 B0.1 .    B0.2 .    B0.3\n"
        "stage 1: .    F0.0 F0.1 .    B0.0 F0.2 B0.1 F0.3 B0.2 .    B0.3 .\n"
        "stage 2: .    .    F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 F0.3 B0.3 .    ."
    )


def test_async_ops_with_micro_batches_by_hand():
    assert schedule.async_ops(0, 2, 3, 2) == ops_of(
        "F0.0 F0.1 F1.0 F1.1 B0.0 B0.1 U0 F2.0 F2.1 B1.0 B1.1 U1 B2.0 B2.1 U2")
    assert schedule.async_ops(1, 2, 2, 3) == ops_of(
        "F0.0 F0.1 F0.2 B0.0 B0.1 B0.2 U0 F1.0 F1.1 F1.2 B1.0 B1.1 B1.2 U1")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_async_micro_batches_keep_the_mini_batch_versions(n):
    # Every micro-batch of F(i) / B(i) sees the update count F(i) / B(i) sees with M = 1.
    for t in range(1, 6):
        for k in range(n):
            one = schedule.versions_seen(schedule.async_ops(k, n, t))
            for m in (2, 3):
                ops = schedule.async_ops(k, n, t, m)
                seen = schedule.versions_seen(ops)
                assert seen == {(kind, i, j): one[(kind, i, 0)]
                                for kind, i, _ in one for j in range(m)}
                assert schedule.max_in_flight(ops) == min(n - k, t) * m
                assert [op for op in ops if op.kind == "update"] == [
                    Op("update", i) for i in range(t)]


def test_max_in_flight_counts_micro_batches_and_rejects_bad_lists():
    assert schedule.max_in_flight(ops_of("F0.0 F0.1 B0.0 F0.2 B0.1 B0.2 U0")) == 2
    assert schedule.max_in_flight([]) == 0
    with pytest.raises(ValueError, match="B0.1 before its forward"):
        schedule.max_in_flight(ops_of("F0.0 B0.1"))
    with pytest.raises(ValueError, match=r"`schedule` must be one of \['gpipe', '1f1b'\]"):
        schedule.sync_ops(0, 2, 2, 2, schedule="1F1B")


# --- versions ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 9))
def test_versions_seen_agree_with_closed_forms(n):
    for t in range(1, 11):
        for k in range(n):
            seen = schedule.versions_seen(schedule.async_ops(k, n, t))
            expected = {}
            for i in range(t):
                expected[("forward", i, 0)] = schedule.forward_version(i, k, n)
                expected[("backward", i, 0)] = schedule.backward_version(i)
            assert seen == expected


def test_versions_seen_on_hand_list():
    ops = ops_of("F0 F1 B0 U0 F2 B1 U1 U1 B2")
    assert schedule.versions_seen(ops) == {
        ("forward", 0, 0): 0,
        ("forward", 1, 0): 0,
        ("backward", 0, 0): 0,
        ("forward", 2, 0): 1,
        ("backward", 1, 0): 1,
        ("backward", 2, 0): 3,
    }


@pytest.mark.parametrize(
    "i, k, n, expected", [(0, 0, 4, 0), (3, 0, 4, 0), (4, 0, 4, 1), (5, 2, 4, 4), (5, 3, 4, 5)]
)
def test_forward_version_values(i, k, n, expected):
    assert schedule.forward_version(i, k, n) == expected


@pytest.mark.parametrize("k, gaps", enumerate([(3, 0), (2, 0), (2, 1), (1, 1)]))
def test_version_gaps_spectrain_md_table(k, gaps):
    assert schedule.version_gaps(k, 4) == gaps


@pytest.mark.parametrize("n", range(1, 9))
def test_version_gaps_formula(n):
    for k in range(n):
        assert schedule.version_gaps(k, n, target="paper") == paper_gaps(k, n)
        assert schedule.version_gaps(k, n, target="consistent") == (n - 1 - k, None)
    s_f, s_b = schedule.version_gaps(n - 1, n)
    assert s_f == s_b


# --- bad input ---------------------------------------------------------------------------

F0, B0 = Op("forward", 0), Op("backward", 0)

BAD_CALLS = [
    (schedule.warmup_forwards, (3, 3, 1), ValueError, r"0\.\.2.*k=3"),
    (schedule.warmup_forwards, (-1, 3, 1), ValueError, r"k=-1"),
    (schedule.warmup_forwards, (0, 0, 1), ValueError, r"num_stages=0"),
    (schedule.warmup_forwards, (0, 3, 0), ValueError, r"num_batches=0"),
    (schedule.warmup_forwards, (0, 3, True), TypeError, r"num_batches=True of type bool"),
    (schedule.warmup_forwards, (0, 2.0, 1), TypeError, r"num_stages=2\.0"),
    (schedule.async_ops, (0, 3, "4"), TypeError, r"num_batches='4'"),
    (schedule.async_ops, (1.0, 3, 4), TypeError, r"k=1\.0"),
    (schedule.sync_ops, (0, 2, 2, 0), ValueError, r"micro_batches=0"),
    (schedule.sync_ops, (2, 2, 2), ValueError, r"k=2"),
    (schedule.sync_ops, (0, 2, -1), ValueError, r"num_batches=-1"),
    (schedule.max_stashed, (0, 1, 0), ValueError, r"num_batches=0"),
    (schedule.max_stashed, (1, 1, 5), ValueError, r"k=1"),
    (schedule.forward_version, (-1, 0, 2), ValueError, r"i=-1"),
    (schedule.forward_version, (0, 2, 2), ValueError, r"k=2"),
    (schedule.forward_version, (0, 0, 0), ValueError, r"num_stages=0"),
    (schedule.backward_version, (-1,), ValueError, r"i=-1"),
    (schedule.backward_version, (1.5,), TypeError, r"i=1\.5"),
    (schedule.version_gaps, (0, 4, "papr"), ValueError, r"paper.*consistent.*target='papr'"),
    (schedule.version_gaps, (4, 4), ValueError, r"k=4"),
    (schedule.version_gaps, (0, 0), ValueError, r"num_stages=0"),
    (Op, ("fwd", 0), ValueError, r"forward.*kind='fwd'"),
    (Op, ("forward", -1), ValueError, r"batch=-1"),
    (Op, ("forward", 0, -1), ValueError, r"micro=-1"),
    (Op, ("forward", True), TypeError, r"batch=True"),
    (schedule.versions_seen, ([F0, F0],), ValueError, r"F0 repeats"),
    (schedule.versions_seen, (["F0"],), TypeError, r"'F0'"),
    (schedule.versions_seen, (None,), TypeError, r"ops=None"),
]


@pytest.mark.parametrize("fn, args, error, message", BAD_CALLS)
def test_bad_input_raises(fn, args, error, message):
    with pytest.raises(error, match=message):
        fn(*args)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: schedule.async_ops(0, 0, 4),
         "`num_stages` must be an integer >= 1 (the number of pipeline stages). "
         "Received: num_stages=0"),
        (lambda: schedule.sync_ops(0, 2, 4, micro_batches=2.0),
         "`micro_batches` must be an integer >= 1 (the number of micro-batches per "
         "mini-batch). Received: micro_batches=2.0 of type float"),
        (lambda: schedule.forward_version(0, 4, 4),
         "`k` must be a stage index in 0..3 for num_stages=4. Received: k=4"),
        (lambda: Op("forward", 0, "1"),
         "`micro` must be an integer >= 0. Received: micro='1' of type str"),
    ],
)
def test_bad_input_messages_in_full(call, message):
    with pytest.raises((TypeError, ValueError)) as raised:
        call()
    assert str(raised.value) == message
