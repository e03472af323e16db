"""The typed settings of one `train.py` run, checked when they are built.

`RunConfig` holds every flag of `train.py` as a typed field with its default: the parser in
`tf_spectrain.app.flags` takes its defaults from here, and `tf_spectrain.app.training` reads
the fields. Building one checks every field (`tf_spectrain.app.config_checks`) and reports
every problem at once, naming the flags (`--gpus`) since these are the command line's
settings, then fills in the paths left to their defaults. Creating the output directories
is left to `cli.parse_args`.
"""

import dataclasses
import os
import time

from tf_spectrain.app.config_checks import PATH_FIELDS, problems
from tf_spectrain.app.kinds import default_dataset, model_kind
from tf_spectrain.app.trainers import DEFAULT_LR, DEFAULT_WEIGHT_DECAY, OPTIMIZERS
from tf_spectrain.cluster import slots as cluster_slots

DEFAULT_GPUS = 4  # --gpus without --cluster
TF_CONFIG = "TF_CONFIG"  # --cluster TF_CONFIG: read the cluster from that variable


def default_logdir(model, mode):
    """The default log directory of a run: `runs/<model>-<mode>-<%Y%m%d-%H%M%S local time>`."""
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
    `accumulate` None means the number of stages (mode 2bw's mini-batches per update; no
    other mode takes it). `verbose` is no flag: the Keras
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
    trainer_address: str | None = None  # with --cluster; None: found from the route
    mode: str = "spectrain"
    cuts: tuple[str, ...] | str = "auto"
    spectrain_target: str = "paper"
    micro_batches: int = 1
    schedule: str = "gpipe"
    recompute: str = "auto"
    replicas: int = 1
    accumulate: int | None = None  # --mode 2bw's mini-batches per update; None: the stages
    stall_timeout: float = 60.0  # seconds without a finished pass; 0: never stop
    memory_limit: str | int | None = None  # per device: bytes, or a size such as "16GiB"
    plan: bool = False
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
    run_eagerly: bool = False
    graph: bool = False
    histograms: bool = False
    trace: bool = False
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
        found = problems(self)
        if found:
            wrong_types = all(isinstance(p, TypeError) for p in found)
            raise (ConfigTypeError if wrong_types else ConfigError)([str(p) for p in found])
        for name, value in _resolved_paths(self).items():
            object.__setattr__(self, name, value)

    @property
    def trainer_cluster(self):
        """The `tf_spectrain.cluster.Cluster` of `--cluster` (read from `TF_CONFIG` for
        `--cluster TF_CONFIG`), or None without `--cluster`."""
        if self.cluster is None:
            return None
        return cluster_slots.trainer_cluster(None if self.cluster == TF_CONFIG else self.cluster)

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
