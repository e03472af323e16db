"""Keras callbacks of a `train.py` run: where it is and how fast, and non-finite losses.

`RunProgress` follows the run across `fit` calls (resumed epochs included); the baselines
(`single`, `dp`) get `StopOnNonFinite`, which a pipeline does itself.
"""

import math
import time

import keras

from tf_spectrain.runtime.bookkeeping import NonFiniteLossError


class RunProgress(keras.callbacks.Callback):
    """Where the run is, how fast it trains, and stop requests that `fit` must not lose.

    `position` is `(epoch, mini-batches done in it)`, `(e + 1, 0)` once epoch e is over.
    Images per second are timed over the training part of each epoch (the clock stops at
    the last training batch, so validation is not counted). A stop requested before `fit`
    began (e.g. SIGINT while it set up) is applied again at its start, since `fit` resets
    `stop_training`.
    """

    reads_model_weights = False  # the logs and the optimizer, never the weights

    def __init__(self, run):
        super().__init__()
        self.run = run
        self.position = (run.start_epoch, run.start_batch)
        self.resume_batch = 0  # mini-batches of the first epoch done before this fit
        self.images = 0
        self.seconds = 0.0

    def _keep_stopping(self):
        if self.run.stop_requested:
            self.model.stop_training = True

    def on_train_begin(self, logs=None):
        self._keep_stopping()

    def on_epoch_begin(self, epoch, logs=None):
        self._keep_stopping()
        self._epoch, self._offset, self.resume_batch = epoch, self.resume_batch, 0
        self._start = self._last = time.perf_counter()
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._last = time.perf_counter()
        self._batches = batch + 1
        self.position = (self._epoch, self._offset + batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self.seconds += self._last - self._start
        done = self._offset + self._batches
        self.images += min(done * self.run.config.batch_size, self.run.num_train) - min(
            self._offset * self.run.config.batch_size, self.run.num_train
        )
        if done >= self.run.steps_per_epoch:
            self.position = (epoch + 1, 0)

    @property
    def images_per_second(self):
        """Training images per second over the epochs so far (0.0 before any)."""
        return self.images / self.seconds if self.seconds else 0.0


class StopOnNonFinite(keras.callbacks.Callback):
    """Baselines: a non-finite loss stops training with the step and learning rate."""

    reads_model_weights = False  # the logs and the optimizer, never the weights

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            steps = self.params.get("steps") or 0
            lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            raise NonFiniteLossError(
                f"The training loss is {float(loss)} at step {self._epoch * steps + batch} "
                f"(mini-batch {batch} of epoch {self._epoch}) of the model; learning "
                f"rate {lr:g}. Training stopped; no checkpoint was written after this point. "
                "Try a lower learning rate."
            )
