"""Builds the trainer of one mode: a compiled `keras.Model` or a compiled `PipelineModel`.

`train.py` (`tf_spectrain.app.training`) and the benchmarks build their trainers here, so a
mode means the same model, optimizer and placement everywhere:

- `single`: the model on the first device, `keras.optimizers.SGD` (or AdamW);
- `dp`: the model replicated on every device by `tf.distribute.MirroredStrategy`; across
  hosts (`across_hosts`), a `PipelineModel` of one stage replicated on every device (each
  mini-batch split evenly, the copies' gradients summed before every update: the same
  steps), since Keras' `fit` cannot run under `MultiWorkerMirroredStrategy`
  (keras-team/keras#20585) and a trainer that holds no worker slot is no client of one;
- a pipeline mode (`modes.PIPELINE_MODES`): a `PipelineModel` of one stage per device,
  `SpecTrainSGD` (or AdamW, wrapped in `SpecTrain` in spectrain mode) in every stage (in
  nesterov mode the pipeline gives each stage the Nesterov form of it instead:
  `prediction.nesterov_form`), the model built on `/CPU:0` when the devices are not all
  CPUs (the stages are placed copies).

Every mode builds its model under the Keras dtype policy `precision` (`PRECISIONS`).
"""

import contextlib
import warnings

import keras
import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.costmodel import parse_memory_size
from tf_spectrain.partition import model_memory
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.schedule import modes

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
"""The Keras dtype policies a trainer's model can be built under (`--precision`)."""


@contextlib.contextmanager
def precision_policy(precision):
    """Makes `precision` Keras' global dtype policy inside the block, then restores the old one.

    A model built inside keeps the policy (its layers compute in its compute dtype, its
    variables stay float32); nothing else sees it afterwards.

    Args:
        precision: one of `PRECISIONS`.

    Raises:
        ValueError: `precision` is not one of `PRECISIONS`.
    """
    checks.check_one_of("precision", precision, PRECISIONS)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


OPTIMIZERS = ("sgd", "adamw")
NESTEROV_FORMS = ("sgd", "adam", "adamw", "nadam")
"""The optimizers that have a Nesterov form (`prediction.nesterov_form`), by `--optimizer` name."""
NESTEROV_OPTIMIZERS = tuple(name for name in OPTIMIZERS if name in NESTEROV_FORMS)
"""The `OPTIMIZERS` that mode `nesterov` takes."""
# The default learning rate and weight decay of each optimizer (train.py's --lr and
# --weight-decay): SGD's suit the image models, AdamW's the text models.
DEFAULT_LR = {"sgd": 0.01, "adamw": 1e-3}
DEFAULT_WEIGHT_DECAY = {"sgd": 5e-4, "adamw": 0.01}


def sgd(cls, learning_rate, momentum=0.0, weight_decay=None):
    """A new momentum SGD of class `cls` (`keras.optimizers.SGD` or `SpecTrainSGD`); a
    `weight_decay` of 0 means none, as None does."""
    return cls(learning_rate=learning_rate, momentum=momentum, weight_decay=weight_decay or None)


def make_optimizer(name, learning_rate, momentum=0.0, weight_decay=None, pipeline=False):
    """Builds the optimizer `name` of `OPTIMIZERS` with a run's settings.

    Args:
        name: `"sgd"` (momentum SGD: `SpecTrainSGD` for a pipeline, Keras' SGD otherwise)
            or `"adamw"` (Keras' AdamW, its `beta_1`, `beta_2` and `epsilon` the defaults;
            a pipeline in `spectrain` mode wraps it in `tf_spectrain.SpecTrain`).
        learning_rate: the learning rate.
        momentum: SGD's momentum (not used by AdamW).
        weight_decay: the (decoupled) weight decay, or 0 or None for none.
        pipeline: whether the optimizer is for a `PipelineModel`.

    Returns:
        A new Keras optimizer.

    Raises:
        ValueError: an unknown `name`.
    """
    checks.check_one_of("optimizer", name, OPTIMIZERS)
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate=learning_rate,
                                      weight_decay=weight_decay or None)
    cls = SpecTrainSGD if pipeline else keras.optimizers.SGD
    return sgd(cls, learning_rate, momentum, weight_decay)


def check_nesterov_optimizer(mode, optimizer, flags=False):
    """Refuses in mode `"nesterov"` an optimizer of `OPTIMIZERS` that has no Nesterov form.

    Args:
        mode: the run's mode.
        optimizer: a name of `OPTIMIZERS`.
        flags: whether the message names train.py's flags (`--optimizer`) or the arguments.

    Raises:
        ValueError: mode `"nesterov"` with an optimizer not in `NESTEROV_OPTIMIZERS`; the
            message names those.
    """
    if mode != "nesterov" or optimizer in NESTEROV_OPTIMIZERS:
        return
    supported = " or ".join(NESTEROV_OPTIMIZERS)
    if flags:
        received = f"--optimizer {optimizer} with --mode nesterov; use --optimizer {supported}"
    else:
        received = f"optimizer={optimizer!r} with mode='nesterov'; use {supported}"
    raise ValueError(
        f"{'--mode' if flags else 'mode'} nesterov runs each stage's optimizer in its "
        f"Nesterov form, which only {' and '.join(NESTEROV_OPTIMIZERS)} have here "
        f"(docs/SPECTRAIN.md section 6e). Received: {received}, or another mode"
    )


