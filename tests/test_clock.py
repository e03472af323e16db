"""Tests for `tf_spectrain.schedule.clock`: lock-step clock tables, their text and bubble.

Expected tables are derived by hand (from SPECTRAIN.md) or checked against the rules
re-implemented below; none is taken from the module under test.
"""

import pytest

from tf_spectrain import schedule
from tf_spectrain.schedule import Op


def check_clock_rules(op_lists, table):
    """Checks a clock table independently: order, dependencies and no needless idling."""
    n = len(op_lists)
    where = {}  # (stage, kind, batch, micro) -> column
    for k, row in enumerate(table):
        ran = [op for op in row if op is not None]
        assert ran == [op for op in op_lists[k] if op.kind != "update"]
        for col, op in enumerate(row):
            if op is not None:
                where[(k, op.kind, op.batch, op.micro)] = col

    def needs(k, op):
        if op.kind == "forward":
            return (k - 1, "forward", op.batch, op.micro) if k else None
        neighbour = k + 1 if k < n - 1 else k
        kind = "backward" if k < n - 1 else "forward"
        return (neighbour, kind, op.batch, op.micro)

    for k, row in enumerate(table):
        pending = [op for op in op_lists[k] if op.kind != "update"]
        for col, op in enumerate(row):
            nxt = pending[0] if pending else None
            if nxt is None:
                assert op is None
                continue
            dep = needs(k, nxt)
            ready = dep is None or where.get(dep, col) < col
            assert (op is not None) == ready, (k, col, nxt)
            if op is not None:
                pending.pop(0)


# --- clock tables ------------------------------------------------------------------------

# Derived by hand, slot by slot, for N = 3, T = 6.
N3_T6 = [
    "stage 0: F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 .  B4 .  B5",
    "stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 .  B5 .",
    "stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 .  .",
]
# SPECTRAIN.md section 3, without the trailing "...".
SPEC_PREFIX = [
    "stage 0: F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3",
    "stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3",
    "stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3",
]
# GPipe, N = 2, T = 2, M = 2: fill and drain once per mini-batch.
SYNC_N2_T2_M2 = [
    "stage 0: F0.0 F0.1 .    .    B0.0 B0.1 F1.0 F1.1 .    .    B1.0 B1.1",
    "stage 1: .    F0.0 F0.1 B0.0 B0.1 .    .    F1.0 F1.1 B1.0 B1.1 .",
]


def test_clock_table_n3_by_hand():
    table = schedule.clock_table([schedule.async_ops(k, 3, 6) for k in range(3)])
    assert schedule.format_table(table).split("\n") == N3_T6
    cells = [line.split(": ")[1].split() for line in N3_T6]
    for row, expected in zip(table, cells, strict=True):
        assert [str(op) if op else "." for op in row] == expected
    idle = sum(cell == "." for row in cells for cell in row)
    assert schedule.bubble_fraction(table) == pytest.approx(idle / (3 * len(cells[0])))


def test_clock_table_matches_spectrain_md_example():
    table = schedule.clock_table([schedule.async_ops(k, 3, 6) for k in range(3)])
    lines = schedule.format_table(table).split("\n")
    for line, prefix in zip(lines, SPEC_PREFIX, strict=True):
        assert line.startswith(prefix)


def test_clock_table_gpipe_by_hand():
    table = schedule.clock_table([schedule.sync_ops(k, 2, 2, micro_batches=2) for k in range(2)])
    assert schedule.format_table(table).split("\n") == SYNC_N2_T2_M2


@pytest.mark.parametrize("n", range(1, 7))
def test_clock_table_follows_rules(n):
    for t in range(1, 7):
        for lists in (
            [schedule.async_ops(k, n, t) for k in range(n)],
            [schedule.sync_ops(k, n, t, micro_batches=2) for k in range(n)],
        ):
            check_clock_rules(lists, schedule.clock_table(lists))


@pytest.mark.parametrize("n, m", [(1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (3, 4), (4, 3)])
def test_sync_bubble_is_gpipe_formula(n, m):
    for t in (1, 2):
        lists = [schedule.sync_ops(k, n, t, micro_batches=m) for k in range(n)]
        table = schedule.clock_table(lists)
        assert len(table[0]) == t * 2 * (n + m - 1)
        assert schedule.bubble_fraction(table) == pytest.approx((n - 1) / (n + m - 1))


def test_format_table_aligns_two_digit_stages():
    table = schedule.clock_table([schedule.async_ops(k, 11, 1) for k in range(11)])
    lines = schedule.format_table(table).split("\n")
    assert lines[0].startswith("stage  0: F0 .")
    assert lines[10].startswith("stage 10: .  .")
    assert len(lines) == 11


# --- bad input ---------------------------------------------------------------------------

F0, B0 = Op("forward", 0), Op("backward", 0)

BAD_CALLS = [
    (schedule.clock_table, ([],), ValueError, r"non-empty"),
    (schedule.clock_table, ("F0",), TypeError, r"op_lists='F0' of type str"),
    (schedule.clock_table, ([[F0], "F0"],), TypeError, r"op_lists\[1\]"),
    (schedule.clock_table, ([["F0"]],), TypeError, r"'F0'"),
    (schedule.clock_table, ([[F0, B0, F0]],), ValueError, r"F0 repeats"),
    (schedule.clock_table, ([[B0, F0], [F0, B0]],), ValueError, r"deadlock.*stage 0.*B0"),
    (schedule.clock_table, ([[F0, B0], [Op("forward", 1)]],), ValueError, r"stage 1.*F1"),
    (schedule.clock_table, ([[B0, F0]],), ValueError, r"deadlock"),
    (schedule.format_table, ([],), ValueError, r"non-empty"),
    (schedule.format_table, ([[None], [None, None]],), ValueError, r"same length.*\[1, 2\]"),
    (schedule.format_table, ([["F0"]],), TypeError, r"'F0'"),
    (schedule.bubble_fraction, ([[]],), ValueError, r"no slots"),
    (schedule.bubble_fraction, (None,), TypeError, r"table=None of type NoneType"),
]


@pytest.mark.parametrize("fn, args, error, message", BAD_CALLS)
def test_bad_input_raises(fn, args, error, message):
    with pytest.raises(error, match=message):
        fn(*args)
