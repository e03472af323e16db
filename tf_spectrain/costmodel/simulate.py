"""Timed run of the asynchronous 1F1B schedule with per-stage pass durations (pure Python).

`tf_spectrain.schedule.clock_table` runs the schedule in lock-step slots of equal length;
here every pass takes its own time and hand-offs take time too: `simulate_epoch` gives the
wall-clock length of one epoch, `steady_cycle` the time per mini-batch in steady state.
"""

from tf_spectrain import checks, schedule


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


def simulate_epoch(forward, backward, send_forward, send_backward, num_batches, overlap=False):
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

    Args:
        forward, backward: lists of N per-stage durations (seconds) of one forward and one
            backward pass of a mini-batch, stage 0 first.
        send_forward: N - 1 durations: sending a mini-batch's activations from stage k to
            k + 1.
        send_backward: N - 1 durations: sending the gradients from stage k + 1 to k.
        num_batches: `T`, the mini-batches in the epoch, an int >= 1.
        overlap: whether hand-offs run beside compute (see above).

    Returns:
        The time from the first forward's start to the last backward's end, in seconds.

    Raises:
        TypeError, ValueError: if a list has the wrong length or holds a negative or
            non-numeric duration, or `num_batches` is not an int >= 1.
    """
    forward, backward, send_forward, send_backward = _check_pipeline(
        forward, backward, send_forward, send_backward
    )
    n = len(forward)
    num_batches = checks.check_int(
        "num_batches", num_batches, 1, meaning="mini-batches in the epoch"
    )
    checks.check_bool("overlap", overlap)

    ops = [schedule.async_ops(k, n, num_batches) for k in range(n)]
    ops = [[op for op in stage_ops if op.kind != schedule.UPDATE] for stage_ops in ops]
    arrived_fwd = [dict() for _ in range(n)]  # stage k: batch -> time its input is there
    arrived_bwd = [dict() for _ in range(n)]  # stage k: batch -> time its gradient is there
    link_free_fwd = [0.0] * (n - 1)
    link_free_bwd = [0.0] * (n - 1)
    free = [0.0] * n
    position = [0] * n
    end = 0.0
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for k in range(n):
            while position[k] < len(ops[k]):
                op = ops[k][position[k]]
                i = op.batch
                is_forward = op.kind == schedule.FORWARD
                if is_forward:
                    ready = 0.0 if k == 0 else arrived_fwd[k].get(i)
                    compute, send = forward[k], send_forward[k] if k < n - 1 else None
                else:
                    # On the last stage B(i) follows its own F(i) in the list.
                    ready = 0.0 if k == n - 1 else arrived_bwd[k].get(i)
                    compute, send = backward[k], send_backward[k - 1] if k > 0 else None
                if ready is None:
                    break  # waits for a neighbour; try the other stages
                start = max(free[k], ready)
                done = start + compute
                if send is not None:
                    if overlap:
                        links = link_free_fwd if is_forward else link_free_bwd
                        link = k if is_forward else k - 1
                        arrival = max(done, links[link]) + send
                        links[link] = arrival
                    else:
                        done += send
                        arrival = done
                    if is_forward:
                        arrived_fwd[k + 1][i] = arrival
                    else:
                        arrived_bwd[k - 1][i] = arrival
                free[k] = done
                end = max(end, done)  # every transfer ends before its receiver's pass
                position[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for async_ops; guards against an endless loop
            raise RuntimeError("The schedule deadlocked; this is a bug in simulate_epoch.")
    return end


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
