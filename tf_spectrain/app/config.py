"""The typed settings of one `train.py` run, checked when they are built.

`RunConfig` holds every flag of `train.py` as a typed field with its default: the parser in
`tf_spectrain.app.cli` takes its defaults from here, and `tf_spectrain.app.training` reads the
fields. Building one checks every field and reports every problem at once, naming the
flags (`--gpus`) since these are the command line's settings, then fills in the paths left
to their defaults. Creating the output directories is left to `cli.parse_args`.
"""

import dataclasses
import os
import time

from tf_spectrain import checks, data, models
from tf_spectrain.app.trainers import DEFAULT_LR, DEFAULT_WEIGHT_DECAY, OPTIMIZERS, PRECISIONS
from tf_spectrain.cluster import spec as cluster_spec
from tf_spectrain.schedule import modes
from tf_spectrain.workflow import input_checks

ON_NAN = modes.ON_NAN
MAX_DEVICES = 64
DEFAULT_GPUS = 4  # --gpus without --cluster
TF_CONFIG = "TF_CONFIG"  # --cluster TF_CONFIG: read the cluster from that variable
MAX_SEED = 2**32  # keras.utils.set_random_seed takes seeds below 2**32
PATH_FIELDS = ("logdir", "checkpoint_dir", "export", "data_dir")
SWITCHES = ("download", "graph", "histograms", "resume")

# The zoo's one language model; the other models of token sequences classify them.
LANGUAGE_MODELS = ("transformer_lm",)
KINDS = {
    "image": "classifies images",
    "text": "classifies token sequences",
    "language_model": "predicts the next token (language modelling)",
}
DEFAULT_DATASETS = {"image": "digits", "language_model": "pydoc"}  # none for "text"


def flag(field):
    """Gives the command-line flag of a `RunConfig` field: `batch_size` -> `--batch-size`.

    Args:
        field: a `RunConfig` field name.

    Returns:
        The flag, as a str.
    """
    return "--" + field.replace("_", "-")


def model_kind(model):
    """Tells what a model of the zoo learns, by its name.

    Args:
        model: a model name.

    Returns:
        `"language_model"`, `"text"` (a classifier of token sequences) or `"image"` (every
        other name).
    """
    if not isinstance(model, str) or model not in models.model_names():
        return "image"
    if models.model_input_kind(model) != "tokens":
        return "image"
    return "language_model" if model in LANGUAGE_MODELS else "text"


def dataset_kind(dataset):
    """Tells what a dataset teaches, in the words of `model_kind`.

    Args:
        dataset: a name of `data.dataset_names()`.

    Returns:
        `"language_model"`, `"text"` or `"image"`.
    """
    info = data.get_info(dataset)
    return "language_model" if info.task == "language_model" else info.input_kind


def default_dataset(model):
    """Gives the dataset a run of `model` uses when `--dataset` is not given.

    Args:
        model: a model name.

    Returns:
        `"digits"` for image models, `"pydoc"` for the language model, and None for the
        text classifiers: no text classification set is bundled, so they need `--dataset`.
    """
    return DEFAULT_DATASETS.get(model_kind(model))


def default_logdir(model, mode):
    """Builds the default log directory of a run: `runs/<model>-<mode>-<timestamp>`.

    Args:
        model: the model name.
        mode: the training mode.

    Returns:
        The relative path, with the local time as `%Y%m%d-%H%M%S`.
    """
    return os.path.join("runs", f"{model}-{mode}-{time.strftime('%Y%m%d-%H%M%S')}")


class ConfigError(ValueError):
    """Every problem of a `RunConfig`, at once: one message per problem in `errors`."""

    def __init__(self, errors):
        super().__init__("\n  ".join(errors))
        self.errors = list(errors)


