"""`PipelineCheckpoint`: the Keras callback that saves a checkpoint at every epoch end.

It works with a `PipelineModel` (which hands itself over through `set_pipeline`) and with
a plain compiled `keras.Model`; `tf_spectrain.checkpoint.state` says what is saved.
"""

import json

import keras

from tf_spectrain import checks
from tf_spectrain.checkpoint import state, store


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); earlier ones are intact."""

    located = True  # the message says what failed


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
        TypeError: if `keep` is not an int or None, or `metadata` is not a dict of JSON
            values.
        ValueError: if `directory` cannot be written or `keep` is < 1.
        CheckpointWriteError: from `fit`, when a checkpoint cannot be written.
    """

    reads_model_weights = False  # the pipeline's stages, not the wrapped model's weights

    def __init__(self, directory, keep=3, metadata=None):
        super().__init__()
        keep = store.check_keep(keep)
        checks.check_writable_dir("directory", directory)
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
        self._batches = 0

    def set_pipeline(self, pipeline):
        """Called by `PipelineModel.fit`: checkpoint the pipeline's stages.

        Args:
            pipeline: the `PipelineModel` being fitted.
        """
        self.pipeline = pipeline

    def on_epoch_begin(self, epoch, logs=None):
        """Starts counting the epoch's mini-batches (for a plain keras.Model)."""
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        """Counts a finished mini-batch (for a plain keras.Model)."""
        self._batches = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        """Saves the checkpoint of the epoch (complete, or cut short by a stop request).

        Raises:
            CheckpointWriteError: the checkpoint could not be written; training stops.
        """
        if self.pipeline is not None:
            _, done, total = self.pipeline.state.epoch_progress
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
            self.last_path = state.save(
                trainer, self.directory, keep=self.keep, metadata=self.metadata, **where
            )
        except OSError as error:
            newest = store.latest_checkpoint(self.directory)
            raise CheckpointWriteError(
                f"Could not write the checkpoint of epoch {where['epoch']}, mini-batch "
                f"{where['batch']} to {self.directory}: {error}. Training stopped. The newest "
                f"complete checkpoint is {newest or '(none)'}; free space (or fix the "
                "permissions) and resume from it."
            ) from error
        self.last_position = (where["epoch"], where["batch"])
