"""Predicted time of one training iteration and images/s (pure Python).

Five ways to train on `hardware.num_gpus` devices (on one host or several), from a
`ModelProfile`:

- `predict_single`: one device runs the whole model on the whole batch.
- `predict_data_parallel`: every device holds the model, runs `batch / n` examples, then a
  ring all-reduce averages all gradients, every step.
- `predict_pipeline`: one stage per device, the asynchronous one-forward-one-backward
  schedule of SPECTRAIN.md section 3, activations and gradients handed between neighbours.
- `predict_hybrid`: R copies of an N-stage pipeline, each on `batch / R` examples; before
  each update every stage's gradients are all-reduced over its R copies.
- `predict_sync`: the synchronous pipeline (`mode="sync"`), which fills and drains once
  per mini-batch of M micro-batches, GPipe or 1F1B-flush (the same time here).

With `micro_batches = M` every hand-off pays the latency once per micro-batch; with
`recompute` stages add their forward to their backward.

Profiled times scale linearly with the batch size and divide by `relative_speed`. Weight
updates, the cost of predicting weights (`W + s * m`) and data loading are left out; the
runtime's fixed host cost per mini-batch (`runtime_costs.RuntimeCosts`, measured) bounds a
mini-batch from below when given (`runtime=`). See docs/COSTMODEL.md for the equations and
their assumptions.
"""

import dataclasses