class ConfigTypeError(ConfigError, TypeError):
    """A `ConfigError` whose problems are all values of the wrong type."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The settings of one `train.py` run: each field is the flag of the same name.

    See `python train.py --help` for what each one means. `dataset` None means the
    model's default (`default_dataset`: `digits`, or `pydoc` for `transformer_lm`); the
    model must fit the dataset (images, token sequences, or language modelling).
    `verbose` is no flag: the Keras
    verbosity of `fit` ("auto", 0, 1 or 2). `cuts` is "auto" (planned from measured time,
    the default; None means the same) or the layer names. Building a `RunConfig` checks
    every field, turns `cuts` into a tuple and path-like paths into strings, and resolves the paths
    left to None: `logdir` (`runs/<model>-<mode>-<timestamp>`; with `resume` and a
    `checkpoint_dir`, that directory's parent), `checkpoint_dir` (`<logdir>/checkpoints`)
    and `export` (`<logdir>/model.keras`; "none" means no export).

    Raises:
        ConfigError: a ValueError that lists every problem, each message naming its flag;
            a `ConfigTypeError` (also a TypeError) when all are values of the wrong type.
    """

    model: str = "vgg16"
    gpus: int | None = None  # None: DEFAULT_GPUS without --cluster
    cluster: str | None = None
    gpus_per_host: int | None = None  # None: 1 with --cluster
    mode: str = "spectrain"
    cuts: tuple[str, ...] | str = "auto"
    spectrain_target: str = "paper"
    micro_batches: int = 1
    schedule: str = "gpipe"
    recompute: str = "auto"
    replicas: int = 1
    dataset: str | None = None  # None: default_dataset(model)
    data_dir: str | None = None
    download: bool = False
    # VGG16 on digits reaches about 94% test accuracy in 4 epochs (6.5 minutes on a 2-core
    # CPU as a 4-stage SpecTrain pipeline).
    epochs: int = 4
    batch_size: int = 32
    optimizer: str | None = None  # None: "adamw" for the text models, else "sgd"
    lr: float | None = None  # None: trainers.DEFAULT_LR of the optimizer
    momentum: float = 0.9
    weight_decay: float | None = None  # None: trainers.DEFAULT_WEIGHT_DECAY of the optimizer
    precision: str = "float32"
    seed: int = 0
    limit: int | None = None
    logdir: str | None = None
    log_every: int | str = "auto"
    prediction_every: int = 10
    steps_per_execution: int | str = "auto"
    graph: bool = False
    histograms: bool = False
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 3
    resume: bool = False
    on_nan: str = "stop"
    export: str | None = None
    verbose: int | str = "auto"

    def __post_init__(self):
        if self.optimizer is None:
            default = "sgd" if model_kind(self.model) == "image" else "adamw"
            object.__setattr__(self, "optimizer", default)
        if self.optimizer in OPTIMIZERS:
            if self.lr is None:
                object.__setattr__(self, "lr", DEFAULT_LR[self.optimizer])
            if self.weight_decay is None:
                object.__setattr__(self, "weight_decay", DEFAULT_WEIGHT_DECAY[self.optimizer])
        if self.gpus is None and self.cluster is None:
            object.__setattr__(self, "gpus", DEFAULT_GPUS)
        if self.cuts is None:
            object.__setattr__(self, "cuts", "auto")
        if self.dataset is None:
            object.__setattr__(self, "dataset", default_dataset(self.model))
        if isinstance(self.cuts, list):
            object.__setattr__(self, "cuts", tuple(self.cuts))
        for name in PATH_FIELDS:
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        problems = _problems(self)
        if problems:
            wrong_types = all(isinstance(p, TypeError) for p in problems)
            raise (ConfigTypeError if wrong_types else ConfigError)([str(p) for p in problems])
        for name, value in _resolved_paths(self).items():
            object.__setattr__(self, name, value)


    @property
    def trainer_cluster(self):
        """The `tf_spectrain.cluster.Cluster` of `--cluster` (read from `TF_CONFIG` for
        `--cluster TF_CONFIG`), or None without `--cluster`."""
        if self.cluster is None:
            return None
        return cluster_spec.trainer_cluster(None if self.cluster == TF_CONFIG else self.cluster)

    @property
    def num_stages(self):
        """The stages of the pipeline: the devices over `--replicas`."""
        return self.num_devices // self.replicas

    @property
    def num_devices(self):
        """The devices the run trains on: `--gpus`, or workers x `--gpus-per-host`."""
        if self.cluster is None:
            return self.gpus
        return self.trainer_cluster.num_workers * (self.gpus_per_host or 1)


def as_run_config(settings):
    """`settings` as a checked `RunConfig`: itself, or built from its attributes.

    Args:
        settings: a `RunConfig`, or any object (an `argparse.Namespace`, say) whose
            attributes are named as `RunConfig`'s fields; missing ones take the defaults.

    Returns:
        A `RunConfig`.

    Raises:
        ConfigError: (a ValueError; also a TypeError when all are of the wrong type) the
            settings' problems.
    """
    if isinstance(settings, RunConfig):
        return settings
    names = [f.name for f in dataclasses.fields(RunConfig)]
    return RunConfig(**{n: getattr(settings, n) for n in names if hasattr(settings, n)})


