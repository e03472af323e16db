"""Pipeline schedules as data: per-stage instruction lists and the weight versions they imply.

This module is pure Python (no TensorFlow): it says *what* each stage does and in which
order, never *how*. The pipeline runtime walks these lists; tests and benchmarks inspect
them. See SPECTRAIN.md, sections 3 and 4.

Each stage `k` of an `N`-stage pipeline runs a list of `Op`s over the `T` mini-batches of
an epoch. In the asynchronous schedule (one forward, one backward) stage k first runs
`w_k = min(N - k, T)` warm-up forwards, then alternates backward and forward; `U(i)`, the
stage's weight update, follows each `B(i)`. For N = 3 in lock-step slots (`clock_table`):

    stage 0: F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 ...
    stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 ...
    stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 ...

The synchronous schedule (sequential SGD, or GPipe with micro-batches) runs all forwards of
a mini-batch, then all its backwards, then one update, so the pipeline fills and drains
once per mini-batch.
"""

import dataclasses

FORWARD = "forward"
BACKWARD = "backward"
UPDATE = "update"
KINDS = (FORWARD, BACKWARD, UPDATE)
TARGETS = ("paper", "consistent")

_LETTERS = {FORWARD: "F", BACKWARD: "B", UPDATE: "U"}
_MEANINGS = {
    "num_stages": "the number of pipeline stages",
    "num_batches": "the number of mini-batches in an epoch",
    "micro_batches": "the number of micro-batches per mini-batch",
}


# --- validation ---------------------------------------------------------------------------


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(name, value):
    if not _is_int(value) or value < 1:
        raise ValueError(
            f"`{name}` must be an integer >= 1 ({_MEANINGS[name]}). "
            f"Received: {name}={value!r}"
        )


def _check_index(name, value):
    if not _is_int(value) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0. Received: {name}={value!r}")


def _check_stage(k, num_stages):
    _check_count("num_stages", num_stages)
    if not _is_int(k) or not 0 <= k < num_stages:
        raise ValueError(
            f"`k` must be a stage index in 0..{num_stages - 1} for "
            f"num_stages={num_stages}. Received: k={k!r}"
        )


# --- instructions -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Op:
    """One instruction of a stage: a forward, backward or weight update.

    Ops are immutable and hashable, so they can serve as dictionary keys.

    Args:
        kind: `"forward"`, `"backward"` or `"update"`.
        batch: the mini-batch index `i`, an int >= 0.
        micro: the micro-batch index `j`, an int >= 0; 0 when mini-batches are not split.
            The schedules give updates `micro=0`: an update applies the whole mini-batch.

    Raises:
        ValueError: if `kind` is not one of the three kinds or an index is not an int >= 0.
    """

    kind: str
    batch: int
    micro: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"`kind` must be one of {KINDS}. Received: kind={self.kind!r}")
        _check_index("batch", self.batch)
        _check_index("micro", self.micro)

    @property
    def key(self):
        """The tuple `(kind, batch, micro)` that identifies this op on its stage."""
        return (self.kind, self.batch, self.micro)

    def label(self, show_micro=None):
        """Returns a short label such as `"F3"`, `"U3"` or `"B3.1"`.

        Args:
            show_micro: True to always append `.j`, False never; None (default) appends it
                only when `micro > 0`.

        Returns:
            The label string.
        """
        text = f"{_LETTERS[self.kind]}{self.batch}"
        if show_micro or (show_micro is None and self.micro > 0):
            text += f".{self.micro}"
        return text

    def __str__(self):
        return self.label()


# --- the schedules ------------------------------------------------------------------------


def warmup_forwards(k, num_stages, num_batches):
    """Returns `w_k = min(N - k, T)`, the forwards stage k runs before its first backward.

    Args:
        k: the stage index, `0 <= k < num_stages`.
        num_stages: `N`, an int >= 1.
        num_batches: `T`, an int >= 1.

    Returns:
        The number of warm-up forwards, an int in `1..T`.

    Raises:
        ValueError: if an argument is out of range.
    """
    _check_stage(k, num_stages)
    _check_count("num_batches", num_batches)
    return min(num_stages - k, num_batches)


def async_ops(k, num_stages, num_batches):
    """Returns the asynchronous (one-forward-one-backward) instruction list of stage k.

    `F(0) .. F(w_k - 1)`, then for `i = 0 .. T-1`: `B(i)`, `U(i)`, and `F(i + w_k)` while
    `i + w_k < T` (SPECTRAIN.md section 3). Every mini-batch is forwarded and backwarded
    exactly once, so the list ends drained: no mini-batch is left in flight.

    Args:
        k: the stage index, `0 <= k < num_stages`.
        num_stages: `N`, an int >= 1.
        num_batches: `T`, an int >= 1.

    Returns:
        A list of `3 * T` `Op`s.

    Raises:
        ValueError: if an argument is out of range.
    """
    warmup = warmup_forwards(k, num_stages, num_batches)
    ops = [Op(FORWARD, i) for i in range(warmup)]
    for i in range(num_batches):
        ops += [Op(BACKWARD, i), Op(UPDATE, i)]
        if i + warmup < num_batches:
            ops.append(Op(FORWARD, i + warmup))
    return ops


