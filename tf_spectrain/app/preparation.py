"""Setting up one `train.py` run: devices, data, the trainer, a restored checkpoint.

`prepare(config)` does it all before any training, checking what only the data or the model
can check, and returns a `Run` for `tf_spectrain.app.training.train`; `describe(run)` says
in one line what will be trained where.
"""

import dataclasses
import time
import warnings

import keras
import tensorflow as tf

from tf_spectrain import checkpoint, data, devices, models, prediction
from tf_spectrain.app import trainers
from tf_spectrain.app.config import RunConfig, as_run_config
from tf_spectrain.callbacks import PipelineCheckpoint
from tf_spectrain.checkpoint import layout
from tf_spectrain.cluster import connect_cluster, trainer_job
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime.loop import on_accelerators, on_workers_cpus
from tf_spectrain.schedule import modes
from tf_spectrain.workflow import input_checks


@dataclasses.dataclass
class Run:
    """Everything `prepare` set up for `train`."""

    config: RunConfig
    device_names: list
    model: keras.Model
    trainer: object  # the compiled keras.Model (baselines) or PipelineModel
    test_ds: tf.data.Dataset
    num_train: int
    started: float
    steps_per_epoch: int = 0
    start_epoch: int = 0  # the epoch to start at (from a checkpoint)
    start_batch: int = 0  # mini-batches of start_epoch already done (from a checkpoint)
    resumed_from: str = None  # the checkpoint restored, if any
    checkpoint: PipelineCheckpoint = None
    stop_requested: bool = False
    phase: str = "prepared"  # then "training", then "finishing" (evaluation and export)


def run_facts(config):
    """Gives the settings a checkpoint records and a resumed run must share.

    Args:
        config: the run's `RunConfig`.

    Returns:
        A dict of `model_name`, `dataset`, `batch_size`, `limit` and `seed` (they fix the
        model and the data order), and `precision` when it is not float32 and `optimizer`
        when it is not sgd (so that the checkpoints of earlier runs, written before these
        flags existed, still resume).
    """
    facts = {
        "model_name": config.model,
        "dataset": config.dataset,
        "batch_size": config.batch_size,
        "limit": config.limit,
        "seed": config.seed,
    }
    if config.precision != "float32":
        facts["precision"] = config.precision
    if config.optimizer != "sgd":
        facts["optimizer"] = config.optimizer
    return facts


def _restore(run):
    """Restores the newest checkpoint for `--resume` (or says there is none), and says what
    changed: the cuts, the number of stages, the replicas."""
    config = run.config
    info = checkpoint.restore_latest(run.trainer, config.checkpoint_dir, run_facts(config))
    if info is not None:
        run.start_epoch, run.start_batch = info["epoch"], info["batch"]
        run.resumed_from = info["path"]
        if isinstance(run.trainer, PipelineModel):
            _say_what_changed(info["metadata"], run.trainer, config)
        checkpoint.apply_learning_rate(run.trainer, config.lr)


def _say_what_changed(saved, pipe, config):
    """Prints how the restored pipeline differs from the one that saved the checkpoint:
    cuts, replicas, micro-batches."""
    cuts = saved.get("cuts")
    if isinstance(cuts, list) and cuts != pipe.cuts:
        how = "as --cuts says" if config.cuts != "auto" else "planned for this run's devices"
        print(f"--resume: the checkpoint holds {layout.describe_cuts(cuts)}; re-cut into "
              f"{layout.describe_cuts(pipe.cuts)}, {how}; each layer's weights and optimizer "
              "slots go to the stage that now holds it.", flush=True)
    replicas = saved.get("replicas", 1)
    if isinstance(replicas, int) and replicas != pipe.replicas:
        print(f"--resume: the checkpoint was trained by {replicas} "
              f"replica{'s' if replicas > 1 else ''} of the pipeline, this run has "
              f"{pipe.replicas}; each starts from the checkpoint's state.", flush=True)
    accumulate = saved.get("accumulate")
    now = pipe.options.updates_every(pipe.num_stages)
    if pipe.mode == "2bw" and isinstance(accumulate, int) and accumulate != now:
        print(f"--resume: the checkpoint was trained with one update per {accumulate} "
              f"mini-batches, this run makes one per {now} (--accumulate"
              f"{'' if config.accumulate is not None else ': the number of stages'}).",
              flush=True)
    micro = saved.get("micro_batches")
    if isinstance(micro, int) and micro != pipe.micro_batches:
        print(f"--resume: the checkpoint was trained with {micro} "
              f"micro-batch{'es' if micro > 1 else ''} per mini-batch, this run uses "
              f"{pipe.micro_batches} (the same gradient sums; "
              "BatchNorm normalises each micro-batch).", flush=True)