class _Problems(list):
    """The errors of checks, collected instead of raised."""

    def check(self, function, *args, **kwargs):
        """Runs a check; True if it passed, else its error is collected."""
        try:
            function(*args, **kwargs)
        except (TypeError, ValueError) as error:
            self.append(error)
            return False
        return True

    def add(self, message):
        """Collects a ValueError with `message`."""
        self.append(ValueError(message))


def _problems(config):
    """Every problem of `config`, in the order the flags are documented."""
    c, p = config, _Problems()
    model_ok = p.check(checks.check_one_of, "--model", c.model, models.model_names())
    if c.dataset is None:
        if model_ok:
            p.add(f"--model {c.model} {KINDS[model_kind(c.model)]} and needs a dataset of "
                  f"labelled token sequences: give --dataset imdb_reviews (tensorflow-datasets,"
                  f" prepared in --data-dir). The bundled pydoc sets teach language modelling, "
                  f"for --model transformer_lm.")
    elif p.check(checks.check_one_of, "--dataset", c.dataset, data.dataset_names()) and model_ok:
        _check_model_fits_dataset(p, c)
    p.check(checks.check_one_of, "--mode", c.mode, modes.ALL_MODES)
    devices_ok = _check_devices(p, c)
    p.check(checks.check_int, "--epochs", c.epochs, 1)
    batch_ok = p.check(checks.check_int, "--batch-size", c.batch_size, 1)
    p.check(checks.check_one_of, "--spectrain-target", c.spectrain_target, modes.TARGETS)
    _check_pipeline_flags(p, c, batch_ok, devices_ok)
    if c.limit is not None:
        p.check(checks.check_int, "--limit", c.limit, 1)
    optimizer_ok = p.check(checks.check_one_of, "--optimizer", c.optimizer, OPTIMIZERS)
    # An unknown optimizer has no default --lr or --weight-decay: say nothing of unset ones.
    if optimizer_ok or c.lr is not None:
        p.check(checks.check_number, "--lr", c.lr, 0, strict=True)
    p.check(checks.check_number, "--momentum", c.momentum, 0, 1, valid="in [0, 1)",
            meaning="0 <= momentum < 1")
    if optimizer_ok or c.weight_decay is not None:
        p.check(checks.check_number, "--weight-decay", c.weight_decay, 0)
    if c.precision in ("float16", "bfloat16"):
        p.add(f"--precision must be one of {list(PRECISIONS)}: the mixed policies compute in "
              f"{c.precision} and keep the variables in float32. Received: --precision "
              f"{c.precision}; did you mean 'mixed_{c.precision}'?")
    else:
        p.check(checks.check_one_of, "--precision", c.precision, PRECISIONS)
    p.check(checks.check_int, "--seed", c.seed, 0, MAX_SEED - 1, valid=">= 0 and < 2**32")
    _check_data_dir(p, c)
    _check_run_flags(p, c)
    if not p:
        try:
            data.check_available(c.dataset, data_dir=c.data_dir, download=c.download)
        except FileNotFoundError as error:
            p.append(error)
    return p


def _check_model_fits_dataset(p, c):
    """--model learns what --dataset teaches: images, token sequences or the next token."""
    model, dataset = model_kind(c.model), dataset_kind(c.dataset)
    if model != dataset:
        fitting = [name for name in data.dataset_names() if dataset_kind(name) == model]
        p.add(f"--dataset {c.dataset} does not fit --model {c.model}: the model "
              f"{KINDS[model]}, the dataset is for a model that {KINDS[dataset]}. Use "
              f"--dataset {', '.join(fitting)}, or another model. Received: --model "
              f"{c.model} --dataset {c.dataset}")