def sync_ops(k, num_stages, num_batches, micro_batches=1):
    """Returns the synchronous (sequential SGD / GPipe) instruction list of stage k.

    For each mini-batch `i`: `F(i, 0) .. F(i, M-1)`, then `B(i, 0) .. B(i, M-1)`, then one
    `U(i)`. The list is the same for every stage; with blocking hand-offs between
    neighbours the pipeline fills and drains once per mini-batch.

    Args:
        k: the stage index, `0 <= k < num_stages` (validated; the list does not depend on it).
        num_stages: `N`, an int >= 1.
        num_batches: `T`, an int >= 1.
        micro_batches: `M`, an int >= 1; 1 means mini-batches are not split.

    Returns:
        A list of `T * (2 * M + 1)` `Op`s.

    Raises:
        ValueError: if an argument is out of range.
    """
    _check_stage(k, num_stages)
    _check_count("num_batches", num_batches)
    _check_count("micro_batches", micro_batches)
    ops = []
    for i in range(num_batches):
        ops += [Op(FORWARD, i, j) for j in range(micro_batches)]
        ops += [Op(BACKWARD, i, j) for j in range(micro_batches)]
        ops.append(Op(UPDATE, i))
    return ops


def max_stashed(k, num_stages, num_batches):
    """Returns the most mini-batches ever in flight on stage k in `async_ops`.

    A mini-batch is in flight from the end of its forward to the end of its backward; its
    input (and, when stashing, its weights) must be kept that long. The maximum is `w_k`.

    Args:
        k: the stage index, `0 <= k < num_stages`.
        num_stages: `N`, an int >= 1.
        num_batches: `T`, an int >= 1.

    Returns:
        The maximum number of mini-batches in flight, `min(N - k, T)`.

    Raises:
        ValueError: if an argument is out of range.
    """
    return warmup_forwards(k, num_stages, num_batches)


# --- weight versions ----------------------------------------------------------------------


def forward_version(i, k, num_stages):
    """Returns how many updates stage k has finished before `F(i)` in `async_ops`.

    Args:
        i: the mini-batch index, an int >= 0.
        k: the stage index, `0 <= k < num_stages`.
        num_stages: `N`, an int >= 1.

    Returns:
        `max(0, i - (N - 1 - k))`.

    Raises:
        ValueError: if an argument is out of range.
    """
    _check_index("i", i)
    _check_stage(k, num_stages)
    return max(0, i - (num_stages - 1 - k))


def backward_version(i):
    """Returns how many updates a stage has finished before `B(i)` in `async_ops`: `i`.

    Args:
        i: the mini-batch index, an int >= 0.

    Returns:
        `i`.

    Raises:
        ValueError: if `i` is not an int >= 0.
    """
    _check_index("i", i)
    return i


def versions_seen(ops):
    """Counts, for each forward and backward in an op list, the updates that precede it.

    Works for any list (asynchronous, synchronous, hand-written), so it can check the
    closed forms `forward_version` and `backward_version` against the schedule itself.

    Args:
        ops: a sequence of `Op`, one stage's instruction list.

    Returns:
        A dict mapping `(kind, batch, micro)` of every forward and backward op to the number
        of update ops before it.

    Raises:
        TypeError: if an element is not an `Op`.
        ValueError: if a forward or backward op occurs twice.
    """
    if not isinstance(ops, (list, tuple)):
        raise TypeError(f"`ops` must be a list of `Op`. Received: ops={ops!r}")
    seen = {}
    updates = 0
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"`ops` must contain only `Op` instances. Received: {op!r}")
        if op.kind == UPDATE:
            updates += 1
        elif op.key in seen:
            raise ValueError(f"Each forward and backward op may occur only once. {op} repeats.")
        else:
            seen[op.key] = updates
    return seen


def version_gaps(k, num_stages, target="paper"):
    """Returns SpecTrain's version gaps `(s_f, s_b)` for stage k.

    A gap `s` is how many optimizer updates ahead the weight prediction `W + s * m` looks.

    - `"paper"`: `s_f = k // 2 + N - 1 - k` for the forward and `s_b = k // 2` for the
      backward (the source paper's rule). On the last stage `s_f == s_b`.
    - `"consistent"`: `s_f = N - 1 - k`, the version sequential SGD would use, and
      `s_b = None`: the backward does not predict again but reuses the weights predicted
      for the forward, as weight stashing does.

    Args:
        k: the stage index, `0 <= k < num_stages`; stage 0 holds the input.
        num_stages: `N`, an int >= 1.
        target: `"paper"` or `"consistent"`.

    Returns:
        A tuple `(s_f, s_b)` of ints, with `s_b = None` for `"consistent"`.

    Raises:
        ValueError: if an argument is out of range or `target` is unknown.
    """
    _check_stage(k, num_stages)
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {TARGETS}. Received: target={target!r}")
    ahead = num_stages - 1 - k
    if target == "consistent":
        return ahead, None
    return k // 2 + ahead, k // 2


# --- lock-step simulation -----------------------------------------------------------------


def _check_op_lists(op_lists):
    if not isinstance(op_lists, (list, tuple)) or not op_lists:
        raise ValueError(
            "`op_lists` must be a non-empty list with one list of `Op` per stage. "
            f"Received: op_lists={op_lists!r}"
        )
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
        TypeError: if `op_lists` holds something other than lists of `Op`.
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
    if not isinstance(table, (list, tuple)) or not table:
        raise ValueError(
            f"`table` must be a non-empty list of rows, as returned by `clock_table`. "
            f"Received: table={table!r}"
        )
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