from tf_spectrain import checks
from tf_spectrain.costmodel import simulate
from tf_spectrain.costmodel.hardware import Hardware, link_seconds
from tf_spectrain.costmodel.profile import ModelProfile
from tf_spectrain.costmodel.runtime_costs import runtime_floor
from tf_spectrain.costmodel.stage_terms import SCHEDULES


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A predicted training speed.

    Attributes:
        kind: `"single"`, `"data_parallel"`, `"pipeline"`, `"hybrid"` or `"sync"`.
        batch_size: examples per mini-batch (the global batch).
        seconds_per_batch: predicted wall time per mini-batch; for a pipeline with
            `num_batches`, the epoch's time (fill and drain included) divided by it.
        compute_seconds: compute per mini-batch on the busiest device (for a pipeline,
            the stage that bounds the steady state).
        communication_seconds: transfers per mini-batch: the all-reduce for data
            parallelism, the bounding stage's sends for a pipeline (and its all-reduce
            over the replicas for a hybrid), 0 for one device.
        epoch_seconds: for a pipeline with `num_batches`, the time of that epoch; else None.
    """

    kind: str
    batch_size: int
    seconds_per_batch: float
    compute_seconds: float
    communication_seconds: float
    epoch_seconds: float = None

    @property
    def images_per_second(self):
        """Training examples per second: `batch_size / seconds_per_batch`."""
        return self.batch_size / self.seconds_per_batch


def check_arguments(profile, hardware, batch_size):
    """Checks the arguments every prediction takes.

    Args:
        profile: should be a `ModelProfile`.
        hardware: should be a `Hardware`.
        batch_size: should be an int >= 1 (examples per mini-batch).

    Returns:
        `batch_size` as an int.

    Raises:
        TypeError: if `profile` is not a `ModelProfile`, `hardware` not a `Hardware` or
            `batch_size` not an int.
        ValueError: if `batch_size` is smaller than 1.
    """
    checks.check_instance("profile", profile, ModelProfile, " (see profile_model)")
    checks.check_instance("hardware", hardware, Hardware, " (e.g. costmodel.PCIE3_X16)")
    return checks.check_int("batch_size", batch_size, 1, meaning="examples per mini-batch")


def check_recompute_flag(recompute):
    """Checks which stages recompute their forward in a prediction.

    Args:
        recompute: False (none), True (every stage but the last: what `vanilla` and paper
            `spectrain` do with `PipelineModel(recompute="auto")`) or "always" (every
            stage, the last included: `recompute="always"`).

    Returns:
        `recompute` (a Python bool, or "always").

    Raises:
        TypeError: for anything else.
    """
    if isinstance(recompute, str) and recompute == "always":
        return recompute
    try:
        return checks.check_bool("recompute", recompute)
    except TypeError:
        raise TypeError(
            "`recompute` must be True, False or 'always'. "
            + checks.received("recompute", recompute)
        ) from None


def time_scale(profile, hardware, examples):
    """Gives the factor from profiled seconds to seconds on `hardware` for `examples` examples.

    The arguments are not checked: callers pass what `check_arguments` accepted.

    Args:
        profile: a `ModelProfile` (its `batch_size` is the profiled batch).
        hardware: a `Hardware` (its `relative_speed` divides the times).
        examples: the examples to time (a number; fractions are fine).

    Returns:
        `examples / profile.batch_size / hardware.relative_speed`.
    """
    return examples / profile.batch_size / hardware.relative_speed


def predict_single(profile, hardware, batch_size):
    """Predicts training on one device: `(forward + backward) * batch / profiled batch / speed`.

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware`; only its `relative_speed` is used.
        batch_size: examples per mini-batch, an int >= 1.

    Returns:
        An `Estimate` of kind `"single"`.

    Raises:
        TypeError, ValueError: for invalid arguments.
    """
    batch_size = check_arguments(profile, hardware, batch_size)
    scale = time_scale(profile, hardware, batch_size)
    compute = (profile.forward_time + profile.backward_time) * scale
    return Estimate("single", batch_size, compute, compute, 0.0)


def predict_data_parallel(profile, hardware, batch_size, overlap=False):
    """Predicts data parallelism with a ring all-reduce of all gradients every step.

    With `n = hardware.num_gpus`, each device computes `batch / n` examples, taking
    `F` forward and `B` backward seconds (stretched by `n / concurrency` when fewer than
    `n` devices can compute at once); the all-reduce takes
    `A = 2 (n - 1) / n * weight_bytes / bandwidth + 2 (n - 1) * latency`. An iteration is

    - `F + B + A` without overlap (the default: the all-reduce starts after the whole
      backward, as with one gradient all-reduce per step);
    - `F + max(B, A)` with `overlap=True` (gradients are reduced in buckets while the
      backward still runs, the best case of bucketed all-reduce).

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware`.
        batch_size: the global batch, an int >= 1 (it need not divide by `n`: the model
            scales times linearly, so fractional per-device batches are fine).
        overlap: whether the all-reduce overlaps the backward pass.

    Returns:
        An `Estimate` of kind `"data_parallel"`.

    Raises:
        TypeError, ValueError: for invalid arguments.
    """
    batch_size = check_arguments(profile, hardware, batch_size)
    checks.check_bool("overlap", overlap)
    n = hardware.num_gpus
    scale = time_scale(profile, hardware, batch_size / n) * max(1.0, n / hardware.concurrency)
    forward = profile.forward_time * scale
    backward = profile.backward_time * scale
    allreduce = hardware.allreduce_time(profile.weight_bytes, n)
    seconds = forward + (max(backward, allreduce) if overlap else backward + allreduce)
    return Estimate("data_parallel", batch_size, seconds, forward + backward, allreduce)


def pipeline_times(
    profile, hardware, batch_size, cuts, recompute=False, devices=None, micro_batches=1
):
    """Per-stage pass and hand-off durations of a pipeline, in seconds per mini-batch.

    Args:
        profile, hardware, batch_size: as `predict_pipeline`.
        cuts: layer names or positions ending each stage but the last.
        recompute: True adds each stage's forward to its backward, except on the last
            stage (activation recomputation: what `vanilla` and `spectrain` with the
            paper's target do on stages whose backward uses other weights than their
            forward); "always" on every stage; False on none.
        devices: the stages' device indices, stage 0 first; None means `0 .. N - 1`
            (host 0's devices first). A hand-off between devices of different hosts
            takes the inter-host link.
        micro_batches: `M`, an int >= 1: a mini-batch's hand-off is M transfers, each
            paying the link's latency.

    Returns:
        A tuple `(forward, backward, send)` of lists: N forward and N backward durations
        and N - 1 transfer durations, `send[k]` between stage k and k + 1 (activations one
        way, their gradients, of the same size, the other way).

    Raises:
        TypeError, ValueError: for invalid arguments or more stages than devices.
    """
    batch_size = check_arguments(profile, hardware, batch_size)
    recompute = check_recompute_flag(recompute)
    micro_batches = _check_micro_batches(micro_batches)
    stages = profile.stage_costs(cuts)
    _check_devices_for(stages, 1, hardware, cuts)
    if devices is None:
        devices = list(range(len(stages)))
    elif not isinstance(devices, (list, tuple)) or len(devices) != len(stages):
        raise ValueError(
            f"`devices` must list one device index per stage ({len(stages)}). "
            f"Received: devices={devices!r}"
        )
    forward, backward = _passes(stages, time_scale(profile, hardware, batch_size), recompute)
    send = [
        link_seconds(
            [hardware.link(devices[k], devices[k + 1])], s.output_bytes * batch_size,
            micro_batches,
        )
        for k, s in enumerate(stages[:-1])
    ]
    return forward, backward, send


def _check_micro_batches(micro_batches):
    return checks.check_int(
        "micro_batches", micro_batches, 1, meaning="micro-batches per mini-batch"
    )


def _passes(stages, scale, recompute):
    """Forward and backward seconds of each stage (see `pipeline_times`)."""
    last = len(stages) - 1
    forward = [s.forward_time * scale for s in stages]
    backward = [
        s.backward_time * scale
        + (forward[k] if recompute == "always" or (recompute and k < last) else 0.0)
        for k, s in enumerate(stages)
    ]
    return forward, backward


def _check_devices_for(stages, replicas, hardware, cuts):
    """Refuses more stages times replicas than devices."""
    needed = len(stages) * replicas
    if needed > hardware.num_gpus:
        copies = f" x {replicas} replicas" if replicas > 1 else ""
        raise ValueError(
            f"A pipeline needs one device per stage{' and replica' if replicas > 1 else ''}: "
            f"{len(stages)} stages (cuts={list(cuts)}){copies} but hardware.num_gpus="
            f"{hardware.num_gpus}. Use at most {hardware.num_gpus // replicas - 1} cuts"
            f"{', fewer replicas' if replicas > 1 else ''} or more devices."
        )


def predict_pipeline(
    profile, hardware, batch_size, cuts, num_batches=None, overlap=False, recompute=False,
    micro_batches=1, runtime=None,
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
    return _schedule_estimate(
        "pipeline", batch_size, forward, backward, send, [0.0] * len(forward), floor,
        num_batches, overlap,
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
    micro_batches = _check_micro_batches(micro_batches)
    stages = profile.stage_costs(cuts)
    _check_devices_for(stages, replicas, hardware, cuts)
    n = len(stages)
    examples = batch_size / replicas
    forward, backward = _passes(stages, time_scale(profile, hardware, examples), recompute)
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


def predict_sync(
    profile, hardware, batch_size, cuts, micro_batches=1, schedule="gpipe", recompute=False,
    num_batches=None, runtime=None,
):
    """Predicts the synchronous pipeline (`mode="sync"`), one stage per device.

    Each mini-batch runs as `M` micro-batches of `batch / M` examples that fill the
    pipeline and drain it before the one update, so mini-batches never overlap. A
    micro-batch's forward on stage k takes `p_k = (F_k + S_k) / M` (its share of the
    stage's forward and of sending the activations on, the sender busy while it sends)
    and its backward `q_k = (B_k + G_k) / M` (with the recomputed forward, if any, and
    sending the input gradients back). Every forward precedes every backward on the last
    stage, so a mini-batch takes the two phases' fill, steady flow and drain:

        sum_k p_k + (M - 1) * max_k p_k  +  sum_k q_k + (M - 1) * max_k q_k

    With N equal stages that is `(M + N - 1) / M` times one stage's work: the bubble
    `(N - 1) / (M + N - 1)`. `schedule="1f1b"` (1F1B-flush) interleaves each stage's
    passes differently but is timed the same (the same `2 (M + N - 1)` lock-step slots);
    it differs in memory (`stage_terms.StageTerms`). When fewer devices can compute at
    once than there are stages, no mini-batch takes less than the total compute divided
    by `hardware.concurrency`.

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware` with at least `len(cuts) + 1` devices.
        batch_size: examples per mini-batch, an int >= 1.
        cuts: layer names or positions, each ending a stage.
        micro_batches: `M`, an int >= 1; each hand-off pays the latency M times.
        schedule: one of `stage_terms.SCHEDULES`, "gpipe" or "1f1b".
        recompute: which stages recompute their forward in their backward: False (sync's
            `recompute="auto"`), "always" (every stage) or True (every stage but the
            last); see `pipeline_times`.
        num_batches: None, or `T` (an int >= 1) for an epoch of T mini-batches, T times
            one mini-batch.
        runtime: as `predict_pipeline`.

    Returns:
        An `Estimate` of kind `"sync"`.

    Raises:
        TypeError, ValueError: for invalid arguments or more stages than devices.
    """
    checks.check_one_of("schedule", schedule, SCHEDULES)
    forward, backward, send = pipeline_times(
        profile, hardware, batch_size, cuts, recompute, micro_batches=micro_batches
    )
    m, n = _check_micro_batches(micro_batches), len(forward)
    ahead = [forward[k] + (send[k] if k < n - 1 else 0.0) for k in range(n)]
    back = [backward[k] + (send[k - 1] if k > 0 else 0.0) for k in range(n)]
    seconds = sum(
        (sum(phase) + (m - 1) * max(phase)) / m for phase in (ahead, back)
    )
    seconds = max(seconds, sum(forward + backward) / hardware.concurrency,
                  runtime_floor(runtime, hardware, range(n), len(profile)))
    busiest = max(range(n), key=lambda k: ahead[k] + back[k])
    epoch = None
    if num_batches is not None:
        num_batches = checks.check_int(
            "num_batches", num_batches, 1, meaning="mini-batches per epoch"
        )
        epoch = num_batches * seconds
    return Estimate(
        "sync",
        batch_size,
        seconds,
        forward[busiest] + backward[busiest],
        ahead[busiest] + back[busiest] - forward[busiest] - backward[busiest],
        epoch,
    )


def _schedule_estimate(
    kind, batch_size, forward, backward, send, allreduce, floor, num_batches, overlap
):
    """The `Estimate` of the 1F1B schedule with these durations (see `predict_hybrid`)."""
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
        epoch = simulate.simulate_epoch(forward, busy, send, send, num_batches, overlap)
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
