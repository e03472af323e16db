"""`plan_pipeline`: know before you run; a pipeline's plan, time and memory, without training.

    plan = costmodel.plan_pipeline(model, ["/GPU:0", "/GPU:1"], batch_size=64,
                                   mode="sync", micro_batches=4, memory_limit="8GiB")
    print(plan)                     # cuts, per-stage time and memory, each device's memory
    if not plan.fits:
        print(plan.problems())      # the stages that would not fit, and what to do

Given cuts are priced (`StageTerms` on the model's profile); `cuts="auto"` plans them
(`auto_partition`: profiling the layers and timing the planned stages, which trains
nothing), avoiding cuts whose stages would not fit `memory_limit` or their device's
memory. Needs TensorFlow.
"""

import tensorflow as tf

from tf_spectrain import checks, partition
from tf_spectrain import devices as devices_lib
from tf_spectrain.costmodel import autoplan, measure, planning
from tf_spectrain.costmodel.plan import PartitionPlan
from tf_spectrain.costmodel.run_plan import RunPlan, parse_memory_size
from tf_spectrain.costmodel.stage_terms import StageTerms
from tf_spectrain.schedule.options import PipelineOptions

NO_PEAK = ("measured peak: not measured; TensorFlow reports a peak only on GPUs "
           "(tf.config.experimental.get_memory_info), and CPU devices cannot measure it.")


def plan_pipeline(
    model,
    devices,
    batch_size=32,
    cuts="auto",
    memory_limit=None,
    optimizer_slots=1,
    options=None,
    profile=None,
    link_bandwidth=None,
    calibration_rounds=4,
    measure_peak=True,
    **pipeline_options,
):
    """The plan of a pipeline of `model` on `devices`, priced without training.

    Each stage's predicted time and memory (weights, optimizer slots, the activations of
    its micro-batches in flight, stashed weights, mode "2bw"'s gradient sum) follow the
    pipeline's options, as
    `PipelineModel` would run them; the memory is set against each device's memory (GPUs
    report it; CPU devices do not) and `memory_limit`. On GPUs, with `measure_peak`, one
    forward and backward of each stage is run alone (`measure_stages`, no update) and
    TensorFlow's peak memory on its device recorded beside the prediction: a lower bound
    of the pipeline's (one mini-batch in flight, no optimizer slots).

    Args:
        model: a functional `keras.Model` or built `keras.Sequential`, built under the
            dtype policy it will train in (a mixed policy's activations count 2 bytes).
        devices: one device name per stage (names may repeat).
        batch_size: examples per mini-batch of one pipeline, an int >= 1.
        cuts: "auto" (planned, within the memory limits) or a list of `len(devices) - 1`
            layer names to price.
        memory_limit: None, bytes per device (a number or a string such as "16GiB"), or a
            list of one per stage (None entries: none).
        optimizer_slots: optimizer variables per weight (1: momentum SGD, 2: Adam; 0:
            plain SGD) of the user's optimizer; mode "nesterov" prices its Nesterov form
            (`StageTerms.slots`).
        options: a `PipelineOptions` (`PipelineModel.options`), or None to take the
            options as keywords: `mode`, `spectrain_target`, `micro_batches`, `schedule`,
            `recompute`, `accumulate` (as `PipelineModel`'s).
        profile: a `ModelProfile` (or one per stage) to price and plan with instead of
            profiling (then `cuts="auto"` is planned from it, without calibration).
        link_bandwidth: bytes/s between neighbouring devices; None measures it between
            GPUs and takes hand-offs between CPU devices as free.
        calibration_rounds: with `cuts="auto"`, stage timings to calibrate the plan with.
        measure_peak: on GPUs, measure each stage's peak memory as described above.

    Returns:
        A `RunPlan`: `print` it; `fits`, `over` and `problems()` say what would not fit.

    Raises:
        MemoryLimitError: with `cuts="auto"`, if no cuts fit (the message gives the
            least memory any cuts need).
        TypeError, ValueError: for invalid arguments (before any profiling).
    """
    options = PipelineOptions.given(options, **pipeline_options)
    devices = [checks.check_instance("devices[...]", d, str) for d in
               checks.check_instance("devices", devices, (list, tuple))]
    if not devices:
        raise ValueError("`devices` must name at least one device. Received: devices=[]")
    batch_size = checks.check_int("batch_size", batch_size, 1, meaning="examples per mini-batch")
    limits = _limits(memory_limit, len(devices))
    capacity = [devices_lib.device_memory_bytes(d) for d in devices]
    planned = isinstance(cuts, str) and cuts == "auto"
    if not planned:
        cuts = _check_cuts(cuts, len(devices))
    effective = [_smaller(c, m) for c, m in zip(capacity, limits)]
    if planned and len(devices) > 1 and profile is None:
        plan = autoplan.auto_partition(
            model, devices, batch_size, memory_limit=effective, link_bandwidth=link_bandwidth,
            calibration_rounds=calibration_rounds, options=options,
            optimizer_slots=optimizer_slots)
    elif planned and len(devices) > 1:
        bandwidth, latency = autoplan.stage_link(devices, link_bandwidth)
        plan = planning.plan_partition(
            profile, len(devices), batch_size, bandwidth=bandwidth, latency=latency,
            memory_limit=effective, optimizer_slots=optimizer_slots,
            allowed=partition.cuts_keeping_masks(model), devices=devices,
            **options.planned())
    else:
        plan = price_cuts(model, devices, batch_size, [] if planned else cuts, options,
                          optimizer_slots, profile, link_bandwidth)
    peaks, note = None, NO_PEAK
    if measure_peak and all(_kind(d) == "GPU" for d in devices):
        peaks, note = _measured_peaks(model, plan.cuts, batch_size, devices)
    return RunPlan(plan, capacity, limits, peaks, note)


