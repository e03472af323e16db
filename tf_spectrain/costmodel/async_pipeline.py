"""Predicted speed of the asynchronous pipeline (1F1B), alone or in R data-parallel copies.

- `predict_pipeline`: one stage per device, the asynchronous one-forward-one-backward
  schedule of SPECTRAIN.md section 3, activations and gradients handed between neighbours.
- `predict_hybrid`: R copies of an N-stage pipeline, each on `batch / R` examples; before
  each update every stage's gradients are all-reduced over its R copies.

Both time the schedule itself with `simulate` (the steady cycle, or an epoch with its fill
and drain) from the stages' passes and hand-offs (`predict.pipeline_times`). Pure Python;
docs/COSTMODEL.md gives the equations.
"""

from tf_spectrain import checks
from tf_spectrain.costmodel import simulate
from tf_spectrain.costmodel.links import link_seconds
from tf_spectrain.costmodel.predict import (
    Estimate,
    check_arguments,
    check_devices_for,
    check_micro_batches,
    check_recompute_flag,
    pipeline_times,
    stage_passes,
    time_scale,
)
from tf_spectrain.costmodel.runtime_costs import runtime_floor


def predict_pipeline(
    profile, hardware, batch_size, cuts, num_batches=None, overlap=False, recompute=False,
    micro_batches=1, runtime=None, window=None, call_seconds=0.0,
):
    """Predicts the asynchronous pipeline (1F1B), one stage per device.

    In steady state a mini-batch takes `simulate.steady_cycle`: without overlap (the
    default) the busiest stage's `forward + backward + sends`, where a stage sends its
    activations forward and its input gradients back, `latency + bytes / bandwidth` each.
    With `num_batches = T`, the epoch (fill and drain included) is timed by
    `simulate.simulate_epoch` over the real schedule. When fewer than N devices can
    compute at once (`hardware.concurrency < N`), no mini-batch can take less than the
    total compute divided by the concurrency. Stage k is on device k: on several hosts,
    host 0's devices first, and the hops between hosts take the inter-host link.

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware` with at least `len(cuts) + 1` devices.
        batch_size: examples per mini-batch, an int >= 1 (not split: each stage runs it
            whole).
        cuts: layer names or positions, each ending a stage (see
            `ModelProfile.cut_positions`); `best_cuts` chooses good ones.
        num_batches: None for the steady state, or `T` (an int >= 1) to include the fill
            and drain of an epoch of `T` mini-batches.
        overlap: whether hand-offs run beside compute (see `simulate`).
        recompute: which backwards recompute their stage's forward: False, True (all
            but the last stage's) or "always" (see `pipeline_times`).
        micro_batches: `M`, an int >= 1: each mini-batch's passes run as M micro-batches
            back to back (the same compute) and each hand-off pays the latency M times.
        runtime: the runtime's fixed host cost per mini-batch, a
            `runtime_costs.RuntimeCosts` (e.g. `WINDOWS`), or None for none: no
            mini-batch takes less than its `floor` (stages on hosts other than host 0,
            the trainer's, count as remote).
        window: None, or `K`: the epoch of `num_batches` runs in the runtime's windows of
            K mini-batches, one graph call each (`simulate.simulate_epoch`'s `window`: a
            window starts when the one before has ended; a forward's intermediates cross
            windows, so a window boundary recomputes nothing).
        call_seconds: with `window`, what each window's graph call costs before its
            passes start (seconds >= 0; across hosts, the round trips of a call).

    Returns:
        An `Estimate` of kind `"pipeline"`.

    Raises:
        TypeError, ValueError: for invalid arguments or more stages than devices.
    """
    forward, backward, send = pipeline_times(
        profile, hardware, batch_size, cuts, recompute, micro_batches=micro_batches
    )
    floor = max(sum(forward + backward) / hardware.concurrency,
                runtime_floor(runtime, hardware, range(len(forward)), len(profile)))
    windows = None
    if window is not None:
        if num_batches is None:
            raise ValueError("`window` needs `num_batches` (the epoch the windows cut). "
                             f"Received: window={window!r}, num_batches=None")
        # A forward whose backward comes in a later window hands its intermediates on
        # (`runtime.split_pass`): no window recomputes what the schedule does not.
        windows = dict(window=window, call_seconds=call_seconds)
    return _schedule_estimate(
        "pipeline", batch_size, forward, backward, send, [0.0] * len(forward), floor,
        num_batches, overlap, windows,
    )


