"""Timed run of the asynchronous 1F1B schedule with per-stage pass durations (pure Python).

`tf_spectrain.schedule.clock_table` runs the schedule in lock-step slots of equal length;
here every pass takes its own time and hand-offs take time too: `simulate_epoch` gives the
wall-clock length of one epoch, `steady_cycle` the time per mini-batch in steady state.
"""

from tf_spectrain import checks, schedule
from tf_spectrain.schedule.windows import EpochWindows


def _check_times(name, values, length):
    """`values` as `length` durations in seconds (floats >= 0)."""
    checks.check_instance(name, values, (list, tuple), " of durations in seconds")
    if len(values) != length:
        raise ValueError(
            f"`{name}` must be a list of {length} durations in seconds. "
            f"Received: {name}={values!r}"
        )
    return [
        checks.check_number(f"{name}[{k}]", v, 0.0, meaning="seconds") for k, v in enumerate(values)
    ]


def _check_pipeline(forward, backward, send_forward, send_backward):
    """Checks the four duration lists of an N-stage pipeline; returns them as float lists."""
    checks.check_instance("forward", forward, (list, tuple), " of per-stage durations")
    if not forward:
        raise ValueError(
            f"`forward` must be a non-empty list of per-stage durations. Received: {forward!r}"
        )
    n = len(forward)
    return (
        _check_times("forward", forward, n),
        _check_times("backward", backward, n),
        _check_times("send_forward", send_forward, n - 1),
        _check_times("send_backward", send_backward, n - 1),
    )


def simulate_epoch(forward, backward, send_forward, send_backward, num_batches, overlap=False,
                   window=None, call_seconds=0.0, carried_forward=None):
    """Returns the seconds one epoch of the asynchronous schedule takes, drained.

    Each stage walks `schedule.async_ops(k, N, T)` in order and starts a pass as soon as the
    stage is free and the pass's input has arrived: `F(i)` on stage k > 0 needs the
    activation of `F(i)` from stage k - 1; `B(i)` on stage k < N - 1 needs the gradient of
    `B(i)` from stage k + 1 (on the last stage, its own `F(i)` came before it in its list).
    Updates take no time of their own (count them into the backward time).

    Two models of a hand-off (`overlap`):

    - `False`: the sender is busy while it sends, so a stage's forward takes
      `forward + send_forward` and its backward `backward + send_backward`; the receiver
      gets the data when the sender's pass ends.
    - `True`: sending runs beside compute on a link of its own (copy engines, full
      duplex): a transfer starts when the pass ends and its link direction is free, one
      transfer after another, and arrives `send` seconds later.

    With `window=K` the epoch runs as the runtime's windows (`schedule.windows.EpochWindows`,
    one graph call each, SPECTRAIN.md section 3a): a window's passes start once the
    previous window has ended and `call_seconds` more have passed; a value handed to a pass
    of a later window leaves at that window's start (it waits on its device); and a
    backward whose forward ran in an earlier window takes `carried_forward[k]` more (the
    recomputed forward). Without `window` the epoch is one window and those do not occur.

    Args:
        forward, backward: lists of N per-stage durations (seconds) of one forward and one
            backward pass of a mini-batch, stage 0 first.
        send_forward: N - 1 durations: sending a mini-batch's activations from stage k to
            k + 1.
        send_backward: N - 1 durations: sending the gradients from stage k + 1 to k.
        num_batches: `T`, the mini-batches in the epoch, an int >= 1.
        overlap: whether hand-offs run beside compute (see above).
        window: None, or `K` (an int >= 1), the mini-batches each graph call reports.
        call_seconds: seconds each window's call costs before its passes start, >= 0.
        carried_forward: None, or N durations: what stage k's backward adds when its
            forward ran in an earlier window (0 where the backward already recomputes).

    Returns:
        The time from the first call to the last backward's end, in seconds.

    Raises:
        TypeError, ValueError: if a list has the wrong length or holds a negative or
            non-numeric duration, or `num_batches` or `window` is not an int >= 1.
    """
    forward, backward, send_forward, send_backward = _check_pipeline(
        forward, backward, send_forward, send_backward
    )
    n = len(forward)
    num_batches = checks.check_int(
        "num_batches", num_batches, 1, meaning="mini-batches in the epoch"
    )
    checks.check_bool("overlap", overlap)
    call_seconds = checks.check_number("call_seconds", call_seconds, 0.0, meaning="seconds")
    carried = [0.0] * n if carried_forward is None else _check_times(
        "carried_forward", carried_forward, n)

    def lists_for(t):
        return [schedule.async_ops(k, n, t) for k in range(n)]

    if window is None:
        programs = [lists_for(num_batches)]
    else:
        window = checks.check_int("window", window, 1, meaning="mini-batches per graph call")
        programs = [[[op for s, op in w.program if s == k] for k in range(n)]
                    for w in EpochWindows(lists_for, num_batches, window, n - 1)]
    run = _Run(forward, backward, send_forward, send_backward, overlap, carried, programs)
    end = 0.0
    for w in range(len(programs)):
        end = run.window(w, end + call_seconds)
    return end