def _check_devices(p, c):
    """--gpus, or --cluster with --gpus-per-host; True when the number of devices is known."""
    if c.cluster is None:
        if c.gpus_per_host is not None:
            p.add("--gpus-per-host sets the devices of each --cluster worker; without "
                  f"--cluster use --gpus. Received: --gpus-per-host {c.gpus_per_host}")
        if not p.check(checks.check_int, "--gpus", c.gpus, 1):
            return False
        if c.gpus > MAX_DEVICES:
            return p.check(checks.check_int, "--gpus", c.gpus, maximum=MAX_DEVICES,
                           valid=f"at most {MAX_DEVICES}", meaning="one device per pipeline stage")
        return True
    ok = True
    if c.gpus is not None:
        p.add("--gpus cannot go with --cluster: the stages are the workers' devices, "
              "--gpus-per-host on each worker (workers x --gpus-per-host stages). "
              f"Received: --gpus {c.gpus} with --cluster {c.cluster}")
        ok = False
    if c.gpus_per_host is not None and not p.check(checks.check_int, "--gpus-per-host",
                                                   c.gpus_per_host, 1):
        ok = False
    if c.mode not in modes.PIPELINE_MODES:
        p.add(f"--cluster places pipeline stages on the workers and needs one of the modes "
              f"{list(modes.PIPELINE_MODES)}. Received: --cluster with --mode {c.mode}")
        ok = False
    try:
        cluster = c.trainer_cluster
    except (TypeError, ValueError) as error:
        p.append(error)
        return False
    if ok and c.num_devices > MAX_DEVICES:
        p.add(f"--cluster with --gpus-per-host {c.gpus_per_host or 1} makes {c.num_devices} "
              f"stages ({cluster.num_workers} workers); at most {MAX_DEVICES} are allowed.")
        ok = False
    return ok


def _check_pipeline_flags(p, c, batch_ok, devices_ok=True):
    """--micro-batches, --schedule, --recompute and --cuts, against --mode, --batch-size
    and the devices."""
    pipeline = c.mode in modes.PIPELINE_MODES
    if p.check(checks.check_int, "--micro-batches", c.micro_batches, 1) and c.micro_batches > 1:
        if not pipeline:
            p.add(
                "--micro-batches > 1 splits the mini-batches of a pipeline; --mode "
                f"{c.mode} is no pipeline. Received: --micro-batches {c.micro_batches} with "
                f"--mode {c.mode}; use one of --mode {', '.join(modes.PIPELINE_MODES)}"
            )
        elif batch_ok:
            p.check(input_checks.check_micro_batch_split, None, c.batch_size, c.micro_batches,
                    flags=True)
    if p.check(checks.check_one_of, "--schedule", c.schedule, modes.SCHEDULES):
        if c.schedule != "gpipe" and c.mode != "sync":
            p.add(
                f"--schedule {c.schedule} orders the micro-batches of --mode sync; --mode "
                f"{c.mode} has its own schedule. Received: --schedule {c.schedule} with "
                f"--mode {c.mode}; use --mode sync, or --schedule gpipe (the default)"
            )
    if (p.check(checks.check_one_of, "--recompute", c.recompute, modes.RECOMPUTE)
            and c.recompute != "auto" and not pipeline):
        p.add(
            f"--recompute {c.recompute} is for the stages of a pipeline; --mode {c.mode} is "
            f"no pipeline. Received: --recompute {c.recompute} with --mode {c.mode}"
        )
    devices_ok = _check_replicas(p, c, batch_ok, devices_ok)
    cuts = c.cuts
    if cuts == "auto":
        return
    if not isinstance(cuts, tuple) or not all(isinstance(n, str) and n for n in cuts):
        p.append(TypeError(
            "--cuts must be 'auto' or a list of layer names. "
            f"{checks.received('--cuts', cuts)}"
        ))
    elif c.mode not in modes.PIPELINE_MODES:
        p.add(
            f"--cuts splits a pipeline and needs one of the modes {list(modes.PIPELINE_MODES)}. "
            f"Received: --cuts with --mode {c.mode}"
        )
    else:
        if devices_ok and len(cuts) + 1 != c.num_stages:
            where = (f"--gpus is {c.gpus}" if c.cluster is None else
                     f"--cluster with --gpus-per-host {c.gpus_per_host or 1} gives "
                     f"{c.num_devices} devices")
            per = ("one stage per device" if c.replicas == 1 else
                   f"{c.num_stages} stages in each of --replicas {c.replicas}")
            p.add(
                f"--cuts names {len(cuts)} layers, which makes {len(cuts) + 1} stages, but "
                f"{where}: give {c.num_stages - 1} cut layers ({per}). "
                f"Received: --cuts {','.join(cuts)}"
            )
        repeated = sorted({name for name in cuts if cuts.count(name) > 1})
        if repeated:
            p.add(
                f"--cuts must name each layer once. Received: --cuts {','.join(cuts)} "
                f"({', '.join(repeated)} repeated)"
            )


