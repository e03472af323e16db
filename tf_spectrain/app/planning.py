"""`train.py --plan`: print the run's plan and each stage's memory, and exit; no training.

The model is built as training would build it (its dataset's shapes, `--precision`), and
`costmodel.plan_pipeline` prices the given `--cuts` or plans `--cuts auto` (profiling the
layers on the stage devices, within `--memory-limit` and each device's memory) for
`--mode`, `--micro-batches`, `--schedule`, `--recompute` and `--batch-size`, as training
would plan them (`CALIBRATION_ROUNDS`). Nothing is trained or written: no log directory,
checkpoint or exported model.

Exit codes: 0 when every stage fits, `DOES_NOT_FIT` (3) when a stage would not (the
message names it and what to do); bad flags exit with 2 before any work.
"""

import contextlib
import sys
import time
import warnings

import keras
import tensorflow as tf

from tf_spectrain import costmodel, data, devices, models
from tf_spectrain.app import trainers
from tf_spectrain.costmodel.run_plan import memory_hints
from tf_spectrain.partition import model_memory
from tf_spectrain.schedule import modes
from tf_spectrain.schedule.options import PipelineOptions

DOES_NOT_FIT = 3
"""`train.py --plan`'s exit code when a stage would not fit its device or `--memory-limit`."""

CALIBRATION_ROUNDS = 4
"""`--plan --cuts auto` times the planned stages whole at most this often, as training's
`--cuts auto` does (`costmodel.auto_partition`), so that it plans as training would. Each
round of a large model costs seconds (about 10 s for ResNet-50 on a 2-core CPU): 2 would
take `--plan` for ResNet-50 from 48 s to 32 s there, but four rounds plan better than
two (docs/COSTMODEL.md)."""


def optimizer_slots(config):
    """Optimizer variables per weight of the run's optimizer: AdamW 2, momentum SGD 1,
    plain SGD (`--momentum 0`) 0 (the planner prices `--mode nesterov`'s Nesterov form of
    it: the same slots, and a momentum on every stage but the last)."""
    if config.optimizer == "adamw":
        return 2
    return 1 if config.momentum > 0 else 0


def stage_layout(config, device_names):
    """What is priced for `config`'s mode: `(devices, batch_size, cuts, options)`.

    A pipeline prices one copy (replica 0's devices, `--batch-size / --replicas`);
    `single` the model on the first device; `dp` the model on one device with its share
    of the batch (every device holds the same).
    """
    if config.mode in modes.PIPELINE_MODES:
        options = PipelineOptions(
            mode=config.mode, spectrain_target=config.spectrain_target,
            micro_batches=config.micro_batches, schedule=config.schedule,
            recompute=config.recompute, accumulate=config.accumulate)
        cuts = config.cuts if config.cuts == "auto" else list(config.cuts)
        return (device_names[:config.num_stages], config.batch_size // config.replicas, cuts,
                options)
    share = config.batch_size // len(device_names) if config.mode == "dp" else config.batch_size
    return device_names[:1], max(1, share), [], PipelineOptions(mode="sync")


def build_model(config, device_names):
    """The run's model, built as `trainers.build_trainer` builds it (dataset shapes,
    `--precision`, on `/CPU:0` when the stages are not all CPUs)."""
    info = data.get_info(config.dataset)
    where = model_memory.model_build_device(device_names)
    with tf.device(where) if where else contextlib.nullcontext():
        with trainers.precision_policy(config.precision):
            return models.get_model(config.model, info.input_shape, info.num_classes,
                                    **info.model_options())


def plan_run(config):
    """Prints the plan of the run `config` describes, and its memory check; no training.

    Args:
        config: a checked `RunConfig` (`config.plan` need not be set).

    Returns:
        0 when every stage fits, `DOES_NOT_FIT` when one would not (its message, naming
        the stage and what to do, goes to stderr).

    Raises:
        ValueError, TypeError: for cuts that are not the model's layers, or a model that
            cannot be cut so.
    """
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        device_names = devices.setup_devices(config.gpus)
    keras.utils.set_random_seed(config.seed)  # the initial weights training would start from
    model = build_model(config, device_names)
    stage_devices, batch, cuts, options = stage_layout(config, device_names)
    print(_describe(config, stage_devices, batch), flush=True)
    try:
        plan = costmodel.plan_pipeline(
            model, stage_devices, batch, cuts=cuts, memory_limit=config.memory_limit,
            optimizer_slots=optimizer_slots(config), options=options,
            calibration_rounds=CALIBRATION_ROUNDS)
    except costmodel.MemoryLimitError as error:
        hints = _flag_hints(config, options, len(stage_devices))
        print(f"train.py: error: {error}\nTry {', '.join(hints)}.", file=sys.stderr)
        return DOES_NOT_FIT
    print(plan.report(problems=False), flush=True)
    seconds = time.perf_counter() - started
    if not plan.fits:
        hints = _flag_hints(config, options, len(stage_devices))
        for problem in plan.problems(hints, limit_name="--memory-limit"):
            print(f"train.py: error: {problem}", file=sys.stderr)
        print(f"planned in {seconds:.1f} s; nothing trained. Exit code {DOES_NOT_FIT}: "
              f"stage(s) {', '.join(map(str, plan.over))} would not fit.", flush=True)
        return DOES_NOT_FIT
    print(f"planned in {seconds:.1f} s; nothing trained. To train with these cuts: "
          f"--cuts {','.join(plan.cuts) or '(none)'}", flush=True)
    return 0


def _describe(config, stage_devices, batch):
    """The first line: what is planned, on what."""
    what = f"--plan: {config.model}"
    if config.precision != "float32":
        what += f" in {config.precision}"
    if config.mode in modes.PIPELINE_MODES:
        copies = f" (one of {config.replicas} replicas)" if config.replicas > 1 else ""
        return (f"{what}, {config.mode} pipeline of {len(stage_devices)} stages on "
                f"{', '.join(stage_devices)}{copies}, batch {batch}")
    return f"{what}, --mode {config.mode} on {stage_devices[0]}, batch {batch} per device"


def _flag_hints(config, options, num_stages):
    """`memory_hints` as train.py's flags, plus --precision when float32."""
    plan = costmodel.PartitionPlan(names=(), stages=(None,) * num_stages, batch_size=1,
                                   **options.planned())
    hints = memory_hints(plan, flags=True)
    hints[0] = f"--gpus {(num_stages + 1) * config.replicas} (more stages)"
    if config.cuts == "auto":
        hints = [h for h in hints if not h.startswith("--cuts auto")]
    if config.mode not in modes.PIPELINE_MODES:
        hints = [h for h in hints if h.startswith(("--gpus", "a smaller"))]
        hints[0] = "a pipeline mode (e.g. --mode sync) to split the model over the devices"
    if config.precision == "float32":
        hints.append("--precision mixed_bfloat16 (2-byte activations)")
    return hints
