"""What a trainer's training state is, and saving and restoring it exactly.

    ckpt = tf_spectrain.checkpoint.PipelineCheckpoint("ckpts", keep=3, metadata={"seed": 0})
    pipe.fit(..., callbacks=[ckpt])                       # saves at every epoch end
    # later, in a new process, after building and compiling the same model (any cuts):
    info = tf_spectrain.checkpoint.restore_checkpoint(pipe, latest_checkpoint("ckpts"))
    pipe.fit(..., initial_epoch=info["epoch"])

A pipeline checkpoint holds, by the wrapped model's variables and not by stage
(`tf_spectrain.checkpoint.layout`), every variable (weights, BatchNorm statistics, the
random-generator state of dropout layers) and every optimizer slot (momentum, Adam's
moments, SpecTrain's last updates) of every weight, and per stage the optimizer's scalars
(iteration count, learning rate) and, with dynamic loss scaling (mixed_float16), the loss
scale and growth counter; the pipeline's `shuffle_seed` and `epochs_trained` (the order of
shuffled arrays in the next epochs), plus a description of the run: the model's layers and
weight shapes, the cuts, the mode, the optimizer class and whatever `metadata` the caller
adds. So it restores into a pipeline of other cuts, another number of stages, other
devices or replicas. A compiled `keras.Model` is checkpointed as one part. Restoring checks
everything first and assigns nothing unless all of it fits.
"""

import contextlib

import keras
import numpy as np

from tf_spectrain import prediction
from tf_spectrain.checkpoint import compat, pipeline_layout, store
from tf_spectrain.checkpoint.format import CheckpointError
from tf_spectrain.pipeline_model import PipelineModel

# What must match for a checkpoint to be restored (the caller's metadata keys are added):
# what decides which weights each pass uses. Not the cuts, the number of stages, replicas,
# micro-batches or 2bw's `accumulate`: a pipeline checkpoint is re-cut on restore, and is
# written drained, with no gradient held for a later update (docs/SPECTRAIN.md, 6d).
COMPARED = (
    "kind",
    "architecture",
    "mode",
    "spectrain_target",
    "optimizer",
    "loss_scale",
)


def trainer_model(trainer):
    """The Keras model `trainer` trains: a `PipelineModel`'s `model`, or `trainer` itself."""
    return trainer.model if isinstance(trainer, PipelineModel) else trainer


def is_pipeline(trainer):
    """Whether `trainer` is a `tf_spectrain.PipelineModel`."""
    return isinstance(trainer, PipelineModel)


def trainer_optimizers(trainer):
    """The optimizers of `trainer`: each stage's for a pipeline, else the model's one.

    Args:
        trainer: a compiled `PipelineModel` or `keras.Model`.

    Returns:
        A list of optimizers.

    Raises:
        TypeError: `trainer` is neither.
        ValueError: a pipeline that is not compiled.
    """
    if is_pipeline(trainer):
        return list(trainer.stage_optimizers)
    _check_keras_model(trainer)
    return [trainer.optimizer]


def _check_keras_model(trainer):
    """Refuses what is neither a pipeline nor a keras.Model."""
    if not isinstance(trainer, keras.Model):
        raise TypeError(
            "Checkpoints need a `tf_spectrain.PipelineModel` or a compiled keras.Model. "
            f"Received: {type(trainer).__name__}"
        )


def _parts(trainer):
    """`[(prefix, variables)]` of everything a checkpoint of a `keras.Model` holds."""
    _check_keras_model(trainer)
    optimizer = getattr(trainer, "optimizer", None)
    if optimizer is None:
        raise ValueError("The keras.Model must be compiled (with an optimizer) to be checkpointed.")
    if not optimizer.built:
        with _scope(trainer):
            optimizer.build(trainer.trainable_variables)
    return [
        ("model/variables", list(trainer.variables)),
        ("model/optimizer", list(optimizer.variables)),
    ]


