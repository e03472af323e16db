"""Loss and metric bookkeeping of a pipeline's `fit`: the running logs Keras callbacks see.

`BatchLogs` turns a batch's loss, labels and predictions into Keras' logs; `TrainLogs` (fit)
and `runtime.inference.Evaluator` (evaluate, validation) both use it. `TrainLogs` adds each
mini-batch the last stage reports (its loss, predictions and labels, plus every stage's
layer losses) and names where a non-finite loss came from.
"""

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain.workflow import sample_weights
from tf_spectrain.workflow.output_metrics import OutputMetrics


class NonFiniteLossError(FloatingPointError):
    """Training met a non-finite loss (with `on_nan="stop"`); the message says where."""

    located = True  # the message names the step and stage: no note about the thread


def metric_logs(loss_tracker, metrics):
    """Reads the loss tracker and metrics as Keras logs them.

    Args:
        loss_tracker: the `keras.metrics.Mean` of the loss.
        metrics: Keras metrics; one that returns a dict adds all its entries.

    Returns:
        A dict `{"loss": ..., <metric>: ...}` of floats.
    """
    logs = {"loss": float(loss_tracker.result())}
    for m in metrics:
        result = m.result()
        if isinstance(result, dict):
            logs.update({k: float(v) for k, v in result.items()})
        else:
            logs[m.name] = float(result)
    return logs


def fresh_metrics(metrics):
    """Copies of compiled metrics with fresh state (from their configs), for `evaluate`.

    Args:
        metrics: a list of Keras metrics, or an `output_metrics.OutputMetrics`.

    Returns:
        The same kind of object, its metrics new.
    """
    if isinstance(metrics, OutputMetrics):
        metrics.build()
        return metrics.fresh_copy()
    return [sample_weights.fresh_metric(m) for m in metrics]


class BatchLogs:
    """The loss and metric logs of batches, as `keras.Model.fit` and `evaluate` keep them.

    The total loss is averaged over the examples; a model with one output updates every
    metric with the labels and predictions, one with several hands them to its
    `outputs.OutputMetrics` (per-output metrics and losses). Works eagerly and inside a
    graph function.

    Args:
        metrics: a list of Keras metrics (one output), or an `outputs.OutputMetrics`
            (built here if it is not yet). They are updated in place.
    """

    def __init__(self, metrics):
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.metrics = metrics
        self.several_outputs = isinstance(metrics, OutputMetrics)
        if self.several_outputs:
            metrics.build()

    def reset(self):
        """Zeroes the loss tracker and every metric."""
        self.loss_tracker.reset_state()
        if self.several_outputs:
            self.metrics.reset_state()
        else:
            for m in self.metrics:
                m.reset_state()

    def update(self, loss, size, parts):
        """Adds one batch.

        Args:
            loss: the batch's total loss (a float or scalar tensor, layer losses included).
            size: its number of examples (the loss's weight).
            parts: `[(labels, predictions)]`, one pair per micro-batch.
        """
        self.loss_tracker.update_state(loss, sample_weight=size)
        if self.several_outputs:
            self.metrics.update_state(parts)
            return
        for labels, predictions in parts:
            y, weights = sample_weights.unpack(labels)
            for m in self.metrics:
                sample_weights.update_metric(m, y, predictions, weights)

    def result(self):
        """The logs as floats: `{"loss": ..., <metric>: ...}`, named as Keras names them."""
        if self.several_outputs:
            return self.metrics.logs(self.loss_tracker)
        return metric_logs(self.loss_tracker, self.metrics)


