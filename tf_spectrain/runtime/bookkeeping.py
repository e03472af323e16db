"""Loss and metric bookkeeping of a pipeline's `fit`: the running logs Keras callbacks see.

`TrainLogs` adds each mini-batch the last stage reports (its loss, predictions and labels,
plus every stage's layer losses) to the loss tracker and the metrics, and names where a
non-finite loss came from.
"""

import keras
import numpy as np
import tensorflow as tf


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


class TrainLogs:
    """The running loss and metrics of the epoch in progress.

    Args:
        runners: the stages' `StageRunner`s (their layer losses are added to the loss).
        metrics: the compiled Keras metrics (updated in place, as Keras does).
        progress: the `runtime.state.Progress` whose example and skip counters to advance.
    """

    def __init__(self, runners, metrics, progress):
        self.runners = runners
        self.metrics = metrics
        self.progress = progress
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def reset(self):
        """Starts a new epoch: zero the loss tracker and every metric."""
        self.loss_tracker.reset_state()
        for m in self.metrics:
            m.reset_state()

    def result(self):
        """The epoch's running logs as floats."""
        return metric_logs(self.loss_tracker, self.metrics)

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
        size = sum(int(tf.shape(p[1])[0]) for p in parts)
        self.progress.images_seen += size
        if not np.isfinite(loss):
            if on_nan == "stop":
                raise NonFiniteLossError(self.non_finite_message(epoch, i, loss))
            self.progress.batches_skipped += 1
            return
        self.loss_tracker.update_state(loss, sample_weight=size)
        for _, logits, labels in parts:
            for m in self.metrics:
                m.update_state(labels, logits)

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
        firsts = [(r.first_non_finite(), r) for r in self.runners]
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
