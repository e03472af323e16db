"""A stage's instructions: `Op`, the asynchronous and synchronous lists, weight versions.

`async_ops` and `sync_ops` give the `Op` list one stage runs over an epoch;
`forward_version`, `backward_version` and `versions_seen` count the updates a pass sees,
and `version_gaps` says how far ahead SpecTrain predicts. Pure Python, like the whole
`tf_spectrain.schedule` package.
"""

import dataclasses

from tf_spectrain import checks

FORWARD = "forward"
BACKWARD = "backward"
UPDATE = "update"
KINDS = (FORWARD, BACKWARD, UPDATE)
TARGETS = ("paper", "consistent")
SYNC_SCHEDULES = ("gpipe", "1f1b")
"""The orders of a `sync` mini-batch's micro-batches: all forwards first, or 1F1B-flush."""

_LETTERS = {FORWARD: "F", BACKWARD: "B", UPDATE: "U"}
_MEANINGS = {
    "num_stages": "the number of pipeline stages",
    "num_batches": "the number of mini-batches in an epoch",
    "micro_batches": "the number of micro-batches per mini-batch",
}


# --- validation ---------------------------------------------------------------------------


def _check_count(name, value):
    """`value` is an int >= 1 (`name` is one of `_MEANINGS`)."""
    checks.check_int(name, value, 1, meaning=_MEANINGS[name])


def _check_stage(k, num_stages):
    """`num_stages` is an int >= 1 and `k` a stage index below it."""
    _check_count("num_stages", num_stages)
    checks.check_int("k", k)
    if not 0 <= k < num_stages:
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
        TypeError: if an index is not an int.
        ValueError: if `kind` is not one of the three kinds or an index is negative.
    """

    kind: str
    batch: int
    micro: int = 0

    def __post_init__(self):
        checks.check_one_of("kind", self.kind, KINDS)
        checks.check_int("batch", self.batch, 0)
        checks.check_int("micro", self.micro, 0)

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
        TypeError: if an argument is not an int.
        ValueError: if an argument is out of range.
    """
    _check_stage(k, num_stages)
    _check_count("num_batches", num_batches)
    return min(num_stages - k, num_batches)


def async_ops(k, num_stages, num_batches, micro_batches=1):
    """Returns the asynchronous (one-forward-one-backward) instruction list of stage k.

    `F(0) .. F(w_k - 1)`, then for `i = 0 .. T-1`: `B(i)`, `U(i)`, and `F(i + w_k)` while
    `i + w_k < T` (SPECTRAIN.md section 3), with `w_k = min(N - k, T)` warm-up forwards.
    Every mini-batch is forwarded and backwarded exactly once, so the list ends drained: no
    mini-batch is left in flight. For N = 3 in lock-step slots (`clock_table`; updates not
    shown):

        stage 0: F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 ...
        stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 ...
        stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 ...

    With `M > 1` micro-batches the unit stays the mini-batch: `F(i)` is `F(i, 0) ..
    F(i, M-1)` back to back, `B(i)` is `B(i, 0) .. B(i, M-1)`, and one `U(i)` follows, so
    every pass sees the update count it sees with `M = 1` (SPECTRAIN.md section 5a).

    Args:
        k: the stage index, `0 <= k < num_stages`.
        num_stages: `N`, an int >= 1.
        num_batches: `T`, an int >= 1.
        micro_batches: `M`, an int >= 1; 1 means mini-batches are not split.

    Returns:
        A list of `T * (2 * M + 1)` `Op`s.

    Raises:
        TypeError: if an argument is not an int.
        ValueError: if an argument is out of range.
    """
    warmup = warmup_forwards(k, num_stages, num_batches)
    _check_count("micro_batches", micro_batches)

    def forward(i):
        return [Op(FORWARD, i, j) for j in range(micro_batches)]

    ops = [op for i in range(warmup) for op in forward(i)]
    for i in range(num_batches):
        ops += [Op(BACKWARD, i, j) for j in range(micro_batches)] + [Op(UPDATE, i)]
        if i + warmup < num_batches:
            ops += forward(i + warmup)
    return ops