def predict_hybrid(
    profile, hardware, batch_size, cuts, replicas, num_batches=None, overlap=False,
    recompute=False, micro_batches=1, runtime=None,
):
    """Predicts R data-parallel copies of the asynchronous N-stage pipeline.

    Replica r's stage k is on device `r * N + k` (on several hosts, host 0's devices
    first). Each mini-batch is split evenly: every replica's pipeline runs `batch / R`
    examples, with the passes and hand-offs of `predict_pipeline` at that batch (the R
    copies of a hand-off run at the same time; the slowest paces them). Before each
    update, stage k's gradients (its weights' bytes `W_k`) are all-reduced over its R
    copies by a ring over devices `k, N + k, ..., (R - 1) N + k` (`Hardware.allreduce_time`,
    paced by its slowest hop, the inter-host one when the replicas are on different
    hosts); the N stages reduce at the same time, each over its own devices' links
    (sharing a host's network cards only with `Hardware.nics_per_host`). The stage is
    busy until its reduction ends, so `A_k` adds to its backward, and the schedule is
    the pipeline's (`simulate.steady_cycle`, `simulate.simulate_epoch`).

    When fewer devices can compute at once than there are (`concurrency < R * N`), a
    mini-batch takes at least `R * sum_k (F_k + B_k) / concurrency + min_k A_k`: the
    replicas' compute shares the devices, and the shortest reduction is assumed to find
    no other work to fill it (exact for N = 1, where every replica reduces at once).

    `replicas=1` is `predict_pipeline` (with kind `"hybrid"`); one stage (`cuts=[]`) is
    `predict_data_parallel` over R devices without overlap.

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware` with at least `replicas * (len(cuts) + 1)` devices.
        batch_size: the global mini-batch, an int >= 1 (fractional per-replica batches
            are fine: times scale linearly).
        cuts: layer names or positions, each ending a stage (`best_cuts(...,
            replicas=R)` chooses good ones).
        replicas: `R`, an int >= 1.
        num_batches, overlap, recompute, micro_batches: as `predict_pipeline`
            (`overlap` concerns the hand-offs; the all-reduce never overlaps compute).
        runtime: as `predict_pipeline`; the floor counts every replica's stages.

    Returns:
        An `Estimate` of kind `"hybrid"`; `communication_seconds` is the bounding stage's
        hand-offs plus its all-reduce.

    Raises:
        TypeError, ValueError: for invalid arguments or more stages x replicas than
            devices.
    """
    batch_size = check_arguments(profile, hardware, batch_size)
    replicas = checks.check_int("replicas", replicas, 1, meaning="copies of the pipeline")
    recompute = check_recompute_flag(recompute)
    micro_batches = check_micro_batches(micro_batches)
    stages = profile.stage_costs(cuts)
    check_devices_for(stages, replicas, hardware, cuts)
    n = len(stages)
    examples = batch_size / replicas
    forward, backward = stage_passes(stages, time_scale(profile, hardware, examples), recompute)
    send = []
    for k, s in enumerate(stages[:-1]):
        links = hardware.links([(r * n + k, r * n + k + 1) for r in range(replicas)])
        send.append(link_seconds(links, s.output_bytes * examples, micro_batches))
    allreduce = hardware.allreduce_times(
        [(s.weight_bytes, [r * n + k for r in range(replicas)]) for k, s in enumerate(stages)]
    )
    floor = replicas * sum(forward + backward) / hardware.concurrency + min(allreduce)
    floor = max(floor, runtime_floor(runtime, hardware, range(replicas * n),
                                     replicas * len(profile)))
    return _schedule_estimate(
        "hybrid", batch_size, forward, backward, send, allreduce, floor, num_batches, overlap
    )


def _schedule_estimate(
    kind, batch_size, forward, backward, send, allreduce, floor, num_batches, overlap,
    windows=None,
):
    """The `Estimate` of the 1F1B schedule with these durations (see `predict_hybrid`);
    `windows`: `simulate_epoch`'s window arguments, or None."""
    checks.check_bool("overlap", overlap)
    n = len(forward)
    busy = [b + a for b, a in zip(backward, allreduce)]  # a stage reduces, then updates
    # The bounding stage, as it appears without overlap, names the compute/communication split.
    sends = [(send[k] if k < n - 1 else 0.0) + (send[k - 1] if k > 0 else 0.0) for k in range(n)]
    busiest = max(range(n), key=lambda k: forward[k] + busy[k] + sends[k])
    cycle = max(simulate.steady_cycle(forward, busy, send, send, overlap), floor)
    epoch = None
    seconds = cycle
    if num_batches is not None:
        num_batches = checks.check_int(
            "num_batches", num_batches, 1, meaning="mini-batches per epoch"
        )
        epoch = simulate.simulate_epoch(forward, busy, send, send, num_batches, overlap,
                                        **(windows or {}))
        epoch = max(epoch, num_batches * floor)
        seconds = epoch / num_batches
    return Estimate(
        kind,
        batch_size,
        seconds,
        forward[busiest] + backward[busiest],
        sends[busiest] + allreduce[busiest],
        epoch,
    )