def build_trainer(
    build_model,
    mode,
    devices,
    *,
    learning_rate,
    optimizer="sgd",
    momentum=0.0,
    weight_decay=None,
    cuts="auto",
    spectrain_target="paper",
    micro_batches=1,
    schedule="gpipe",
    recompute="auto",
    replicas=1,
    loss=None,
    metrics=None,
    batch_size=32,
    precision="float32",
    steps_per_execution="auto",
    run_eagerly=False,
    memory_limit=None,
    accumulate=None,
    across_hosts=False,
):
    """Builds and compiles the trainer of `mode` on `devices`.

    For `single` and `dp` the model is built inside the device or strategy scope. A
    pipeline's stages are copies placed by `PipelineModel`, so its model is built on
    `/CPU:0` when a stage device is not a CPU (`model_memory.model_build_device`: the
    wrapped model is then no extra copy on the first GPU), else outside any scope. The
    caller seeds the random generators first if it wants reproducible initial weights.

    Args:
        build_model: a function of no arguments that returns a new functional `keras.Model`.
        mode: one of `modes.ALL_MODES`.
        devices: the device names: the first for `single`, the replicas for `dp`, one per
            stage for a pipeline.
        learning_rate: the learning rate.
        optimizer: `"sgd"` or `"adamw"` (see `make_optimizer`).
        momentum, weight_decay: SGD's momentum, and the weight decay (0 or None: none).
        cuts: pipelines: the cut layer names, or a function of the model that returns them,
            or "auto" (or None) for cuts planned from measured time at `batch_size`
            (`PipelineModel(cuts="auto")`).
        spectrain_target, micro_batches, schedule, recompute, replicas: pipelines: as
            `PipelineModel` (with replicas, `devices` holds replica r's stage k at
            `r * stages + k`).
        loss: the loss; None means sparse categorical cross-entropy on logits.
        metrics: the compiled metrics (e.g. `["accuracy"]`), or None.
        batch_size: pipelines with "auto" cuts: the batch size to profile and plan at.
        precision: the Keras dtype policy the model is built under (`PRECISIONS`);
            `mixed_float16` scales the loss dynamically, as `keras.Model.compile` does.
        steps_per_execution: mini-batches per graph call (`compile`'s argument); "auto"
            is the pipeline's default, and 1 (Keras' default) for `single` and `dp`.
        run_eagerly: `compile`'s argument: a pipeline runs pass by pass (without its
            warning: the caller asked for it), `single` and `dp` run Keras' step eagerly.
        memory_limit: pipelines with "auto" cuts: None or the memory each device may use
            (bytes, or a size such as "16GiB"); only cuts whose stages fit are planned.
        accumulate: mode `"2bw"`: mini-batches per update, an int >= the number of stages,
            or None for that number (`PipelineModel`); None in every other mode.
        across_hosts: mode `"dp"` on workers' devices (`--cluster`): the pipeline's
            replicas of one stage, a mode `"sync"` `PipelineModel` (see the module).

    Returns:
        The compiled `keras.Model` for `single` and `dp`, else (`dp` across hosts too) the
        compiled `PipelineModel`.

    Raises:
        ValueError: for an unknown mode, optimizer or precision, an optimizer mode
            `"nesterov"` has no form of (`NESTEROV_OPTIMIZERS`), `accumulate` outside mode
            `"2bw"`, or no devices (and what `PipelineModel` raises).
        TypeError: if `build_model` is not a function (a model is not) or `devices` not a
            list or tuple.
    """
    checks.check_one_of("mode", mode, modes.ALL_MODES)
    checks.check_one_of("precision", precision, PRECISIONS)
    checks.check_one_of("optimizer", optimizer, OPTIMIZERS)
    check_nesterov_optimizer(mode, optimizer)
    modes.check_accumulate(accumulate, mode)
    if isinstance(build_model, keras.Model) or not callable(build_model):
        raise TypeError(
            "`build_model` must be a function of no arguments that returns a new "
            f"keras.Model. {checks.received('build_model', build_model)}"
        )
    devices = list(checks.check_instance("devices", devices, (list, tuple)))
    if not devices:
        raise ValueError("`devices` must name at least one device. Received: devices=[]")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True) if loss is None else loss
    settings = dict(learning_rate=learning_rate, momentum=momentum, weight_decay=weight_decay)
    settings = dict(settings, name=optimizer)
    if mode == "dp" and across_hosts:
        mode, cuts, replicas = "sync", [], len(devices)
    if mode in modes.BASELINES:
        scope = (
            tf.distribute.MirroredStrategy(devices).scope()
            if mode == "dp"
            else tf.device(devices[0])
        )
        with scope:
            with precision_policy(precision):
                model = build_model()
            model.compile(optimizer=make_optimizer(**settings), loss=loss, metrics=metrics,
                          steps_per_execution=(1 if steps_per_execution == "auto"
                                               else steps_per_execution),
                          run_eagerly=run_eagerly)
        return model
    build_device = model_memory.model_build_device(devices)
    with tf.device(build_device) if build_device else contextlib.nullcontext():
        with precision_policy(precision):
            model = build_model()
    if cuts is None:
        cuts = "auto"
    elif callable(cuts):
        cuts = cuts(model)
    pipe = PipelineModel(
        model,
        cuts=cuts,
        devices=devices,
        mode=mode,
        spectrain_target=spectrain_target,
        micro_batches=micro_batches,
        schedule=schedule,
        recompute=recompute,
        replicas=replicas,
        profile_batch_size=max(1, batch_size // replicas),  # what each replica runs
        memory_limit=None if memory_limit is None else parse_memory_size(memory_limit),
        accumulate=accumulate,
    )
    with warnings.catch_warnings():
        if run_eagerly:  # asked for by name: no warning of what it does
            warnings.filterwarnings("ignore", message=".*run_eagerly=True")
        pipe.compile(optimizer=make_optimizer(pipeline=True, **settings), loss=loss,
                     metrics=metrics, steps_per_execution=steps_per_execution,
                     run_eagerly=run_eagerly)
    return pipe