def _scope(model):
    """The distribution strategy scope of `model` (a null context without one)."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None:
        return strategy.scope()
    return contextlib.nullcontext()


def describe_run(trainer):
    """The metadata that identifies what a checkpoint belongs to.

    Args:
        trainer: a compiled `PipelineModel` or `keras.Model`.

    Returns:
        A JSON-serialisable dict: `kind` ("pipeline" or "keras"), `model` (its name),
        `architecture` (layer types and weight shapes), `optimizer` (its class name) and,
        for a pipeline, `num_stages`, `cuts`, `mode`, `spectrain_target`, `micro_batches`,
        `replicas`, `accumulate` in mode "2bw" (mini-batches per update) and `loss_scale`
        ("dynamic") when its loss is scaled (a Keras model's optimizer is then a
        `LossScaleOptimizer`). Only `kind`, `architecture`, `mode`, `spectrain_target`,
        `optimizer` and `loss_scale` must match on restore (`COMPARED`): a checkpoint is
        written drained, with no gradient held for a later 2bw update, so it resumes with
        another `accumulate` (as with another number of micro-batches).

    Raises:
        TypeError: `trainer` is neither a `PipelineModel` nor a `keras.Model`.
        ValueError: a pipeline that is not compiled.
    """
    pipeline = is_pipeline(trainer)
    optimizer = trainer_optimizers(trainer)[-1]
    model = trainer_model(trainer)
    # Layer types and weight shapes, not names: Keras numbers unnamed layers by how many
    # were built before in the process, so names differ between equal models.
    architecture = [
        f"{type(layer).__name__}{[list(w.shape) for w in layer.weights]}" for layer in model.layers
    ]
    info = {
        "kind": "pipeline" if pipeline else "keras",
        "model": model.name,
        "architecture": architecture,
        "optimizer": _optimizer_name(optimizer),
    }
    if pipeline:
        info.update(
            num_stages=trainer.num_stages,
            cuts=list(trainer.cuts),
            mode=trainer.mode,
            spectrain_target=trainer.spectrain_target,
            micro_batches=trainer.micro_batches,
            replicas=trainer.replicas,
        )
        if trainer.mode == "2bw":  # what an update averages; a drained state holds no part
            info["accumulate"] = trainer.options.updates_every(trainer.num_stages)
        if trainer.runners[-1].loss_scale is not None:
            info["loss_scale"] = "dynamic"
    return info


def _optimizer_name(optimizer):
    """`SpecTrainSGD`, `AdamW`, or `SpecTrain(AdamW)` for a wrapped Keras optimizer."""
    if type(optimizer) is prediction.SpecTrain:
        return f"SpecTrain({type(optimizer.inner_optimizer).__name__})"
    return type(optimizer).__name__


def save(trainer, directory, *, epoch, batch=0, keep=3, metadata=None):
    """Saves `trainer`'s full training state as one checkpoint.

    Args:
        trainer: a compiled `PipelineModel` (between epochs) or `keras.Model`.
        directory: the checkpoint directory.
        epoch: completed epochs.
        batch: mini-batches done of the epoch in progress.
        keep: keep only the newest `keep` checkpoints (None: all).
        metadata: extra JSON-serialisable facts about the run, checked on restore.

    Returns:
        The checkpoint's path.

    Raises:
        TypeError, ValueError: see `describe_run` and `store.save_checkpoint`.
        OSError: the checkpoint could not be written.
    """
    meta = dict(describe_run(trainer), extra=dict(metadata or {}))
    if is_pipeline(trainer):
        arrays, layout_meta = pipeline_layout.save_arrays(trainer)  # by model variable
        meta.update(layout_meta)
        # The order of shuffled arrays in the next epochs.
        meta["shuffle_seed"], meta["epochs_trained"] = trainer.shuffle_seed, trainer.epochs_trained
    else:
        arrays = {}
        for prefix, variables in _parts(trainer):
            for j, v in enumerate(variables):
                arrays[f"{prefix}/{j}"] = np.asarray(keras.ops.convert_to_numpy(v.value))
    return store.save_checkpoint(directory, arrays, meta, epoch=epoch, batch=batch, keep=keep)


def restore_checkpoint(trainer, path, metadata=None):
    """Loads a checkpoint into `trainer` (all or nothing); returns its info.

    A pipeline checkpoint restores into a pipeline of the same model with any cuts, number
    of stages, devices or replicas: each variable and optimizer slot goes to the stage
    that now holds its layer. A pipeline whose cuts were planned (`cuts="auto"`) with the
    checkpoint's number of stages is first re-cut at the checkpoint's cuts
    (`PipelineModel.use_cuts`), so that a plan that came out differently this time does
    not change the run; given cuts, or another number of stages, are kept. With another
    number of stages each stage takes the update count and learning rate of the saved
    last stage, and the smallest saved loss scale (docs/SPECTRAIN.md section 6d).
    Older checkpoints, saved by stage (their metadata has no `layout`), restore too:
    they are converted by splitting the model at their cuts.

    Args:
        trainer: the compiled `PipelineModel` or `keras.Model` to restore, built the same
            way as the one that was saved (for a pipeline: the same model, mode,
            SpecTrain target, optimizer and loss scaling; any cuts, devices, replicas
            and micro-batches).
        path: a checkpoint path (see `tf_spectrain.checkpoint.latest_checkpoint`).
        metadata: the extra facts of this run; they must equal the saved ones.

    Returns:
        The checkpoint's info dict: `epoch` (completed epochs: pass it to `fit` as
        `initial_epoch`), `batch` (mini-batches of that epoch already done, for a
        checkpoint written on an interruption), `metadata` (its `cuts` are those it was
        saved with), `path`.

    Raises:
        CheckpointError (a ValueError): a corrupt checkpoint (naming the file) or one
            written by a different model, mode or run (saying what differs).
        TypeError: `trainer` is neither a `PipelineModel` nor a `keras.Model`.
    """
    arrays, info = store.load_checkpoint(path)
    saved = info["metadata"]
    _use_saved_cuts(trainer, saved)
    current = dict(describe_run(trainer), extra=dict(metadata or {}))
    keys = list(COMPARED) + [f"extra.{k}" for k in sorted(current["extra"])]
    compat.check_compatible(dict(info, metadata=flatten_metadata(saved)),
                            flatten_metadata(current), keys)
    if is_pipeline(trainer):
        assignments = pipeline_layout.assignments(trainer, arrays, saved, path)
    else:
        assignments = _keras_assignments(trainer, arrays, path)
    for v, value in assignments:
        v.assign(value.astype(v.dtype) if hasattr(value, "astype") else value)
    if is_pipeline(trainer):
        if "shuffle_seed" in saved:
            trainer.shuffle_seed = int(saved["shuffle_seed"])
            trainer.epochs_trained = int(saved["epochs_trained"])
        trainer.sync_replicas()  # a checkpoint holds replica 0; the others take its state
        _sync_loss_scales(trainer)
        trainer.stages_moved_on()
        trainer.copy_weights_to_model()  # the wrapped model shows the restored weights
    return info


def _keras_assignments(trainer, arrays, path):
    """`[(variable, array)]` of a keras.Model's checkpoint, checked."""
    parts = _parts(trainer)
    assignments = []
    for prefix, variables in parts:
        for j, v in enumerate(variables):
            assignments.append((v, pipeline_layout.checked_array(arrays, f"{prefix}/{j}", v,
                                                                 path)))
    expected = {f"{prefix}/{j}" for prefix, vs in parts for j in range(len(vs))}
    extra = sorted(set(arrays) - expected)
    if extra:
        raise CheckpointError(
            f"Checkpoint {path} holds values this model does not have ({', '.join(extra[:5])}"
            f"{', ...' if len(extra) > 5 else ''}): it was written by a different model or "
            "optimizer."
        )
    return assignments


def _sync_loss_scales(trainer):
    """Gives every replica's stage k the loss scale restored into replica 0's."""
    first, *others = trainer.replica_runners
    for runners in others:
        for source, copy in zip(first, runners):
            if source.loss_scale is not None:
                for s, d in zip(source.loss_scale.variables, copy.loss_scale.variables):
                    d.assign(s.value)


def _use_saved_cuts(trainer, saved):
    """A pipeline with planned cuts takes the checkpoint's cuts (same number of stages)."""
    if not is_pipeline(trainer) or not trainer.planned_cuts:
        return
    cuts = saved.get("cuts")
    if isinstance(cuts, list) and len(cuts) == len(trainer.cuts) and cuts != trainer.cuts:
        try:
            trainer.use_cuts(cuts)
        except (TypeError, ValueError):
            pass  # not layers of this model: the comparison below says what differs


def flatten_metadata(meta):
    """A checkpoint's metadata with its `extra` entries as `extra.<key>`, so that they are
    compared one by one."""
    flat = {k: v for k, v in meta.items() if k != "extra"}
    for k, v in (meta.get("extra") or {}).items():
        flat[f"extra.{k}"] = v
    return flat
