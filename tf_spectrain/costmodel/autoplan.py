"""Automatic cuts from measured time: what `PipelineModel(cuts="auto")` runs (needs TensorFlow).

`auto_partition(model, devices, ...)`:

1. **Profiles** every layer's forward and backward (`measure.profile_model`) on the
   first stage device of each kind (one profile for identical devices), at the planned
   batch size; cached in memory per (model, batch shape, device kind).
2. **Plans** with `planning.plan_partition`: the slowest stage's compute, recomputed
   forward and hand-offs as small as possible, within the memory limits (what a stage
   keeps follows the mode, micro-batches, `sync` schedule and recomputation; the sizes
   are the measured tensors', so a mixed-precision policy's 2-byte activations count).
3. **Calibrates**: per-layer times do not add up exactly to a stage's time (the per-call
   overhead of many small layers, memory traffic of a whole stage), so the planned stages
   are timed whole (`measure.measure_stages`) on their devices, each stage's layers are
   rescaled by its measured over predicted time, and the model is planned again; this
   repeats up to `calibration_rounds` times or until the cuts stop changing. The plan with
   the fastest measured slowest stage is kept; its measured times are in the plan. Plans
   whose slowest stage is predicted under `calibrate_above` (5 ms) skip this: such stages
   are timed mostly as per-call overhead and noise.

Only cuts that keep every Keras mask are planned (`partition.cuts_keeping_masks`).
Profiling runs the model in training mode on random inputs; the model's non-trainable
variables (BatchNorm statistics, random-generator states) are restored afterwards.
"""

import dataclasses
import gc
import math
import time
import weakref

import tensorflow as tf

from tf_spectrain import checks, partition
from tf_spectrain.costmodel import measure, planning
from tf_spectrain.costmodel.profile import ModelProfile, scale_stage
from tf_spectrain.schedule.options import PipelineOptions

_PROFILES = {}  # (id(model), batch, input shapes, device kind) -> ModelProfile


def auto_partition(
    model,
    devices,
    batch_size=32,
    mode="spectrain",
    spectrain_target="paper",
    micro_batches=1,
    memory_limit=None,
    link_bandwidth=None,
    calibration_rounds=4,
    calibrate_above=0.005,
    schedule="gpipe",
    recompute="auto",
    options=None,
    optimizer_slots=1,
):
    """Chooses cuts for `model` on `devices` from measured time (see the module docstring).

    Args:
        model: a functional `keras.Model` or built `keras.Sequential`.
        devices: one device name per stage (names may repeat).
        batch_size: the mini-batch to profile and plan at, an int >= 1.
        mode, spectrain_target, micro_batches: the pipeline's (see `PipelineModel`);
            `micro_batches` in any mode.
        memory_limit: None, bytes per device, or a list of one per stage.
        link_bandwidth: bytes/s between neighbouring devices; None measures it between
            the first two devices when they are GPUs (`measure.measure_link`) and takes
            hand-offs between CPU devices, which share memory, as free.
        calibration_rounds: stage timings to calibrate the plan with, an int >= 0.
        calibrate_above: calibrate only when the first plan's slowest stage is predicted
            to take at least this many seconds per mini-batch (>= 0). Shorter stages are
            timed mostly as per-call overhead and noise, so tiny models skip it.
        schedule: the `sync` schedule, "gpipe" or "1f1b" (1F1B-flush keeps at most
            `min(N - k, M)` micro-batches in flight on stage k); "gpipe" in other modes.
        recompute: "auto" (stages whose backward runs at other weights recompute) or
            "always" (every stage keeps only its inputs and recomputes its forward).
        options: a `schedule.options.PipelineOptions` (`PipelineModel.options`) in place
            of `mode`, `spectrain_target`, `micro_batches`, `schedule` and `recompute`
            (then left at their defaults); its `replicas` is not planned for: give the
            batch size of one copy of the pipeline.
        optimizer_slots: optimizer variables per weight (1: momentum SGD, 2: Adam), for
            the stages' memory.

    Returns:
        A `PartitionPlan` (its `measured` holds each stage's measured forward plus
        backward seconds when `calibration_rounds > 0`).

    Raises:
        MemoryLimitError: if no plan fits `memory_limit`.
        TypeError, ValueError: for invalid arguments, or a model that cannot be split.
    """
    devices = list(devices)
    options = PipelineOptions.given(
        options, mode=mode, spectrain_target=spectrain_target, micro_batches=micro_batches,
        schedule=schedule, recompute=recompute)
    calibration_rounds = checks.check_int(
        "calibration_rounds", calibration_rounds, 0, meaning="stage timings"
    )
    calibrate_above = checks.check_number(
        "calibrate_above", calibrate_above, 0.0, meaning="seconds per mini-batch"
    )
    start = time.perf_counter()
    keeping = _cuts_keeping_masks(model, len(devices))
    saved = [v.numpy() for v in model.non_trainable_variables]
    try:
        profiles = stage_profiles(model, devices, batch_size)
        bandwidth, latency = stage_link(devices, link_bandwidth)
        settings = dict(
            # None (any layer but the last) unless a cut would lose a Keras mask.
            allowed=None if len(keeping) == len(profiles[0]) - 1 else keeping,
            num_stages=len(devices),
            batch_size=batch_size,
            bandwidth=bandwidth,
            latency=latency,
            memory_limit=memory_limit,
            devices=devices,
            optimizer_slots=optimizer_slots,
            **options.planned(),
        )
        plan = planning.plan_partition(profiles, **settings)
        tried = []
        if len(devices) == 1 or plan.seconds_per_batch < calibrate_above:
            calibration_rounds = 0
        for _ in range(calibration_rounds):
            measured = measure.measure_stages(model, plan.cuts, batch_size, device=devices)
            tried.append((_measured_pace(plan, measured), plan, measured))
            profiles = _calibrated(profiles, plan, measured)
            again = planning.plan_partition(profiles, **settings)
            if again.cuts == plan.cuts:
                break
            plan = again
    finally:
        for v, value in zip(model.non_trainable_variables, saved):
            v.assign(value)
        # Profiling built a sub-model per layer and placed stage copies; free them (and
        # their traced functions) now rather than in a garbage collection during training.
        gc.collect()
    measured = None
    if tried:
        _, plan, measured = min(tried, key=lambda t: t[0])
    return dataclasses.replace(
        plan,
        profile_seconds=time.perf_counter() - start,
        measured=None if measured is None else tuple(fb for _, fb in measured),
    )