def sync_ops(k, num_stages, num_batches, micro_batches=1, schedule="gpipe"):
    """Returns the synchronous (sequential SGD) instruction list of stage k.

    Each mini-batch `i` is split into `M` micro-batches, and one `U(i)` follows all of
    their backwards, so every pass of mini-batch i sees exactly `i` updates whichever
    order the micro-batches run in. The order is the `schedule`:

    - `"gpipe"` (GPipe): `F(i, 0) .. F(i, M-1)`, then `B(i, 0) .. B(i, M-1)`, then `U(i)`.
      The list is the same for every stage; all M micro-batches are in flight at once.
    - `"1f1b"` (1F1B-flush: PipeDream-Flush, DAPPLE): `w = min(N - k, M)` warm-up
      forwards `F(i, 0) .. F(i, w-1)`, then for `j = 0 .. M-1`: `B(i, j)` and, while
      `j + w < M`, `F(i, j + w)`; then `U(i)`. Stage k keeps at most `w` micro-batches
      in flight (`max_in_flight`). For N = 3, M = 4 in lock-step slots (`clock_table`):

          stage 0: F0.0 F0.1 F0.2 .    .    B0.0 F0.3 B0.1 .    B0.2 .    B0.3
          stage 1: .    F0.0 F0.1 .    B0.0 F0.2 B0.1 F0.3 B0.2 .    B0.3 .
          stage 2: .    .    F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 F0.3 B0.3 .    .

    With blocking hand-offs between neighbours the pipeline fills and drains once per
    mini-batch in both orders, and both give the same result.

    Args:
        k: the stage index, `0 <= k < num_stages`.
        num_stages: `N`, an int >= 1.
        num_batches: `T`, an int >= 1.
        micro_batches: `M`, an int >= 1; 1 means mini-batches are not split.
        schedule: one of `SYNC_SCHEDULES`, `"gpipe"` (the default) or `"1f1b"`.

    Returns:
        A list of `T * (2 * M + 1)` `Op`s.

    Raises:
        TypeError: if an argument is not an int.
        ValueError: if an argument is out of range or `schedule` is unknown.
    """
    _check_stage(k, num_stages)
    _check_count("num_batches", num_batches)
    _check_count("micro_batches", micro_batches)
    checks.check_one_of("schedule", schedule, SYNC_SCHEDULES)
    warmup = micro_batches if schedule == "gpipe" else min(num_stages - k, micro_batches)
    ops = []
    for i in range(num_batches):
        ops += [Op(FORWARD, i, j) for j in range(warmup)]
        for j in range(micro_batches):
            ops.append(Op(BACKWARD, i, j))
            if j + warmup < micro_batches:
                ops.append(Op(FORWARD, i, j + warmup))
        ops.append(Op(UPDATE, i))
    return ops


def op_lists(mode, num_stages, num_batches, micro_batches=1, order="gpipe"):
    """Builds each stage's instruction list for an epoch of `num_batches` mini-batches.

    Args:
        mode: the pipeline mode; "sync" gets `sync_ops`, the others `async_ops`.
        num_stages: the number of stages.
        num_batches: mini-batches in the epoch.
        micro_batches: micro-batches per mini-batch (every mode).
        order: sync mode's schedule, "gpipe" or "1f1b" (the pipeline's `schedule`).

    Returns:
        A list of `num_stages` instruction lists, stage 0 first.
    """
    if mode == "sync":
        return [sync_ops(k, num_stages, num_batches, micro_batches, order)
                for k in range(num_stages)]
    return [async_ops(k, num_stages, num_batches, micro_batches)
            for k in range(num_stages)]


def max_stashed(k, num_stages, num_batches):
    """The most mini-batches ever in flight on stage `k` in `async_ops`: `w_k = min(N - k, T)`.

    In flight means from the end of its forward to the end of its backward (its input and,
    when stashing, its weights are kept that long). Raises as `warmup_forwards`."""
    return warmup_forwards(k, num_stages, num_batches)


def max_in_flight(ops):
    """Returns the most micro-batches in flight at once in an op list (any schedule).

    A micro-batch `(i, j)` is in flight from its forward to its backward: the stage keeps
    its input (and, unless it recomputes, its activations) that long. So this is what
    bounds a stage's activation memory: `M` for GPipe, `min(N - k, M)` for 1F1B-flush,
    `min(N - k, T) * M` for `async_ops`.

    Args:
        ops: a sequence of `Op`, one stage's instruction list.

    Returns:
        The largest number of `(batch, micro)` forwarded and not yet backwarded, an int.

    Raises:
        TypeError: if `ops` is not a list of `Op`.
        ValueError: if a forward or backward op repeats, or a backward has no forward
            before it.
    """
    versions_seen(ops)  # validates the list
    live, peak = set(), 0
    for op in ops:
        if op.kind == FORWARD:
            live.add((op.batch, op.micro))
            peak = max(peak, len(live))
        elif op.kind == BACKWARD:
            if (op.batch, op.micro) not in live:
                raise ValueError(f"`ops` runs {op} before its forward.")
            live.remove((op.batch, op.micro))
    return peak


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
        TypeError: if an argument is not an int.
        ValueError: if an argument is out of range.
    """
    checks.check_int("i", i, 0)
    _check_stage(k, num_stages)
    return max(0, i - (num_stages - 1 - k))


def backward_version(i):
    """How many updates a stage has finished before `B(i)` in `async_ops`: `i` (an int >= 0)."""
    return checks.check_int("i", i, 0)


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
        TypeError: if `k` or `num_stages` is not an int.
        ValueError: if an argument is out of range or `target` is unknown.
    """
    _check_stage(k, num_stages)
    checks.check_one_of("target", target, TARGETS)
    ahead = num_stages - 1 - k
    if target == "consistent":
        return ahead, None
    return k // 2 + ahead, k // 2
