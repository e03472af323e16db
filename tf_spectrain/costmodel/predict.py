"""Predicted time of one training iteration and images/s (pure Python).

Five ways to train on `hardware.num_gpus` devices (on one host or several), from a
`ModelProfile`:

- `predict_single`: one device runs the whole model on the whole batch.
- `predict_data_parallel`: every device holds the model, runs `batch / n` examples, then a
  ring all-reduce averages all gradients, every step.
- `async_pipeline.predict_pipeline`: one stage per device, the asynchronous
  one-forward-one-backward schedule of SPECTRAIN.md section 3, activations and gradients
  handed between neighbours.
- `async_pipeline.predict_hybrid`: R copies of an N-stage pipeline, each on `batch / R`
  examples; before each update every stage's gradients are all-reduced over its R copies.
- `sync_pipeline.predict_sync`: the synchronous pipeline (`mode="sync"`), which fills and
  drains once per mini-batch of M micro-batches, GPipe or 1F1B-flush (the same time here).

This module holds the first two, the `Estimate` they all return, the checks of the
arguments they share and the pipelines' per-stage passes and hand-offs (`pipeline_times`).

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
from tf_spectrain.costmodel.hardware import Hardware
from tf_spectrain.costmodel.links import link_seconds
from tf_spectrain.costmodel.profile import ModelProfile


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
    """The factor from profiled seconds to seconds on `hardware` for `examples` (unchecked)."""
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
    micro_batches = check_micro_batches(micro_batches)
    stages = profile.stage_costs(cuts)
    check_devices_for(stages, 1, hardware, cuts)
    if devices is None:
        devices = list(range(len(stages)))
    elif not isinstance(devices, (list, tuple)) or len(devices) != len(stages):
        raise ValueError(
            f"`devices` must list one device index per stage ({len(stages)}). "
            f"Received: devices={devices!r}"
        )
    forward, backward = stage_passes(stages, time_scale(profile, hardware, batch_size), recompute)
    send = [
        link_seconds(
            [hardware.link(devices[k], devices[k + 1])], s.output_bytes * batch_size,
            micro_batches,
        )
        for k, s in enumerate(stages[:-1])
    ]
    return forward, backward, send


def check_micro_batches(micro_batches):
    """`micro_batches` as an int >= 1 (micro-batches per mini-batch)."""
    return checks.check_int(
        "micro_batches", micro_batches, 1, meaning="micro-batches per mini-batch"
    )


def stage_passes(stages, scale, recompute):
    """Forward and backward seconds of each stage (see `pipeline_times`)."""
    last = len(stages) - 1
    forward = [s.forward_time * scale for s in stages]
    backward = [
        s.backward_time * scale
        + (forward[k] if recompute == "always" or (recompute and k < last) else 0.0)
        for k, s in enumerate(stages)
    ]
    return forward, backward


def check_devices_for(stages, replicas, hardware, cuts):
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
