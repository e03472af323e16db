"""Predicted time of one training iteration and images/s (pure Python).

Three ways to train on `hardware.num_gpus` devices, from a `ModelProfile`:

- `predict_single`: one device runs the whole model on the whole batch.
- `predict_data_parallel`: every device holds the model, runs `batch / n` examples, then a
  ring all-reduce averages all gradients, every step.
- `predict_pipeline`: one stage per device, the asynchronous one-forward-one-backward
  schedule of SPECTRAIN.md section 3, activations and gradients handed between neighbours.

Profiled times scale linearly with the batch size and divide by `relative_speed`. Weight
updates, the cost of predicting weights (`W + s * m`), data loading and framework overhead
per pass are left out. See docs/COSTMODEL.md for the equations and their assumptions.
"""

import dataclasses

from tf_spectrain import checks
from tf_spectrain.costmodel import simulate
from tf_spectrain.costmodel.hardware import Hardware
from tf_spectrain.costmodel.profile import ModelProfile


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A predicted training speed.

    Attributes:
        kind: `"single"`, `"data_parallel"` or `"pipeline"`.
        batch_size: examples per mini-batch (the global batch).
        seconds_per_batch: predicted wall time per mini-batch; for a pipeline with
            `num_batches`, the epoch's time (fill and drain included) divided by it.
        compute_seconds: compute per mini-batch on the busiest device (for a pipeline,
            the stage that bounds the steady state).
        communication_seconds: transfers per mini-batch: the all-reduce for data
            parallelism, the bounding stage's sends for a pipeline, 0 for one device.
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


def pipeline_times(profile, hardware, batch_size, cuts, recompute=False):
    """Per-stage pass and hand-off durations of a pipeline, in seconds per mini-batch.

    Args:
        profile, hardware, batch_size: as `predict_pipeline`.
        cuts: layer names or positions ending each stage but the last.
        recompute: add each stage's forward to its backward, except on the last stage
            (activation recomputation: what `spectrain` with the paper's target does on
            stages whose backward uses other weights than their forward).

    Returns:
        A tuple `(forward, backward, send)` of lists: N forward and N backward durations
        and N - 1 transfer durations, `send[k]` between stage k and k + 1 (activations one
        way, their gradients, of the same size, the other way).

    Raises:
        TypeError, ValueError: for invalid arguments or more stages than devices.
    """
    batch_size = check_arguments(profile, hardware, batch_size)
    checks.check_bool("recompute", recompute)
    stages = profile.stage_costs(cuts)
    if len(stages) > hardware.num_gpus:
        raise ValueError(
            f"A pipeline needs one device per stage: {len(stages)} stages (cuts={list(cuts)}) "
            f"but hardware.num_gpus={hardware.num_gpus}. Use at most "
            f"{hardware.num_gpus - 1} cuts or more devices."
        )
    scale = time_scale(profile, hardware, batch_size)
    last = len(stages) - 1
    forward = [s.forward_time * scale for s in stages]
    backward = [
        s.backward_time * scale + (forward[k] if recompute and k < last else 0.0)
        for k, s in enumerate(stages)
    ]
    send = [hardware.transfer_time(s.output_bytes * batch_size) for s in stages[:-1]]
    return forward, backward, send


def predict_pipeline(
    profile, hardware, batch_size, cuts, num_batches=None, overlap=False, recompute=False
):
    """Predicts the asynchronous pipeline (1F1B), one stage per device.

    In steady state a mini-batch takes `simulate.steady_cycle`: without overlap (the
    default) the busiest stage's `forward + backward + sends`, where a stage sends its
    activations forward and its input gradients back, `latency + bytes / bandwidth` each.
    With `num_batches = T`, the epoch (fill and drain included) is timed by
    `simulate.simulate_epoch` over the real schedule. When fewer than N devices can
    compute at once (`hardware.concurrency < N`), no mini-batch can take less than the
    total compute divided by the concurrency.

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
        recompute: whether backwards recompute their stage's forward (see
            `pipeline_times`).

    Returns:
        An `Estimate` of kind `"pipeline"`.

    Raises:
        TypeError, ValueError: for invalid arguments or more stages than devices.
    """
    forward, backward, send = pipeline_times(profile, hardware, batch_size, cuts, recompute)
    checks.check_bool("overlap", overlap)
    n = len(forward)
    # The bounding stage, as it appears without overlap, names the compute/communication split.
    sends = [(send[k] if k < n - 1 else 0.0) + (send[k - 1] if k > 0 else 0.0) for k in range(n)]
    busiest = max(range(n), key=lambda k: forward[k] + backward[k] + sends[k])
    floor = sum(forward + backward) / hardware.concurrency
    cycle = max(simulate.steady_cycle(forward, backward, send, send, overlap), floor)
    epoch = None
    seconds = cycle
    if num_batches is not None:
        num_batches = checks.check_int(
            "num_batches", num_batches, 1, meaning="mini-batches per epoch"
        )
        epoch = simulate.simulate_epoch(forward, backward, send, send, num_batches, overlap)
        epoch = max(epoch, num_batches * floor)
        seconds = epoch / num_batches
    return Estimate(
        "pipeline",
        batch_size,
        seconds,
        forward[busiest] + backward[busiest],
        sends[busiest],
        epoch,
    )
