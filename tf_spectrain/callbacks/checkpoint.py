"""Checkpoints of a pipeline (or a plain Keras model) that resume training exactly.

    ckpt = tf_spectrain.callbacks.PipelineCheckpoint("ckpts", keep=3, metadata={"seed": 0})
    pipe.fit(..., callbacks=[ckpt])                       # saves at every epoch end
    # later, in a new process, after building and compiling the same pipeline:
    info = tf_spectrain.callbacks.restore_checkpoint(pipe, latest_checkpoint("ckpts"))
    pipe.fit(..., initial_epoch=info["epoch"])

A checkpoint holds, for every stage, all its variables (weights, BatchNorm statistics, the
random-generator state of dropout layers) and all its optimizer's variables (momentum,
iteration count, learning rate), plus a description of the run: the model's layers and
weight shapes, the cuts, the mode, the optimizer class and whatever `metadata` the caller
adds (train.py adds the dataset, batch size and seed, which fix the data order of every
epoch: see `tf_spectrain.data.load_epochs`). Storage is atomic and checksummed
(`tf_spectrain.checkpoint_store`). Restoring checks everything first and assigns nothing
unless all of it fits: a checkpoint of another model, other cuts or another mode is
refused with the list of differences.
"""

import json

import keras
import numpy as np

from tf_spectrain import checkpoint_store

