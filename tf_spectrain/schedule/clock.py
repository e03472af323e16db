"""Lock-step simulation of the stages' op lists: the clock table, its text and its bubble.

`clock_table` runs one op per stage per slot, as soon as the op's dependency on a
neighbouring stage has finished; `format_table` draws it and `bubble_fraction` counts
its idle slots. Pure Python, like the whole `tf_spectrain.schedule` package.
"""

from tf_spectrain import checks
from tf_spectrain.schedule.instructions import FORWARD, UPDATE, Op, versions_seen

_OP_LISTS = "a non-empty list with one list of `Op` per stage"
_TABLE = "a non-empty list of rows, as returned by `clock_table`"


def _check_op_lists(op_lists):
    """The lists without their updates, after checking they are lists of `Op`."""
    checks.check_instance("op_lists", op_lists, (list, tuple), hint=f" ({_OP_LISTS})")
    if not op_lists:
        raise ValueError(f"`op_lists` must be {_OP_LISTS}. Received: op_lists={op_lists!r}")
    for k, ops in enumerate(op_lists):
        if not isinstance(ops, (list, tuple)):
            raise TypeError(
                f"`op_lists[{k}]` must be a list of `Op`. Received: {type(ops).__name__}"
            )
        versions_seen(ops)  # raises on non-Op elements and repeated ops
    return [[op for op in ops if op.kind != UPDATE] for ops in op_lists]


def _dependency(op, k, num_stages):
    """Returns `(stage, key)` of the op that must finish before `op` runs on stage k."""
    if op.kind == FORWARD:
        return (k - 1, op.key) if k > 0 else None
    if k < num_stages - 1:
        return (k + 1, op.key)
    return (k, (FORWARD, op.batch, op.micro))


def _ready(op, k, finished, slot):
    """Whether `op`'s dependency on stage k finished in a slot before `slot`."""
    dependency = _dependency(op, k, len(finished))
    if dependency is None:
        return True
    stage, key = dependency
    return key in finished[stage] and finished[stage][key] < slot


def clock_table(op_lists):
    """Simulates lock-step execution of per-stage op lists, one op per stage per slot.

    In each slot every stage runs its next op if that op's dependency finished in an
    earlier slot: `F(i, j)` on stage k > 0 needs `F(i, j)` of stage k-1; `B(i, j)` on stage
    k < N-1 needs `B(i, j)` of stage k+1, and on the last stage its own `F(i, j)`. Update
    ops take no slot: they belong to the backward before them and are left out.

    Args:
        op_lists: one sequence of `Op` per stage, stage 0 first (e.g. from `async_ops`).

    Returns:
        A table as a list of rows, one per stage, each a list with one entry per slot:
        the `Op` the stage runs in that slot, or None when it is idle.

    Raises:
        TypeError: if `op_lists` is not a list of lists of `Op`.
        ValueError: if `op_lists` is empty, a stage repeats an op, or the lists deadlock
            (some op waits for an op that never runs first).
    """
    lists = _check_op_lists(op_lists)
    num_stages = len(lists)
    finished = [{} for _ in lists]  # per stage: op key -> slot it ran in
    position = [0] * num_stages
    table = [[] for _ in lists]
    slot = 0
    while any(position[k] < len(lists[k]) for k in range(num_stages)):
        ran = False
        for k, ops in enumerate(lists):
            op = ops[position[k]] if position[k] < len(ops) else None
            if op is not None and not _ready(op, k, finished, slot):
                op = None
            table[k].append(op)
            if op is not None:
                finished[k][op.key] = slot
                position[k] += 1
                ran = True
        if not ran:
            raise ValueError(_deadlock_message(lists, position))
        slot += 1
    return table


def _deadlock_message(lists, position):
    """Which stage waits for which op, when no stage can run."""
    waiting = [
        f"stage {k} cannot run {ops[position[k]]}"
        for k, ops in enumerate(lists)
        if position[k] < len(ops)
    ]
    return (
        "`op_lists` deadlock: no stage can run its next op, because each one waits for an "
        f"op that never runs before it ({'; '.join(waiting)}). Check that every stage's "
        "list comes from the same schedule with the same num_stages and num_batches."
    )


def _check_table(table):
    """`table` is a non-empty list of equally long rows of `Op` or None."""
    checks.check_instance("table", table, (list, tuple), hint=f" ({_TABLE})")
    if not table:
        raise ValueError(f"`table` must be {_TABLE}. Received: table={table!r}")
    lengths = {len(row) for row in table}
    if len(lengths) != 1:
        raise ValueError(
            f"All rows of `table` must have the same length. Received lengths: "
            f"{[len(row) for row in table]}"
        )
    for row in table:
        for cell in row:
            if cell is not None and not isinstance(cell, Op):
                raise TypeError(f"`table` cells must be `Op` or None. Received: {cell!r}")


def format_table(table):
    """Draws a clock table as text, one line per stage, `.` for an idle slot.

    Micro-batch indices are shown (`F0.1`) for every op when any op has `micro > 0`.

    Args:
        table: a table from `clock_table`.

    Returns:
        A string such as `"stage 0: F0 F1 .  B0\\nstage 1: .  F0 B0 ."` (no trailing
        spaces).

    Raises:
        TypeError, ValueError: if `table` is not a valid clock table.
    """
    _check_table(table)
    show_micro = any(op is not None and op.micro > 0 for row in table for op in row)
    cells = [[op.label(show_micro) if op else "." for op in row] for row in table]
    width = max((len(cell) for row in cells for cell in row), default=1)
    name_width = len(str(len(table) - 1))
    lines = []
    for k, row in enumerate(cells):
        text = " ".join(cell.ljust(width) for cell in row)
        lines.append(f"stage {k:>{name_width}}: {text}".rstrip())
    return "\n".join(lines)


def bubble_fraction(table):
    """Returns the fraction of idle slots in a clock table (the pipeline "bubble").

    Args:
        table: a table from `clock_table`.

    Returns:
        `idle slots / (stages * slots)`, a float in `[0, 1]`.

    Raises:
        TypeError, ValueError: if `table` is not a valid clock table or has no slots.
    """
    _check_table(table)
    total = len(table) * len(table[0])
    if total == 0:
        raise ValueError("`table` has no slots, so it has no bubble fraction.")
    idle = sum(cell is None for row in table for cell in row)
    return idle / total