def _resume_cuts(saved, config, num_devices):
    """The cuts to build a resumed pipeline with: `--cuts auto` takes the checkpoint's when
    this run has devices for as many stages, else plans anew (the restore re-cuts)."""
    if config.cuts != "auto":
        return config.cuts
    stages = num_devices // config.replicas
    if len(saved) + 1 == stages:
        print(f"--resume: using the checkpoint's cuts {', '.join(saved)}", flush=True)
        return saved
    print(f"--resume: the checkpoint holds {layout.describe_cuts(saved)} and this run has "
          f"devices for {stages} stages ({num_devices} devices"
          f"{f', {config.replicas} replicas' if config.replicas > 1 else ''}): planning "
          f"{stages} stages.", flush=True)
    return "auto"


def prepare(config):
    """Sets up devices, data and the compiled model or pipeline described by `config`.

    The modes: `single` (the whole model on the first device, plain `model.fit`), `dp`
    (data parallelism over all devices with `tf.distribute.MirroredStrategy`, the baseline
    the SpecTrain paper compares against) and the pipelines `sync`, `vanilla`, `stash`,
    `spectrain`, `nesterov`, `2bw` (a `tf_spectrain.PipelineModel` of `--gpus` stages, see
    SPECTRAIN.md; `--accumulate` is 2bw's mini-batches per update). With
    `resume`, the newest checkpoint is restored (with this run's `--lr`), after a check of
    its settings that comes before any model is built; a pipeline's is re-cut when this run
    has other cuts or devices for another number of stages (`--cuts auto` keeps the
    checkpoint's cuts on as many stages, else plans for this run's devices), and lines say
    what changed. Without `resume`, a checkpoint directory that already holds checkpoints
    is refused (when checkpoints are on).
    The model is built for the dataset: `models.get_model(config.model, info.input_shape,
    info.num_classes, **info.model_options())` with `info = data.get_info(config.dataset)`
    (a language model's `num_classes` is its vocabulary; a text classifier also gets
    `vocab_size`), and compiled with cross-entropy on logits, per token for language
    modelling.

    Args:
        config: a `RunConfig` (e.g. from `tf_spectrain.app.cli.parse_args`), or an object
            with the same attributes (an `argparse.Namespace`), checked into one.

    Returns:
        A `Run`, for `train`.

    Raises:
        ValueError, TypeError: for bad settings (`config.ConfigError`), and for input
            that only the data or the model can check (a last mini-batch too small for
            `--micro-batches`, the names in `--cuts`), before any training; also for a
            checkpoint that cannot be resumed, or (without `resume`) a checkpoint directory
            that holds checkpoints already.
    """
    config = as_run_config(config)
    started = time.perf_counter()
    if config.cluster is not None:
        # Before anything else touches TensorFlow: connecting reconfigures its context.
        device_names = connect_cluster(config.trainer_cluster,
                                       devices_per_worker=config.gpus_per_host or 1,
                                       trainer_address=config.trainer_address)
        _, address = trainer_job()
        served = f" (the trainer served at {address})" if address else ""
        print(f"connected to {config.trainer_cluster.num_workers} workers{served}; stages on "
              f"{', '.join(device_names)}", flush=True)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            device_names = devices.setup_devices(config.gpus)
    keras.utils.set_random_seed(config.seed)
    info = data.get_info(config.dataset)
    options = info.model_options()  # what a text model needs beyond shapes and classes
    test_ds = data.load(
        config.dataset, "test", batch_size=config.batch_size, data_dir=config.data_dir,
        download=config.download, limit=config.limit,
    )
    num_train = data.split_size(config.dataset, "train", config.data_dir, config.limit)
    input_checks.check_micro_batch_split(
        num_train, config.batch_size, config.micro_batches * config.replicas, flags=True
    )
    cuts = config.cuts
    across_hosts = config.mode == "dp" and config.cluster is not None  # replicas of 1 stage
    pipeline = config.mode in modes.PIPELINE_MODES or across_hosts
    if config.resume and config.checkpoint_dir is not None:  # another run's: refused now
        checkpoint.refuse_other_settings(
            config.checkpoint_dir, run_facts(config), kind="pipeline" if pipeline else "keras",
            mode="sync" if across_hosts else config.mode,
            spectrain_target=config.spectrain_target)
    if config.resume and pipeline and not across_hosts and config.checkpoint_dir is not None:
        saved = checkpoint.saved_cuts(config.checkpoint_dir)
        if saved is not None:  # a pipeline's: resumed at any cuts (the restore re-cuts)
            cuts = _resume_cuts(saved, config, len(device_names))
    steps, eager = (graph_calls(config.steps_per_execution, config.run_eagerly, device_names)
                    if pipeline else (config.steps_per_execution, config.run_eagerly))
    trainer = trainers.build_trainer(
        lambda: models.get_model(config.model, info.input_shape, info.num_classes, **options),
        config.mode,
        device_names,
        learning_rate=config.lr,
        optimizer=config.optimizer,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        cuts=cuts,
        spectrain_target=config.spectrain_target,
        micro_batches=config.micro_batches,
        schedule=config.schedule,
        recompute=config.recompute,
        replicas=config.replicas,
        metrics=["accuracy"],
        batch_size=config.batch_size,
        precision=config.precision,
        steps_per_execution=steps,
        run_eagerly=eager,
        memory_limit=config.memory_limit,
        accumulate=config.accumulate,
        across_hosts=across_hosts,
    )
    model = checkpoint.trainer_model(trainer)
    run = Run(config, device_names, model, trainer, test_ds, num_train, started)
    run.steps_per_epoch = data.steps_per_epoch(
        config.dataset, config.batch_size, config.limit, config.data_dir
    )
    if config.keep_checkpoints:
        run.checkpoint = PipelineCheckpoint(
            config.checkpoint_dir, keep=config.keep_checkpoints, metadata=run_facts(config)
        )
    if config.resume:
        _restore(run)
    elif run.checkpoint is not None:
        checkpoint.refuse_existing(config.checkpoint_dir)
    return run


