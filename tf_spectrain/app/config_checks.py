"""The checks of a `RunConfig`: every problem of a run's settings, each naming its flag.

`problems(config)` runs every check and collects the errors instead of raising the first,
so that `train.py` reports every bad flag at once; `RunConfig` raises them together. The
checks read only the config's fields (and its `trainer_cluster`, `num_devices` and
`num_stages`), in the order the flags are documented.
"""

import dataclasses
import os

from tf_spectrain import checks, data, models
from tf_spectrain.app.kinds import KINDS, dataset_kind, model_kind
from tf_spectrain.app.trainers import OPTIMIZERS, PRECISIONS, check_nesterov_optimizer
from tf_spectrain.costmodel import parse_memory_size
from tf_spectrain.schedule import modes
from tf_spectrain.workflow import input_checks

MAX_DEVICES = 64
MAX_SEED = 2**32  # keras.utils.set_random_seed takes seeds below 2**32
PATH_FIELDS = ("logdir", "checkpoint_dir", "export", "data_dir")
SWITCHES = ("download", "graph", "histograms", "trace", "resume", "plan", "run_eagerly")


def flag(field):
    """The command-line flag of a `RunConfig` field: `batch_size` -> `--batch-size`."""
    return "--" + field.replace("_", "-")


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


def problems(config):
    """Every problem of a `RunConfig`'s fields, in the order the flags are documented.

    Args:
        config: the `RunConfig` being built (its defaults filled in, its paths not yet).

    Returns:
        A list of the problems' `ValueError`s and `TypeError`s; empty when all is well.
    """
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
    if optimizer_ok:
        p.check(check_nesterov_optimizer, c.mode, c.optimizer, flags=True)
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
        if c.trainer_address is not None:
            p.add("--trainer-address is where --cluster workers reach the trainer; without "
                  f"--cluster it has no use. Received: --trainer-address {c.trainer_address}")
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
    if c.trainer_address is not None:
        p.check(checks.check_instance, "--trainer-address", c.trainer_address, str,
                " ('host' or 'host:port')")
    if c.mode not in modes.PIPELINE_MODES + ("dp",):
        p.add(f"--cluster places pipeline stages (or with --mode dp, copies of the model) "
              f"on the workers and needs --mode dp or one of the modes "
              f"{list(modes.PIPELINE_MODES)}. Received: --cluster with --mode {c.mode}")
        ok = False
    try:
        cluster = c.trainer_cluster
    except (TypeError, ValueError) as error:
        p.append(error)
        return False
    if ok and c.mode == "dp" and isinstance(c.batch_size, int) and c.batch_size % c.num_devices:
        p.add(f"--batch-size must split evenly across the {c.num_devices} devices of "
              f"--cluster with --mode dp (one copy of the model each): a multiple of "
              f"{c.num_devices}. Received: --batch-size {c.batch_size}")
        ok = False
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
    _check_accumulate(p, c, devices_ok)
    _check_plan_flags(p, c)
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


def _check_accumulate(p, c, devices_ok):
    """--accumulate: --mode 2bw's mini-batches per update, an int >= the number of stages
    (when the devices tell it)."""
    if c.accumulate is None:
        return
    if not p.check(checks.check_int, "--accumulate", c.accumulate, 1,
                   meaning="mini-batches per update"):
        return
    if c.mode != "2bw":
        p.add(f"--accumulate is for --mode 2bw. Received: --accumulate {c.accumulate} with "
              f"--mode {c.mode}; leave it out, or use --mode 2bw (one update per "
              "--accumulate mini-batches)")
    elif devices_ok and c.accumulate < c.num_stages:
        p.add(f"--accumulate must be at least the number of stages ({c.num_stages}: "
              f"{_stages_text(c)}) in --mode 2bw: with fewer mini-batches per update an "
              "early stage's backward would need a third weight version, and 2BW keeps two "
              f"(docs/SPECTRAIN.md section 6e). Received: --accumulate {c.accumulate}; "
              f"leave it out for {c.num_stages}, or give more")


def _stages_text(c):
    """Where the number of stages comes from, for messages: `--gpus 4`, ...."""
    if c.cluster is None:
        where = f"--gpus {c.gpus}"
    else:
        where = f"--cluster with --gpus-per-host {c.gpus_per_host or 1}"
    return where if c.replicas == 1 else f"{where} over --replicas {c.replicas}"


def _check_plan_flags(p, c):
    """--memory-limit (a size; it steers --cuts auto, or is checked by --plan) and --plan."""
    if c.memory_limit is not None and p.check(parse_memory_size, c.memory_limit,
                                              name="--memory-limit"):
        if not c.plan and c.mode not in modes.PIPELINE_MODES:
            p.add(f"--memory-limit steers the planned cuts of a pipeline (a mode among "
                  f"{list(modes.PIPELINE_MODES)}); to check --mode {c.mode} against it, add "
                  f"--plan. Received: --memory-limit {c.memory_limit} with --mode {c.mode}")
        elif not c.plan and c.cuts != "auto":
            p.add("--memory-limit steers the planned cuts (--cuts auto); to check given "
                  "cuts against it, add --plan. Received: --memory-limit "
                  f"{c.memory_limit} with --cuts {_cuts_text(c.cuts)}")
    default = {f.name: f.default for f in dataclasses.fields(c)}["stall_timeout"]
    if p.check(checks.check_number, "--stall-timeout", c.stall_timeout, 0,
               meaning="seconds; 0: never stop") and c.stall_timeout != default and (
                   c.mode not in modes.PIPELINE_MODES):
        p.add(f"--stall-timeout watches the stages of a pipeline (a mode among "
              f"{list(modes.PIPELINE_MODES)}). Received: --stall-timeout {c.stall_timeout:g} "
              f"with --mode {c.mode}")
    if c.trace is True and c.mode not in modes.PIPELINE_MODES:
        p.add(f"--trace draws the stages of a pipeline (a mode among "
              f"{list(modes.PIPELINE_MODES)}). Received: --trace with --mode {c.mode}")
    if c.plan is True and c.cluster is not None:
        p.add("--plan prices the stages on this machine's devices; it cannot go with "
              f"--cluster. Received: --plan with --cluster {c.cluster}; use --gpus N")


def _cuts_text(cuts):
    """--cuts as typed."""
    return cuts if isinstance(cuts, str) else ",".join(map(str, cuts))


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
    if p.check(checks.check_one_of, "--on-nan", c.on_nan, modes.ON_NAN):
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