def _check_replicas(p, c, batch_ok, devices_ok):
    """--replicas: a pipeline mode, a divisor of the devices and of the batch size."""
    if not p.check(checks.check_int, "--replicas", c.replicas, 1):
        return False
    if c.replicas == 1:
        return devices_ok
    if c.mode not in modes.PIPELINE_MODES:
        p.add(f"--replicas copies a pipeline and needs one of the modes "
              f"{list(modes.PIPELINE_MODES)}; for data parallelism alone use --mode dp. "
              f"Received: --replicas {c.replicas} with --mode {c.mode}")
        return False
    if devices_ok and c.num_devices % c.replicas:
        p.add(f"--replicas must divide the devices ({c.num_devices}): each replica is a "
              f"pipeline of devices / replicas stages. Received: --replicas {c.replicas}")
        return False
    parts = c.replicas * c.micro_batches
    if batch_ok and c.batch_size % parts:
        p.add(f"--batch-size must split evenly across --replicas {c.replicas}"
              + (f" x --micro-batches {c.micro_batches}" if c.micro_batches > 1 else "")
              + f": a multiple of {parts}. Received: --batch-size {c.batch_size}")
    return devices_ok


def _check_data_dir(p, c):
    """--data-dir: an existing folder, unless --download may create it."""
    path = c.data_dir
    if not isinstance(path, str):
        return  # None, or not a path (said by _check_run_flags)
    if os.path.isfile(path):
        p.add(
            f"--data-dir must be a directory, but {path} is a file. Pass the folder that "
            "holds (or, with --download, will hold) the tensorflow-datasets data."
        )
    elif not c.download and not os.path.isdir(path):
        p.add(
            f"--data-dir {path} does not exist. Pass the folder that holds the prepared "
            "tensorflow-datasets data, or add --download to create it."
        )


def _check_run_flags(p, c):
    """Telemetry, checkpoint, fault-handling and output flags; the switches."""
    for name in PATH_FIELDS:
        if getattr(c, name) is not None:
            p.check(checks.check_path, flag(name), getattr(c, name), valid="a path")
    p.check(checks.check_int, "--log-every", c.log_every, 1, allow=("auto",),
            valid="'auto' or an integer >= 1")
    p.check(checks.check_int, "--prediction-every", c.prediction_every, 0, meaning="0: off")
    p.check(checks.check_int, "--steps-per-execution", c.steps_per_execution, 1,
            allow=("auto",), valid="'auto' or an integer >= 1")
    keep_ok = p.check(checks.check_int, "--keep-checkpoints", c.keep_checkpoints, 0,
                      meaning="0: no checkpoints")
    if c.resume and keep_ok and c.keep_checkpoints == 0:
        p.add("--resume needs checkpoints: it cannot be used with --keep-checkpoints 0")
    if c.resume and c.checkpoint_dir is None and c.logdir is None:
        p.add(
            "--resume needs to know where the checkpoints are: give --checkpoint-dir, or the "
            "--logdir of the run to continue (its checkpoints are in <logdir>/checkpoints)"
        )
    if p.check(checks.check_one_of, "--on-nan", c.on_nan, ON_NAN):
        if c.on_nan == "skip" and c.mode not in modes.PIPELINE_MODES:
            p.add(
                "--on-nan skip is only available for the pipeline modes "
                f"{list(modes.PIPELINE_MODES)}; with --mode {c.mode} use --on-nan stop"
            )
    if isinstance(c.export, str) and c.export != "none" and not c.export.endswith(".keras"):
        p.add(
            "--export must be a file name ending in .keras (or 'none'). "
            f"Received: --export {c.export}"
        )
    for name in SWITCHES:
        p.check(checks.check_bool, flag(name), getattr(c, name))
    p.check(checks.check_int, "verbose", c.verbose, 0, 2, allow=("auto",))


def _resolved_paths(c):
    """The output paths, defaults filled in (see `RunConfig`)."""
    logdir = c.logdir
    if logdir is None:
        if c.resume and c.checkpoint_dir is not None:
            logdir = os.path.dirname(os.path.abspath(c.checkpoint_dir))
        else:
            logdir = default_logdir(c.model, c.mode)
    checkpoint_dir = c.checkpoint_dir
    if checkpoint_dir is None:
        checkpoint_dir = os.path.join(logdir, "checkpoints")
    export = c.export
    if export is None:
        export = os.path.join(logdir, "model.keras")
    return {"logdir": logdir, "checkpoint_dir": checkpoint_dir, "export": export}