def _cuts_keeping_masks(model, num_stages):
    """The layers a cut may follow without losing a Keras mask (`split_model` refuses the
    others); a ValueError if they are too few for `num_stages`."""
    keeping = partition.cuts_keeping_masks(model)
    if len(keeping) < num_stages - 1:
        raise ValueError(
            f"Cannot cut model '{model.name}' into {num_stages} stages: only "
            f"{len(keeping)} of its layers can end a stage ({keeping}; a stage ends after "
            "a layer whose outputs, and the Keras masks they carry, are all that later "
            "layers need; see tf_spectrain.partition.split_model). Use at most "
            f"{len(keeping) + 1} stage(s)."
        )
    return keeping


def stage_profiles(model, devices, batch_size):
    """Each stage's `ModelProfile` of `model` at `batch_size` (one per kind of device, cached).

    Args:
        model: a functional `keras.Model`.
        devices: one device name per stage.
        batch_size: the batch size to profile at, an int >= 1.
    """
    return [_profile(model, batch_size, d) for d in _profiling_devices(devices)]


def _profiling_devices(devices):
    """Each stage's profiling device: the first stage device of its kind."""
    first_of_kind = {}
    for d in devices:
        first_of_kind.setdefault(_kind(d), d)
    return [first_of_kind[_kind(d)] for d in devices]


def _kind(device):
    """The device's type in capitals ("GPU", "CPU"; "CPU" when the name gives none)."""
    return (tf.DeviceSpec.from_string(device).device_type or "CPU").upper()


def _profile(model, batch_size, device):
    """The cached (or a new) profile of `model` at `batch_size` on `device`'s kind."""
    shapes = tuple(tuple(t.shape[1:]) for t in model.inputs)
    key = (id(model), batch_size, shapes, _kind(device))
    if key not in _PROFILES:
        _PROFILES[key] = measure.profile_model(model, batch_size, device=device)
        weakref.finalize(model, _PROFILES.pop, key, None)
    return _PROFILES[key]


def stage_link(devices, link_bandwidth=None):
    """`(bandwidth, latency)` of the hand-offs between neighbouring stages on `devices`:
    `link_bandwidth` if given, free between CPU devices, else measured (`measure_link`)."""
    if link_bandwidth is not None:
        return link_bandwidth, 0.0
    distinct = list(dict.fromkeys(devices))
    if len(distinct) < 2 or all(_kind(d) == "CPU" for d in distinct[:2]):
        return math.inf, 0.0
    return measure.measure_link(distinct[0], distinct[1])


def _measured_pace(plan, measured):
    """The slowest stage by measurement: forward + backward, recompute and sends."""
    return max(
        fb + (f if s.recompute else 0.0) + s.send
        for s, (f, fb) in zip(plan.stages, measured)
    )


def _calibrated(profiles, plan, measured):
    """Profiles whose layers of each stage are scaled to that stage's measured times."""
    layers = {id(p): list(p.layers) for p in profiles}
    for k, (stage, (f, fb)) in enumerate(zip(plan.stages, measured)):
        scale_stage(layers[id(profiles[k])], stage.first, stage.last, f, fb)
    new = {
        id(p): ModelProfile(layers[id(p)], p.batch_size, p.name, p.input_bytes)
        for p in profiles
    }
    return [new[id(p)] for p in profiles]
