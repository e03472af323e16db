"""`PipelineModel.fit`: Keras' `fit`, run through the pipeline's stages.

`Fitting` is a mixin of `PipelineModel`. `fit` takes Keras' arguments and data
(`tf_spectrain.workflow.keras_data`), checks them (`workflow.input_checks`), batches the
data for the stages (`workflow.batching.EpochFeed`), runs Keras' callbacks, and hands
every epoch to the pipeline loop (`runtime.loop.FitLoop`), which validates through
`evaluate`'s path. `request_stop` ends a `fit` cleanly from any thread.
"""

import keras

from tf_spectrain import checks
from tf_spectrain.runtime.bookkeeping import TrainLogs
from tf_spectrain.runtime.loop import FitLoop, has_test_batch_hooks, window_size
from tf_spectrain.runtime.window_functions import WindowFunctions, WindowSetup
from tf_spectrain.schedule import modes
from tf_spectrain.workflow import batching, input_checks, keras_data, keras_fit, sample_weights
from tf_spectrain.workflow.outputs import is_multi_output

__all__ = ["Fitting"]


class Fitting:
    """`fit`, `request_stop` and the traced window graphs `fit` runs (`window_functions`).

    Reads the compiled pipeline (`runners`, `loss`, `metrics`, `options`, ...); keeps the
    running `FitLoop` in `_loop` while `fit` runs.
    """

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        verbose="auto",
        callbacks=None,
        validation_split=0.0,
        validation_data=None,
        shuffle=True,
        class_weight=None,
        sample_weight=None,
        initial_epoch=0,
        steps_per_epoch=None,
        validation_steps=None,
        validation_batch_size=None,
        validation_freq=1,
        on_nan="stop",
    ):
        """Trains the pipeline, as `keras.Model.fit`; returns a `keras.callbacks.History`.

        The arguments are Keras' (in Keras' order), with `on_nan` added.

        Args:
            x, y: arrays (`y` labels; for several outputs a list of one array per output,
                or a dict by output name; NumPy, tensors or pandas), or `x` a
                `tf.data.Dataset` of `(x, y)` or `(x, y, sample_weight)` batches, or
                anything else Keras' data adapters take (a `keras.utils.PyDataset`, a
                generator of batches: give `steps_per_epoch` where its length is unknown).
            batch_size: for arrays; default 32.
            epochs: train until this epoch index.
            verbose: 0 silent, 1 progress bar, 2 one line per epoch, "auto" = 1.
            callbacks: Keras callbacks; they see the wrapped model, holding the true
                weights at every epoch end. Those with a `set_pipeline(pipeline)` method
                are given this pipeline first (they may read `pipeline.state`).
            validation_split: a float in [0, 1): as in Keras, the last fraction of the
                arrays (before shuffling) is not trained on but validated on.
            validation_data: `(x_val, y_val)`, `(x_val, y_val, sample_weight_val)` or a
                dataset, evaluated at the end of the epochs `validation_freq` picks.
            shuffle: shuffle arrays every epoch (datasets are used as given).
            class_weight: a dict `{class index: weight}` (one output only): each
                example's loss (and the weighted metrics) weighted by its class's weight.
            sample_weight: an array of one weight per example (arrays only), weighting
                the loss and `compile`'s `weighted_metrics` as in Keras.
            initial_epoch: the epoch to start at (for resuming).
            steps_per_epoch: mini-batches per epoch (the data iterator then continues
                across epochs); needed for an infinite dataset or a generator. Without it
                a `tf.data.Dataset` of unknown length (after `filter`) is counted by one
                pass over it first, with a warning.
            validation_steps: None, or validate on only this many batches.
            validation_batch_size: the batch size of validation arrays (default
                `batch_size`).
            validation_freq: validate every this many epochs (an int), or after the
                epochs in a list (1-based), as in Keras.
            on_nan: what a non-finite loss does. `"stop"` raises `NonFiniteLossError`
                naming the step, the stage that first produced a non-finite value and its
                learning rate. `"skip"`: every stage leaves out an update whose gradient
                is not finite and the batch is left out of the metrics (the count is in
                `batches_skipped`).

        Returns:
            The `keras.callbacks.History` of the run.

        Raises:
            ValueError: before training, for bad arguments (`epochs`, `batch_size`, data
                of mismatched lengths, an infinite dataset without `steps_per_epoch`)
                or when `compile` was not called; during training,
                the first error of any stage or callback, re-raised with its traceback.

        A callback that sets `model.stop_training` (or a call of `request_stop`) ends
        training after the mini-batches already in the pipeline: the pipeline drains,
        `on_epoch_end` runs for the shortened epoch (without validation) and `fit` returns.
        `epoch_progress` then says how far the epoch got.
        """
        x = self._unbuilt.build(x)  # a Sequential without an `Input`: built from `x`
        self._require_compiled()
        several = is_multi_output(self.model)
        x, y, sample_weight, validation_data = keras_data.fit_data(
            x, y, sample_weight, batch_size, steps_per_epoch, shuffle, class_weight,
            validation_split, validation_data, several)
        input_checks.check_fit_args(
            self.model, self.loss, x=x, y=y, batch_size=batch_size, epochs=epochs,
            verbose=verbose, callbacks=callbacks, validation_data=validation_data,
            shuffle=shuffle, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
        )
        input_checks.check_validation_args(validation_steps, validation_batch_size,
                                           validation_freq)
        checks.check_one_of("on_nan", on_nan, modes.ON_NAN)
        feed = batching.EpochFeed(
            self.model, self.loss, x, y, batch_size, shuffle, steps_per_epoch,
            self.micro_batches, sample_weight=sample_weight,
        )
        # As Keras' first step: callbacks monitoring a metric read its direction there.
        labels = sample_weights.unpack(feed.dataset.element_spec[1])[0]
        keras_fit.build_metrics(self.model, labels)
        for runner in self.all_runners:
            runner.skip_non_finite = on_nan == "skip"
        for callback in callbacks or ():
            if hasattr(callback, "set_pipeline"):
                callback.set_pipeline(self)
        self.progress.images_seen = self.progress.batches_skipped = 0
        verbose = 1 if verbose == "auto" else verbose
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, model=self.model,
            verbose=verbose, epochs=epochs, steps=feed.num_batches,
        )
        history = next(c for c in callback_list.callbacks if isinstance(c, keras.callbacks.History))
        self.copy_weights_to_stages()
        self.model.stop_training = False

        def next_batches(epoch):
            return feed.batches(self.shuffle_seed, self.epochs_trained)

        def validate(epoch):
            if not input_checks.validation_due(epoch, validation_freq):
                return {}
            callback_list.on_test_begin()  # as Keras' fit: evaluate(callbacks=callbacks)
            per_batch = callback_list if has_test_batch_hooks(callbacks) else None
            logs = self._evaluate_logs(validation_data, validation_batch_size or batch_size,
                                       steps=validation_steps, callbacks=per_batch)
            callback_list.on_test_end(logs)
            return logs

        if self._train_logs is None:
            self._train_logs = TrainLogs(self.all_runners, self.metrics, self.progress)
        total = None if feed.num_batches is None else feed.num_batches * (epochs - initial_epoch)
        window = window_size(self.steps_per_execution, callbacks, self.run_eagerly,
                             self.devices, total)
        self._loop = FitLoop(self, callback_list, self._train_logs, feed.num_batches, on_nan,
                             window)
        try:
            self._loop.run(
                initial_epoch, epochs, next_batches, None if validation_data is None else validate
            )
        finally:
            self._loop = None
            feed.close()
        return history

    def request_stop(self):
        """Ends training soon and cleanly: no further mini-batch is fed, those in flight
        finish and update, callbacks see the end of the (shortened) epoch, then `fit`
        returns. Safe to call from any thread or a signal handler.
        """
        self.model.stop_training = True
        loop = self._loop
        if loop is not None:
            loop.request_stop()

    def window_functions(self, logs):
        """The traced window graphs of this pipeline (`runtime.window_epoch`), kept across
        `fit` calls; `logs` is the `runtime.bookkeeping.TrainLogs` they update."""
        if self._windows is None or self._windows.setup.logs is not logs.logs:
            report = 0 if self.mode == "sync" else self.num_stages - 1
            self._windows = WindowFunctions(
                WindowSetup(self._require_replica_runners(), logs.logs, self.micro_batches,
                            report, self.options.updates_every(self.num_stages)))
        return self._windows
