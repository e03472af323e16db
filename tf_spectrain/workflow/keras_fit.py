"""What Keras' `fit` does around its callbacks, done the same way by the pipeline's epoch loop.

- `start_epoch`: after `on_train_begin`, `fit` starts at the epoch `BackupAndRestore` restored
  (Keras keeps it in the model's `_initial_epoch`), and every stage takes the optimizer state
  it loaded into the wrapped model.
- `build_metrics`: Keras' `fit` builds the model's compiled metrics at its first step, before
  the callbacks look at them; `EarlyStopping(monitor="val_accuracy")` (mode "auto") reads
  each metric's direction there.
- `terminate_on_nan`: with a `keras.callbacks.TerminateOnNaN`, a non-finite loss ends `fit`
  as in Keras (the callback sees the batch's non-finite loss, sets `stop_training`, and
  `fit` returns its History) instead of raising the pipeline's `NonFiniteLossError`.
- `may_read_weights`: whether a callback may read the wrapped model's weights at an
  epoch's end; only then does the pipeline copy them there from the stages (over the
  links when the stages are on other hosts) before `on_epoch_end` (and always at the end
  of `fit`).
"""

import keras

from tf_spectrain.partition import model_structure
from tf_spectrain.workflow import optimizer_view

__all__ = ["after_load", "build_metrics", "may_read_weights", "start_epoch", "terminate_on_nan"]

# Keras callbacks that never read a model's weights (their hooks read the logs, the epoch,
# the optimizer's learning rate).
_NEVER_READ = (
    keras.callbacks.History, keras.callbacks.ProgbarLogger, keras.callbacks.CSVLogger,
    keras.callbacks.TerminateOnNaN, keras.callbacks.ReduceLROnPlateau,
    keras.callbacks.LearningRateScheduler, keras.callbacks.RemoteMonitor,
)


def after_load(pipe):
    """After the wrapped model's optimizer was loaded: every stage and replica takes its
    update count (the last stage's, which it shares) and replica 0's optimizer state."""
    if pipe.runners is None:
        return
    optimizer_view.align_iterations([r.optimizer for r in pipe.runners])
    pipe.sync_replicas()


def build_metrics(model, labels):
    """Builds the wrapped model's compiled metrics for labels of these specs, once.

    Args:
        model: the wrapped (compiled) Keras model.
        labels: the labels' `tf.TensorSpec`s, as the pipeline feeds them (one per output).
    """
    metrics = getattr(model, "_compile_metrics", None)  # Keras keeps them there
    if metrics is None or metrics.built:
        return
    outputs = model_structure.output_structure(model)
    y_true = keras.tree.map_structure(lambda s: keras.KerasTensor(s.shape, s.dtype), labels)
    if isinstance(outputs, dict) and isinstance(y_true, (list, tuple)):
        y_true = dict(zip(sorted(outputs), y_true))  # labels come in output order
    metrics.build(y_true, outputs)


def start_epoch(pipe, initial_epoch):
    """The epoch a `fit` starts at, read after the callbacks' `on_train_begin` as Keras reads it.

    Args:
        pipe: the `PipelineModel`.
        initial_epoch: `fit`'s `initial_epoch`.

    Returns:
        The epoch `BackupAndRestore` restored (Keras' `model._initial_epoch`), if any, else
        `initial_epoch`. When one was restored, every stage takes the loaded optimizer state
        (`after_load`).
    """
    restored = getattr(pipe.model, "_initial_epoch", None)
    if restored:
        after_load(pipe)
    return restored or initial_epoch


def terminate_on_nan(callbacks, progress, logs):
    """Ends the epoch as Keras' `TerminateOnNaN` does, if one is among the callbacks.

    Call it when the epoch stopped on a non-finite loss (`NonFiniteLossError`).

    Args:
        callbacks: the `keras.callbacks.CallbackList` of the `fit`.
        progress: the pipeline's `runtime.state.Progress` (its `epoch_progress` says which
            mini-batch is the first not yet reported: the non-finite one, or the first of
            its window).
        logs: the epoch's running logs so far (without the non-finite mini-batch).

    Returns:
        None without a `TerminateOnNaN` (the caller re-raises); else the epoch's logs, with
        the loss NaN, after `on_train_batch_end` of that mini-batch has run (so the callback
        set `model.stop_training`).
    """
    if not any(isinstance(c, keras.callbacks.TerminateOnNaN) for c in callbacks.callbacks):
        return None
    logs = dict(logs, loss=float("nan"))
    callbacks.on_train_batch_end(progress.epoch_progress[1], logs)
    return logs


def may_read_weights(callback):
    """Whether `callback` may read the wrapped model's weights in its epoch hooks.

    A callback says so with a boolean `reads_model_weights` attribute (tf_spectrain's own
    callbacks say False: they read the stages). Otherwise: False for Keras' callbacks that
    never read them (`History`, `ProgbarLogger`, `CSVLogger`, `TerminateOnNaN`,
    `ReduceLROnPlateau`, `LearningRateScheduler`, `RemoteMonitor`), `EarlyStopping` without
    `restore_best_weights` and `TensorBoard` without weight histograms or embeddings (their
    subclasses are taken to read); True for every other callback (`ModelCheckpoint`,
    `BackupAndRestore`, a `LambdaCallback`, a user's own).
    """
    flag = getattr(callback, "reads_model_weights", None)
    if isinstance(flag, bool):
        return flag
    kind = type(callback)
    if kind in _NEVER_READ:
        return False
    if kind is keras.callbacks.EarlyStopping:
        return bool(callback.restore_best_weights)
    if kind is keras.callbacks.TensorBoard:
        return bool(callback.histogram_freq or callback.embeddings_freq)
    return True