# What must match for a checkpoint to be restored (the caller's metadata keys are added).
COMPARED = (
    "kind",
    "architecture",
    "num_stages",
    "cuts",
    "mode",
    "spectrain_target",
    "micro_batches",
    "optimizer",
)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); earlier ones are intact."""

    located = True  # the message says what failed


def _is_pipeline(trainer):
    return hasattr(trainer, "runners") and hasattr(trainer, "stages")


def _parts(trainer):
    """`[(prefix, variables)]` of everything a checkpoint holds."""
    if _is_pipeline(trainer):
        runners = trainer._require_compiled()  # noqa: SLF001
        parts = []
        for k, (stage, runner) in enumerate(zip(trainer.stages, runners)):
            parts.append((f"stage{k}/variables", list(stage.variables)))
            parts.append((f"stage{k}/optimizer", list(runner.optimizer.variables)))
        return parts
    if not isinstance(trainer, keras.Model):
        raise TypeError(
            "Checkpoints need a `tf_spectrain.PipelineModel` or a compiled keras.Model. "
            f"Received: {type(trainer).__name__}"
        )
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
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None:
        return strategy.scope()
    import contextlib

    return contextlib.nullcontext()


def describe_run(trainer):
    """The metadata that identifies what a checkpoint belongs to (JSON-serialisable)."""
    pipeline = _is_pipeline(trainer)
    model = trainer.model if pipeline else trainer
    optimizer = trainer.runners[-1].optimizer if pipeline else trainer.optimizer
    # Layer types and weight shapes, not names: Keras numbers unnamed layers by how many
    # were built before in the process, so names differ between equal models.
    architecture = [
        f"{type(layer).__name__}{[list(w.shape) for w in layer.weights]}" for layer in model.layers
    ]
    info = {
        "kind": "pipeline" if pipeline else "keras",
        "model": model.name,
        "architecture": architecture,
        "optimizer": type(optimizer).__name__,
    }
    if pipeline:
        info.update(
            num_stages=trainer.num_stages,
            cuts=list(trainer.cuts),
            mode=trainer.mode,
            spectrain_target=trainer.spectrain_target,
            micro_batches=trainer.micro_batches,
        )
    return info


def save(trainer, directory, *, epoch, batch=0, keep=3, metadata=None):
    """Saves `trainer`'s full training state; returns the checkpoint's path.

    Args:
        trainer: a compiled `PipelineModel` (between epochs) or keras.Model.
        directory: the checkpoint directory.
        epoch: completed epochs; batch: mini-batches done of the epoch in progress.
        keep: keep only the newest `keep` checkpoints (None: all).
        metadata: extra JSON-serialisable facts about the run, checked on restore.
    """
    arrays = {}
    for prefix, variables in _parts(trainer):
        for j, v in enumerate(variables):
            arrays[f"{prefix}/{j}"] = np.asarray(keras.ops.convert_to_numpy(v.value))
    meta = dict(describe_run(trainer), extra=dict(metadata or {}))
    if _is_pipeline(trainer):
        # The order of shuffled arrays in the next epochs.
        meta["shuffle_seed"], meta["epochs_trained"] = trainer.shuffle_seed, trainer.epochs_trained
    return checkpoint_store.save_checkpoint(
        directory, arrays, meta, epoch=epoch, batch=batch, keep=keep
    )


def restore_checkpoint(trainer, path, metadata=None):
    """Loads a checkpoint into `trainer` (all or nothing); returns its info.

    Args:
        trainer: the compiled `PipelineModel` or keras.Model to restore, built the same
            way as the one that was saved.
        path: a checkpoint path (see `checkpoint_store.latest_checkpoint`).
        metadata: the extra facts of this run; they must equal the saved ones.

    Returns:
        The checkpoint's info dict: `epoch` (completed epochs: pass it to `fit` as
        `initial_epoch`), `batch` (mini-batches of that epoch already done, for a
        checkpoint written on an interruption), `metadata`, `path`.

    Raises:
        checkpoint_store.CheckpointError (a ValueError): a corrupt checkpoint (naming the
            file) or one written by a different model, cuts, mode or run (saying what
            differs).
    """
    arrays, info = checkpoint_store.load_checkpoint(path)
    current = dict(describe_run(trainer), extra=dict(metadata or {}))
    saved = info["metadata"]
    keys = list(COMPARED) + [f"extra.{k}" for k in sorted(current["extra"])]
    checkpoint_store.check_compatible(
        dict(info, metadata=_flatten(saved)), _flatten(current), keys
    )
    assignments = []
    for prefix, variables in _parts(trainer):
        for j, v in enumerate(variables):
            key = f"{prefix}/{j}"
            if key not in arrays:
                raise checkpoint_store.CheckpointError(
                    f"Checkpoint {path} has no value for {key} ({v.path}): it was written by "
                    "a different model or optimizer."
                )
            value = arrays[key]
            if tuple(value.shape) != tuple(v.shape):
                raise checkpoint_store.CheckpointError(
                    f"Checkpoint {path}: {key} ({v.path}) has shape {tuple(value.shape)} but "
                    f"this model's variable has shape {tuple(v.shape)}."
                )
            assignments.append((v, value))
    expected = {f"{prefix}/{j}" for prefix, vs in _parts(trainer) for j in range(len(vs))}
    extra = sorted(set(arrays) - expected)
    if extra:
        raise checkpoint_store.CheckpointError(
            f"Checkpoint {path} holds values this model does not have ({', '.join(extra[:5])}"
            f"{', ...' if len(extra) > 5 else ''}): it was written by a different model or "
            "optimizer."
        )
    for v, value in assignments:
        v.assign(value.astype(v.dtype) if hasattr(value, "astype") else value)
    if _is_pipeline(trainer) and "shuffle_seed" in saved:
        trainer.shuffle_seed = int(saved["shuffle_seed"])
        trainer.epochs_trained = int(saved["epochs_trained"])
    if _is_pipeline(trainer):
        trainer.copy_weights_to_model()  # the wrapped model shows the restored weights
    return info


def _flatten(meta):
    """`extra` entries as `extra.<key>` so that they are compared one by one."""
    flat = {k: v for k, v in meta.items() if k != "extra"}
    for k, v in (meta.get("extra") or {}).items():
        flat[f"extra.{k}"] = v
    return flat


class PipelineCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint at every epoch end (after the pipeline has drained).

    When training is stopped early (`model.stop_training`, `PipelineModel.request_stop`,
    e.g. on SIGINT in train.py), the checkpoint of that shortened epoch records how many
    of its mini-batches were done, so the run can go on from there.

    Args:
        directory: where to write checkpoints (created; must be writable).
        keep: how many of the newest checkpoints to keep (an int >= 1, or None for all).
        metadata: extra JSON-serialisable facts about the run, checked on restore (e.g.
            the dataset, batch size and seed that fix the data order).

    Attributes:
        last_path: the newest checkpoint written (None before the first).
        last_position: its `(epoch, batch)`.
        resume_batch: set it when `fit` resumes an epoch in its middle with the rest of
            that epoch (the restored checkpoint's `batch`): the first epoch's progress is
            then counted from there.

    Raises:
        ValueError: if `directory` cannot be written or `keep` is invalid.
    """

    def __init__(self, directory, keep=3, metadata=None):
        super().__init__()
        if keep is not None and (
            isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 1
        ):
            raise ValueError(f"`keep` must be an integer >= 1 or None. Received: keep={keep!r}")
        checkpoint_store.check_writable_dir(directory, "directory")
        try:
            json.dumps(dict(metadata or {}), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(
                "`metadata` must be a dict of JSON values (str, numbers, bools, None, lists, "
                f"dicts). Received: metadata={metadata!r} ({error})"
            ) from None
        self.directory = directory
        self.keep = keep
        self.metadata = dict(metadata or {})
        self.pipeline = None
        self.last_path = None
        self.last_position = None  # (epoch, batch) of last_path
        self.resume_batch = 0

    def set_pipeline(self, pipeline):
        """Called by `PipelineModel.fit`: checkpoint the pipeline's stages."""
        self.pipeline = pipeline

    def on_epoch_begin(self, epoch, logs=None):
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        if self.pipeline is not None:
            _, done, total = self.pipeline.epoch_progress
            trainer = self.pipeline
        else:
            done, total = self._batches, self.params.get("steps") or self._batches
            trainer = self.model
        if self.resume_batch:
            done, total = done + self.resume_batch, total + self.resume_batch
            self.resume_batch = 0
        if done >= total:
            where = dict(epoch=epoch + 1, batch=0)
        else:
            where = dict(epoch=epoch, batch=done)
        try:
            self.last_path = save(
                trainer, self.directory, keep=self.keep, metadata=self.metadata, **where
            )
        except OSError as error:
            newest = checkpoint_store.latest_checkpoint(self.directory)
            raise CheckpointWriteError(
                f"Could not write the checkpoint of epoch {where['epoch']}, mini-batch "
                f"{where['batch']} to {self.directory}: {error}. Training stopped. The newest "
                f"complete checkpoint is {newest or '(none)'}; free space (or fix the "
                "permissions) and resume from it."
            ) from error
        self.last_position = (where["epoch"], where["batch"])