class TrainLogs:
    """The running loss and metrics of the epoch in progress.

    Args:
        runners: the stages' `StageRunner`s (their layer losses are added to the loss).
        metrics: the compiled Keras metrics, or `outputs.OutputMetrics` for a model with
            several outputs (updated in place, as Keras does).
        progress: the `runtime.state.Progress` whose example and skip counters to advance.
    """

    def __init__(self, runners, metrics, progress):
        self.runners = runners
        self.metrics = metrics
        self.progress = progress
        self.logs = BatchLogs(metrics)
        self.loss_tracker = self.logs.loss_tracker

    def reset(self):
        """Starts a new epoch: zero the loss tracker and every metric."""
        self.logs.reset()

    def result(self):
        """The epoch's running logs as floats."""
        return self.logs.result()

    def record(self, epoch, i, parts, on_nan):
        """Adds mini-batch `i` to the logs (unless its loss is not finite).

        The stages' layer losses of the mini-batch are added to its loss, and the examples
        are counted in `progress.images_seen` either way; a skipped mini-batch is counted in
        `progress.batches_skipped`.

        Args:
            epoch: the epoch in progress.
            i: the mini-batch's index in the epoch.
            parts: its `(loss, logits, labels)` parts (one per micro-batch).
            on_nan: "stop" or "skip": what a non-finite loss does.

        Raises:
            NonFiniteLossError: a non-finite loss with `on_nan="stop"`.
        """
        # The loss Keras reports includes the layer losses (regularizers) of every stage.
        penalty = sum(float(p) for r in self.runners for p in r.penalties.pop(i, ()))
        loss = sum(float(p[0]) for p in parts) + penalty
        size = sum(int(tf.shape(tf.nest.flatten(p[1])[0])[0]) for p in parts)
        self.progress.images_seen += size
        if not np.isfinite(loss):
            if on_nan == "stop":
                raise NonFiniteLossError(self.non_finite_message(epoch, i, loss))
            self.progress.batches_skipped += 1
            return
        self.logs.update(loss, size, [(labels, logits) for _, logits, labels in parts])

    def record_window(self, epoch, reported, losses, sizes, on_nan):
        """Counts the mini-batches a window reported; their metrics are in already.

        A window's graph updates the loss tracker and metrics with each finite mini-batch
        itself (`runtime.window_graph`); this counts the examples and the skipped ones.

        Args:
            epoch: the epoch in progress.
            reported: the window's reported mini-batch indices.
            losses: their losses (layer losses included), as floats.
            sizes: `{i: examples}` of the fed mini-batches.
            on_nan: "stop" or "skip".

        Raises:
            NonFiniteLossError: a non-finite loss with `on_nan="stop"`.
        """
        for i, loss in zip(reported, losses):
            self.progress.images_seen += sizes[i]
            if np.isfinite(loss):
                continue
            if on_nan == "stop":
                raise NonFiniteLossError(self.non_finite_message(epoch, i, float(loss)))
            self.progress.batches_skipped += 1

    def non_finite_message(self, epoch, i, loss):
        """Describes where a non-finite loss came from: the first stage pass that produced one.

        Args:
            epoch: the epoch in progress.
            i: the mini-batch's index in the epoch.
            loss: the non-finite loss.

        Returns:
            The message: the step, the first non-finite stage pass (stage, device, pass,
            mini-batch) and its learning rate when known, and what to try next.
        """
        firsts = [(_first_non_finite(r), r) for r in self.runners]  # (order, kind, key)
        firsts = [(f, r) for f, r in firsts if f is not None]
        steps = self.progress.epoch_progress[2] if self.progress.epoch_progress else 0
        text = (
            f"The training loss is {loss} at step {epoch * steps + i} (mini-batch {i} of "
            f"epoch {epoch})"
        )
        if firsts:
            (_, kind, key), runner = min(firsts, key=lambda fr: fr[0][0])
            lr = float(runner.optimizer.learning_rate)
            text += (
                f". The first non-finite value came from stage {runner.k} (on "
                f"{runner.device}), in the {kind} pass of mini-batch {key[0]}; its learning "
                f"rate is {lr:g}"
            )
        else:
            lr = float(self.runners[-1].optimizer.learning_rate)
            text += f"; learning rate {lr:g}"
        return (
            text + ". Training stopped; no checkpoint was written after this point. Try a "
            "lower learning rate, or fit(on_nan='skip') (train.py --on-nan skip) to leave "
            "out mini-batches whose loss or gradients are not finite."
        )


def _first_non_finite(runner):
    """`(end_time, kind, key)` of the earliest of a stage's last 64 passes whose outputs or
    gradients were not all finite, or None."""
    for end, kind, key, finite in list(runner.events):
        if not bool(finite):
            return end, kind, key
    return None