class _Run:
    """The event loop of `simulate_epoch`, one window at a time."""

    def __init__(self, forward, backward, send_forward, send_backward, overlap, carried,
                 programs):
        self.forward, self.backward, self.overlap, self.carried = (
            forward, backward, overlap, carried)
        self.send = {schedule.FORWARD: send_forward, schedule.BACKWARD: send_backward}
        self.programs = [[[op for op in ops if op.kind != schedule.UPDATE] for ops in stages]
                         for stages in programs]
        self.where = {(k, op.kind, op.batch): w for w, stages in enumerate(self.programs)
                      for k, ops in enumerate(stages) for op in ops}

    def _source(self, k, op):
        """The stage whose pass `op` of stage k waits for, or None (stage 0's forwards;
        the last stage's backwards follow its own forwards)."""
        if op.kind == schedule.FORWARD:
            return k - 1 if k > 0 else None
        return k + 1 if k < len(self.forward) - 1 else None

    def window(self, w, start):
        """Runs window w from `start`; returns when its last pass ends."""
        n = len(self.forward)
        free = [start] * n
        links = {schedule.FORWARD: [start] * (n - 1), schedule.BACKWARD: [start] * (n - 1)}
        arrived = {}  # (stage, kind, batch) -> when the pass's input is there
        stages = self.programs[w]
        for k, ops in enumerate(stages):  # values from earlier windows leave at the start
            for op in ops:
                source = self._source(k, op)
                if source is not None and self.where[(source, op.kind, op.batch)] < w:
                    arrived[(k, op.kind, op.batch)] = self._hand_off(
                        free, links, source, op.kind, start)
        position = [0] * n
        end = start
        remaining = sum(len(ops) for ops in stages)
        while remaining:
            progressed = False
            for k in range(n):
                while position[k] < len(stages[k]):
                    op = stages[k][position[k]]
                    source = self._source(k, op)
                    ready = start if source is None else arrived.get((k, op.kind, op.batch))
                    if ready is None:
                        break  # waits for a neighbour; try the other stages
                    done = self._compute(k, op, w, max(free[k], ready))
                    free[k] = done
                    target = k + 1 if op.kind == schedule.FORWARD else k - 1
                    if 0 <= target < n and self.where.get((target, op.kind, op.batch)) == w:
                        arrived[(target, op.kind, op.batch)] = self._hand_off(
                            free, links, k, op.kind, done)
                    end = max(end, free[k])  # every transfer ends before its receiver's pass
                    position[k] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:  # cannot happen for async_ops; guards against an endless loop
                raise RuntimeError("The schedule deadlocked; this is a bug in simulate_epoch.")
        return end

    def _compute(self, k, op, w, begin):
        """When stage k's pass `op` of window w, begun at `begin`, ends."""
        if op.kind == schedule.FORWARD:
            return begin + self.forward[k]
        recomputed = self.where[(k, schedule.FORWARD, op.batch)] < w
        return begin + self.backward[k] + (self.carried[k] if recomputed else 0.0)

    def _hand_off(self, free, links, k, kind, ready):
        """Stage k sends its `kind` pass's output once `ready`; returns its arrival."""
        link = k if kind == schedule.FORWARD else k - 1
        seconds = self.send[kind][link]
        if self.overlap:
            links[kind][link] = max(ready, links[kind][link]) + seconds
            return links[kind][link]
        free[k] = max(free[k], ready) + seconds  # the sender is busy while it sends
        return free[k]


def steady_cycle(forward, backward, send_forward, send_backward, overlap=False):
    """Returns the seconds per mini-batch of the asynchronous schedule in steady state.

    The schedule is a max-plus system, so in the long run every mini-batch takes the
    largest mean, over the circuits of its dependency graph, of duration per mini-batch:

    - `overlap=False`: the busiest stage, `max_k(forward[k] + backward[k] + sends of k)`,
      where stage k sends its activations forward and its input gradients back. Circuits
      through several stages average their stages, so they never take longer.
    - `overlap=True`: the largest of (a) a stage's `forward + backward`; (b) one transfer
      on a link direction (a link carries one per mini-batch); (c) for stages `k..m`,
      their forwards and backwards plus the transfers between them, divided by
      `m - k + 1`, the mini-batches in flight on that stretch: with only `N - k`
      mini-batches in flight, slow links are not hidden completely.

    `simulate_epoch(...) / T` tends to this value as `T` grows.

    Args:
        forward, backward, send_forward, send_backward, overlap: as `simulate_epoch`.

    Returns:
        Seconds per mini-batch.

    Raises:
        TypeError, ValueError: as `simulate_epoch`.
    """
    forward, backward, send_forward, send_backward = _check_pipeline(
        forward, backward, send_forward, send_backward
    )
    n = len(forward)
    checks.check_bool("overlap", overlap)
    compute = [f + b for f, b in zip(forward, backward)]
    if not overlap:
        return max(
            compute[k]
            + (send_forward[k] if k < n - 1 else 0.0)
            + (send_backward[k - 1] if k > 0 else 0.0)
            for k in range(n)
        )
    cycle = max(compute + send_forward + send_backward)
    for k in range(n):
        total = 0.0
        for m in range(k, n):
            total += compute[m] + (send_forward[m - 1] + send_backward[m - 1] if m > k else 0.0)
            cycle = max(cycle, total / (m - k + 1))
    return cycle