def price_cuts(model, devices, batch_size, cuts, options, optimizer_slots=1, profile=None,
               link_bandwidth=None):
    """The `PartitionPlan` of given cuts: each stage's `StageTerms.estimate`.

    Args:
        model: the `keras.Model` (profiled on `devices` unless `profile` is given).
        devices: one device name per stage.
        batch_size: examples per mini-batch.
        cuts: `len(devices) - 1` layer names.
        options: a `PipelineOptions`.
        optimizer_slots: optimizer variables per weight.
        profile: None, a `ModelProfile` or one per stage.
        link_bandwidth: bytes/s between neighbours, or None (see `plan_pipeline`).
    """
    if profile is None:
        profile = autoplan.stage_profiles(model, devices, batch_size)
    bandwidth, latency = autoplan.stage_link(devices, link_bandwidth)
    terms = StageTerms(profile, batch_size, len(devices), bandwidth=bandwidth,
                       latency=latency, optimizer_slots=optimizer_slots,
                       options=PipelineOptions(**options.planned()))
    first = terms.profiles[0]
    bounds = [-1] + list(first.cut_positions(list(cuts))) + [terms.last_layer]
    stages = [terms.estimate(bounds[k] + 1, bounds[k + 1], k) for k in range(len(devices))]
    return PartitionPlan(
        names=first.names, stages=stages, batch_size=batch_size, model_name=first.name,
        devices=devices, **options.planned())


def _limits(memory_limit, num_stages):
    """One limit in bytes (or None) per stage."""
    if isinstance(memory_limit, (list, tuple)):
        if len(memory_limit) != num_stages:
            raise ValueError(
                f"`memory_limit` must be a size or a list of one per stage ({num_stages}). "
                f"Received: memory_limit={list(memory_limit)}")
        return [None if m is None else parse_memory_size(m) for m in memory_limit]
    limit = None if memory_limit is None else parse_memory_size(memory_limit)
    return [limit] * num_stages


def _check_cuts(cuts, num_stages):
    """`cuts` as a list of `num_stages - 1` names."""
    if isinstance(cuts, str) or not isinstance(cuts, (list, tuple)) or not all(
            isinstance(c, str) for c in cuts):
        raise TypeError("`cuts` must be 'auto' or a list of layer names. "
                        f"Received: cuts={cuts!r:.200}")
    if len(cuts) != num_stages - 1:
        raise ValueError(
            f"`cuts` must name {num_stages - 1} layers for {num_stages} devices (one stage "
            f"per device). Received: cuts={list(cuts)}")
    return list(cuts)


def _smaller(a, b):
    """The smaller of two optional numbers (None: unknown)."""
    known = [x for x in (a, b) if x is not None]
    return min(known) if known else None


def _kind(device):
    """The device's type in capitals."""
    return (tf.DeviceSpec.from_string(device).device_type or "CPU").upper()


def _measured_peaks(model, cuts, batch_size, devices):
    """Each stage's peak bytes over one forward and backward alone on its device."""
    distinct = list(dict.fromkeys(devices))
    try:
        for d in distinct:
            tf.config.experimental.reset_memory_stats(d)
        measure.measure_stages(model, cuts, batch_size, repeats=1, warmup=0, device=devices)
        peak = {d: tf.config.experimental.get_memory_info(d)["peak"] for d in distinct}
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        return None, f"measured peak: could not be read ({type(error).__name__}: {error})."
    shared = " (stages sharing a device show its one peak)" if len(distinct) < len(devices) else ""
    return tuple(peak[d] for d in devices), (
        "peak: TensorFlow's measured peak on each device over one forward and backward "
        f"of its stage alone{shared}: one mini-batch in flight and no optimizer slots, "
        "so below what training needs; only training measures the rest.")