def example_unit(config):
    """The plural noun of the run's examples, for messages: `"images"` or `"sequences"`."""
    return "images" if data.get_info(config.dataset).input_kind == "image" else "sequences"


def describe(run):
    """Describes in one line what will be trained where, e.g. the pipeline's stages and cuts.

    Args:
        run: the `Run` from `prepare`.

    Returns:
        The line (with the checkpoint and position when the run resumes).
    """
    config = run.config
    what = (f"{config.model} on {config.dataset} ({run.num_train} training "
            f"{example_unit(config)})")
    if config.precision != "float32":
        what += f" in {config.precision}"
    if isinstance(run.trainer, PipelineModel) and config.mode == "dp":
        return (f"{what}: dp on {', '.join(run.device_names)} (a copy of the model on each, "
                f"the pipeline's replicas of one stage){_resume_note(run)}")
    if isinstance(run.trainer, PipelineModel):
        pipe = run.trainer
        copies = "" if pipe.replicas == 1 else f"{pipe.replicas} replicas of a "
        where = "; ".join(", ".join(d) for d in pipe.replica_devices)
        return (
            f"{what}: {copies}{config.mode} pipeline of {pipe.num_stages} stages on "
            f"{where}, cut after {', '.join(pipe.cuts) or 'nothing'}"
            f"{_mode_note(pipe)}{_resume_note(run)}"
        )
    where = ", ".join(run.device_names) if config.mode == "dp" else run.device_names[0]
    return f"{what}: {config.mode} on {where}{_resume_note(run)}"


def _mode_note(pipe):
    """What `describe`'s line adds for modes nesterov and 2bw: each stage's optimizer, or
    the mini-batches per update."""
    if pipe.mode == "2bw":
        every = pipe.options.updates_every(pipe.num_stages)
        return f"; one update per {every} mini-batch{'es' if every > 1 else ''}"
    if pipe.mode != "nesterov":
        return ""
    forms = [prediction.unwrapped(o) for o in pipe.stage_optimizers]
    sgd = isinstance(forms[0], keras.optimizers.SGD)
    name = "momentum" if sgd else "beta_1"
    values = ", ".join(f"{float(getattr(o, name)):.4g}" for o in forms)
    return f"; {'Nesterov SGD' if sgd else 'NAdam'} per stage, {name} {values}"


def _resume_note(run):
    """The end of `describe`'s line for a resumed run: the checkpoint and position."""
    if run.resumed_from is None:
        return ""
    return (
        f"; resuming {run.resumed_from} at epoch {run.start_epoch}, mini-batch "
        f"{run.start_batch} of {run.steps_per_epoch}"
    )


def graph_calls(setting, run_eagerly, device_names):
    """`(steps_per_execution, run_eagerly)` for the trainer, from `--steps-per-execution`
    and `--run-eagerly`: "auto" stays `compile`'s "auto" where a stage is an accelerator
    (windows of 8) or on a worker (`--cluster`: windows of one, `runtime.loop.window_size`),
    and runs pass by pass (`run_eagerly=True`) on a CPU-only machine.

    On an accelerator a pass computes for about a millisecond, and the runtime's cost per
    pass outside windows (milliseconds, RESULTS.md section 14) decides the speed. On a CPU a
    VGG16 stage's pass computes for tens of milliseconds, and pass by pass is the fastest
    there: the main command's whole run (paper SpecTrain, whose backwards recompute their
    forwards in every runtime) took 113-118 s pass by pass against 129-149 s in windows of
    one and 139 s in windows of 8 (which build their graphs; RESULTS.md section 17).
    Across hosts, pass by pass moves more than activations: a pass called from the
    trainer under a GradientTape returns what its backward needs (the stage's weights
    read, its layers' activations) by way of the trainer, so VGG16's last stage sent 61 MB
    per mini-batch where windows send 4 MB (RESULTS.md section 18).
    """
    if run_eagerly or setting != "auto":
        return setting, run_eagerly
    if on_accelerators(device_names) or on_workers_cpus(device_names):
        return setting, False
    return 1, True  # a CPU-only machine: pass by pass

