"""`PipelineModel`: train a Keras model as a pipeline of stages, with the Keras workflow.

    pipe = tf_spectrain.PipelineModel(model, cuts=["block2_pool", "block3_pool"])
    pipe.compile(optimizer=tf_spectrain.SpecTrainSGD(0.01, momentum=0.9), loss=..., metrics=[...])
    pipe.fit(x, y, batch_size=128, epochs=10, validation_data=(xv, yv), callbacks=[...])

The model is cut into stages at the named layers (`tf_spectrain.partition`), each stage is
copied onto its own device with its own optimizer, and `fit` runs the schedule of the chosen
mode (`tf_spectrain.schedule`, `tf_spectrain.modes`) with one thread per stage
(`tf_spectrain.runtime`). The pipeline drains at the end of every epoch and the trained
weights (BatchNorm statistics included) are copied back into the model passed in, so
callbacks, `model.save` and `model.evaluate` see the true, settled weights.
"""

import time

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import compile_utils, input_checks, modes, partition, schedule
from tf_spectrain import devices as devices_lib
from tf_spectrain.optimizer import SpecTrainSGD
from tf_spectrain.runtime.executor import EpochRun
from tf_spectrain.runtime.stage import StageRunner, as_list, one_or_list
from tf_spectrain.runtime.state import PipelineState, Progress

ON_NAN = ("stop", "skip")


class NonFiniteLossError(FloatingPointError):
    """Training met a non-finite loss (with `on_nan="stop"`); the message says where."""

    located = True  # the message names the step and stage: no note about the thread


def _default_devices(num_stages):
    gpus = devices_lib.existing_devices("GPU")
    names = gpus if gpus else devices_lib.existing_devices("CPU")
    if len(names) < num_stages:
        raise ValueError(
            f"A pipeline of {num_stages} stages needs {num_stages} distinct devices, but only "
            f"{len(names)} exist ({names}). Call `tf_spectrain.setup_devices({num_stages})` at "
            "the start of the program (before any TensorFlow op) to split the available "
            "GPUs or the CPU into logical devices, or pass `devices=[...]` explicitly "
            "(names may repeat)."
        )
    return names[:num_stages]


def _resolve_devices(device_names, num_stages):
    """`devices` as given (`place_stages` checks them), or the default ones for None."""
    return _default_devices(num_stages) if device_names is None else device_names


class PipelineModel:
    """A Keras model trained as a pipeline of stages on several devices.

    Args:
        model: a functional or Sequential `keras.Model` (every layer called once). After
            `fit` it holds the trained weights.
        cuts: layer names; each ends a stage, so there are `len(cuts) + 1` stages.
        devices: one device name per stage (names may repeat), or None for the first
            `N` distinct devices, GPUs first (see `tf_spectrain.setup_devices`).
        mode: `"sync"` (sequential SGD, no staleness), `"vanilla"` (naive pipelining),
            `"stash"` (PipeDream weight stashing) or `"spectrain"` (weight prediction).
        spectrain_target: `"paper"` (the paper's version gaps, backward recomputed at its
            own predicted weights) or `"consistent"` (one prediction per mini-batch,
            reused by the backward). Only used by `mode="spectrain"`.
        micro_batches: `sync` mode only: split every mini-batch into this many
            micro-batches that fill and drain the pipeline (GPipe); one update per
            mini-batch.

    Raises:
        TypeError: if `model` is not a Keras model, or `cuts`/`devices` have wrong types.
        ValueError: for an unknown mode or target, bad `micro_batches`, cuts that are not
            layers of the model (or out of order, repeated, leaving a stage empty), a
            model without a functional graph or with shared layers, devices that do not
            exist or do not match the number of stages, or too few devices for None.
    """

    def __init__(
        self,
        model,
        cuts,
        devices=None,
        mode="spectrain",
        spectrain_target="paper",
        micro_batches=1,
    ):
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"`model` must be a keras.Model (functional or Sequential). Received: {model!r}"
            )
        modes.check_mode(mode, spectrain_target)
        input_checks.check_int("micro_batches", micro_batches, 1)
        if micro_batches > 1 and mode != "sync":
            raise ValueError(
                "`micro_batches` > 1 (GPipe) is only defined for mode='sync'. "
                f"Received: micro_batches={micro_batches}, mode={mode!r}"
            )
        self.model = model
        self._split = partition.split_model(model, cuts)
        self.cuts = list(cuts)
        self.num_stages = len(self._split)
        self.devices = _resolve_devices(devices, self.num_stages)
        self.mode = mode
        self.spectrain_target = spectrain_target
        self.micro_batches = int(micro_batches)
        self.stages = partition.place_stages(self._split, self.devices)
        self.devices = list(self.devices)
        self.plans = [
            modes.pass_plan(mode, k, self.num_stages, spectrain_target)
            for k in range(self.num_stages)
        ]
        self.runners = None
        self.optimizer = None
        self._epoch_run = None
        self.progress = Progress()
        # The order of shuffled arrays in epoch e is a function of (shuffle_seed, e); drawn
        # from NumPy's global generator, so keras.utils.set_random_seed fixes it.
        self.shuffle_seed = int(np.random.randint(0, 2**31 - 1))
        self.epochs_trained = 0  # epochs run by fit so far (the order of the next shuffle)

    # --- compile ------------------------------------------------------------------------

    def compile(self, optimizer, loss, metrics=None):
        """Configures training, as `keras.Model.compile`.

        Args:
            optimizer: a Keras optimizer (or its name). Each stage gets its own copy,
                built on its device. `mode="spectrain"` needs a `tf_spectrain.SpecTrainSGD`.
            loss: a Keras loss or its name.
            metrics: list of Keras metrics or names; "accuracy" fits the loss.

        Raises:
            TypeError: `mode="spectrain"` without a `SpecTrainSGD`, or `metrics` not a list.
            ValueError: a missing or unknown optimizer, loss or metric.
        """
        optimizer = compile_utils.resolve_optimizer(optimizer)
        if self.mode == "spectrain" and not isinstance(optimizer, SpecTrainSGD):
            raise TypeError(
                "mode='spectrain' predicts weights from the optimizer's momentum and needs "
                "`tf_spectrain.SpecTrainSGD`. Received: "
                f"optimizer={type(optimizer).__name__}"
            )
        self.loss = compile_utils.resolve_loss(loss)
        self.metrics = compile_utils.resolve_metrics(metrics, self.loss)
        self.optimizer = optimizer
        self.runners = []
        last = self.num_stages - 1
        for k, (stage, device, plan) in enumerate(zip(self.stages, self.devices, self.plans)):
            with tf.device(device):
                stage_optimizer = compile_utils.clone_optimizer(optimizer)
                stage_optimizer.build(stage.trainable_variables)
            runner = StageRunner(
                k, stage, device, stage_optimizer, plan, loss=self.loss if k == last else None
            )
            self.runners.append(runner)
        self._loss_tracker = keras.metrics.Mean(name="loss")
        # Callbacks see the wrapped model; those that read `model.optimizer` (TensorBoard
        # logs the learning rate) see the last stage's, whose iterations advance.
        self.model.optimizer = self.runners[-1].optimizer

    @property
    def state(self):
        """The read-only `runtime.state.PipelineState` that callbacks read."""
        return PipelineState(self, self.progress)

    @property
    def epoch_progress(self):
        """`(epoch, mini-batches done in it, mini-batches per epoch)`, or None."""
        return self.progress.epoch_progress

    @property
    def epoch_seconds(self):
        """Wall time of the last epoch's training part (no validation)."""
        return self.progress.epoch_seconds

    @property
    def images_seen(self):
        """Training examples reported so far in this `fit`."""
        return self.progress.images_seen

    @property
    def batches_skipped(self):
        """Mini-batches left out by `on_nan="skip"` in this `fit`."""
        return self.progress.batches_skipped

    @property
    def stage_optimizers(self):
        """Each stage's own optimizer (after `compile`)."""
        return [r.optimizer for r in self._require_compiled()]

    def _require_compiled(self):
        if self.runners is None:
            raise ValueError(
                "You must call `compile(optimizer, loss, metrics)` before using the pipeline."
            )
        return self.runners

    def _sync_learning_rate(self):
        """Gives every stage the learning rate callbacks set on `model.optimizer`.

        Callbacks such as LearningRateScheduler or ReduceLROnPlateau change the learning
        rate of `model.optimizer` (the last stage's); the other stages follow here, at
        epoch starts. Learning-rate schedules need nothing: each stage has its own copy.
        """
        source = self.runners[-1].optimizer
        if isinstance(source._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return
        value = float(source.learning_rate)
        for runner in self.runners[:-1]:
            if float(runner.optimizer.learning_rate) != value:
                runner.optimizer.learning_rate = value

    # --- weights between the model and the stages ----------------------------------------

    def _push_weights(self):
        partition.copy_weights(self._split, self.stages)

    def copy_weights_to_model(self):
        """Copies the stages' weights (BatchNorm statistics included) into `model`."""
        partition.copy_weights(self.stages, self._split)

    # --- data ---------------------------------------------------------------------------

    def _dataset(self, x, y, batch_size, shuffle, names=("x", "y")):
        """`(x, y)` batches from arrays or a dataset, checked against the model and loss."""
        batch_size = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        input_checks.check_int("batch_size", batch_size, 1)
        n_x = input_checks.check_data(self.model, self.loss, x, y, names)
        if n_x is None:
            return x  # a dataset of (x, y) batches, used as given
        inputs = input_checks.model_inputs(self.model, x)
        ds = tf.data.Dataset.from_tensor_slices((inputs, y))
        if shuffle:
            ds = ds.shuffle(n_x, reshuffle_each_iteration=True)
        return ds.batch(batch_size).prefetch(2)

    def _epoch_batches(self, x, y, batch_size):
        """Arrays shuffled for the next epoch of this pipeline's life.

        The order depends only on `shuffle_seed` and `epochs_trained` (both kept in
        checkpoints), so a resumed run sees the epochs an uninterrupted one would, and
        successive `fit` calls see new orders, as with Keras.
        """
        batch_size = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        inputs = input_checks.model_inputs(self.model, x)
        n = len(tf.nest.flatten(inputs)[0])
        order = np.random.default_rng([self.shuffle_seed, self.epochs_trained]).permutation(n)

        def permuted(part):
            return np.asarray(part)[order]

        inputs = tf.nest.map_structure(permuted, inputs)
        labels = tf.nest.map_structure(permuted, y) if isinstance(y, (tuple, dict)) else permuted(y)
        ds = tf.data.Dataset.from_tensor_slices((inputs, labels))
        return ds.batch(batch_size).prefetch(2)

    @staticmethod
    def _num_batches(ds, steps):
        if steps is not None:
            input_checks.check_int("steps_per_epoch", steps, 1)
            return int(steps)
        n = int(ds.cardinality())
        if n < 0:
            raise ValueError(
                "The number of batches in the dataset is unknown or infinite; pass "
                "`steps_per_epoch` (the pipeline schedule needs the epoch length up front)."
            )
        if n == 0:
            raise ValueError("The training data is empty.")
        return n

    # --- fit ----------------------------------------------------------------------------

    def _check_micro_batches(self, x, batch_size, steps_per_epoch):
        """With GPipe micro-batches, array mini-batches must split into equal parts."""
        m = self.micro_batches
        if m == 1 or isinstance(x, tf.data.Dataset):
            return  # a dataset's batch sizes are only known when it runs
        batch_size = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        if batch_size % m:
            raise ValueError(
                f"`micro_batches`={m} must divide `batch_size` (each mini-batch splits into "
                f"{m} equal micro-batches). Received: batch_size={batch_size}"
            )
        n = len(tf.nest.flatten(x)[0])
        last = n % batch_size
        if steps_per_epoch is None and 0 < last < m:
            raise ValueError(
                f"The last mini-batch of an epoch has {last} examples ({n} examples, "
                f"batch_size={batch_size}), fewer than `micro_batches`={m}: it cannot be "
                "split. Choose a batch size that leaves no remainder, or fewer micro-batches."
            )

    def _op_lists(self, num_batches):
        n = self.num_stages
        if self.mode == "sync":
            return [schedule.sync_ops(k, n, num_batches, self.micro_batches) for k in range(n)]
        return [schedule.async_ops(k, n, num_batches) for k in range(n)]

    def _keep_rules(self, op_lists):
        """For each stage, whether the forward of (i, j) keeps its activations."""
        rules = []
        for plan, ops in zip(self.plans, op_lists):
            seen = schedule.versions_seen(ops)

            def keep(key, seen=seen, plan=plan):
                i, j = key
                between = seen[(schedule.BACKWARD, i, j)] - seen[(schedule.FORWARD, i, j)]
                return plan.same_weights(between)

            rules.append(keep)
        return rules

    def _reset_metrics(self):
        self._loss_tracker.reset_state()
        for m in self.metrics:
            m.reset_state()

    def _logs(self):
        logs = {"loss": float(self._loss_tracker.result())}
        for m in self.metrics:
            result = m.result()
            if isinstance(result, dict):
                logs.update({k: float(v) for k, v in result.items()})
            else:
                logs[m.name] = float(result)
        return logs

    def _record_batch(self, epoch, i, parts, on_nan):
        # The loss Keras reports includes the layer losses (regularizers) of every stage.
        penalty = sum(float(p) for r in self.runners for p in r.penalties.pop(i, ()))
        loss = sum(float(p[0]) for p in parts) + penalty
        size = sum(int(tf.shape(p[1])[0]) for p in parts)
        self.progress.images_seen += size
        if not np.isfinite(loss):
            if on_nan == "stop":
                raise NonFiniteLossError(self._non_finite_message(epoch, i, loss))
            self.progress.batches_skipped += 1
            return
        self._loss_tracker.update_state(loss, sample_weight=size)
        for _, logits, labels in parts:
            for m in self.metrics:
                m.update_state(labels, logits)

    def _non_finite_message(self, epoch, i, loss):
        """Where a non-finite loss came from: the first stage pass that produced one."""
        firsts = [(r.first_non_finite(), r) for r in self.runners]
        firsts = [(f, r) for f, r in firsts if f is not None]
        steps = self.epoch_progress[2] if self.epoch_progress else 0
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

    def request_stop(self):
        """Ends training soon and cleanly: no further mini-batch is fed, those in flight
        finish and update, callbacks see the end of the (shortened) epoch, then `fit`
        returns. Safe to call from any thread or a signal handler.
        """
        self.model.stop_training = True
        run = self._epoch_run
        if run is not None:
            run.request_stop()

    def _attach(self, callbacks):
        """Gives pipeline-aware callbacks (those with `set_pipeline`) this pipeline."""
        for callback in callbacks or ():
            if hasattr(callback, "set_pipeline"):
                callback.set_pipeline(self)

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        verbose="auto",
        callbacks=None,
        validation_data=None,
        shuffle=True,
        initial_epoch=0,
        steps_per_epoch=None,
        on_nan="stop",
    ):
        """Trains the pipeline, as `keras.Model.fit`; returns a `keras.callbacks.History`.

        Args:
            x, y: arrays (`y` labels), or `x` a `tf.data.Dataset` of `(x, y)` batches.
            batch_size: for arrays; default 32.
            epochs: train until this epoch index.
            verbose: 0 silent, 1 progress bar, 2 one line per epoch, "auto" = 1.
            callbacks: Keras callbacks; they see the wrapped model, holding the true
                weights at every epoch end.
            validation_data: `(x_val, y_val)` or a dataset, evaluated at every epoch end.
            shuffle: shuffle arrays every epoch (datasets are used as given).
            initial_epoch: the epoch to start at (for resuming).
            steps_per_epoch: mini-batches per epoch; needed when the dataset's length is
                unknown. The data iterator then continues across epochs.
            on_nan: what a non-finite loss does. `"stop"` raises `NonFiniteLossError`
                naming the step, the stage that first produced a non-finite value and its
                learning rate. `"skip"`: every stage leaves out an update whose gradient
                is not finite and the batch is left out of the metrics (the count is in
                `batches_skipped`).

        Returns:
            The `keras.callbacks.History` of the run.

        Raises:
            ValueError: before training, for bad arguments (`epochs`, `batch_size`, data
                of mismatched lengths, a dataset of unknown length without
                `steps_per_epoch`) or when `compile` was not called; during training,
                the first error of any stage or callback, re-raised with its traceback.

        A callback that sets `model.stop_training` (or a call of `request_stop`) ends
        training after the mini-batches already in the pipeline: the pipeline drains,
        `on_epoch_end` runs for the shortened epoch (without validation) and `fit` returns.
        `epoch_progress` then says how far the epoch got.
        """
        runners = self._require_compiled()
        input_checks.check_fit_args(
            self.model,
            self.loss,
            x=x,
            y=y,
            batch_size=batch_size,
            epochs=epochs,
            verbose=verbose,
            callbacks=callbacks,
            validation_data=validation_data,
            shuffle=shuffle,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
        )
        if on_nan not in ON_NAN:
            raise ValueError(f"`on_nan` must be one of {list(ON_NAN)}. Received: on_nan={on_nan!r}")
        ds = self._dataset(x, y, batch_size, shuffle)
        num_batches = self._num_batches(ds, steps_per_epoch)
        self._check_micro_batches(x, batch_size, steps_per_epoch)
        per_epoch_order = shuffle and not isinstance(x, tf.data.Dataset) and steps_per_epoch is None
        for runner in runners:
            runner.skip_non_finite = on_nan == "skip"
        self._attach(callbacks)
        self.progress.images_seen = 0
        self.progress.batches_skipped = 0
        verbose = 1 if verbose == "auto" else verbose
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            model=self.model,
            verbose=verbose,
            epochs=epochs,
            steps=num_batches,
        )
        history = next(c for c in callback_list.callbacks if isinstance(c, keras.callbacks.History))
        self._push_weights()
        self.model.stop_training = False
        iterator = iter(ds) if steps_per_epoch is not None else None
        callback_list.on_train_begin()
        logs = {}
        for epoch in range(initial_epoch, epochs):
            self._reset_metrics()
            callback_list.on_epoch_begin(epoch)
            self._sync_learning_rate()
            if epoch > initial_epoch:
                self._push_weights()  # callbacks may have set the model's weights
            if per_epoch_order:
                batches = iter(self._epoch_batches(x, y, batch_size))
            else:
                batches = iterator if iterator is not None else iter(ds)
            op_lists = self._op_lists(num_batches)
            run = EpochRun(
                runners,
                op_lists,
                batches,
                self.micro_batches,
                self._keep_rules(op_lists),
                label=f"epoch {epoch}",
            )
            for runner in runners:
                runner.timeline.clear()
                runner.events.clear()
            self.progress.epoch_progress = (epoch, 0, num_batches)

            def on_batch(i, parts, epoch=epoch, run=run):
                callback_list.on_train_batch_begin(i)
                self._record_batch(epoch, i, parts, on_nan)
                self.progress.epoch_progress = (epoch, i + 1, num_batches)
                callback_list.on_train_batch_end(i, self._logs())
                if self.model.stop_training:
                    run.request_stop()

            self._epoch_run = run
            started = time.perf_counter()
            try:
                if self.model.stop_training:
                    run.request_stop()  # stopped from outside before this epoch began
                run.run(on_batch)
            except BaseException:
                for runner in runners:
                    runner.probe = None  # measurements belong to this fit's callbacks
                raise
            finally:
                self._epoch_run = None
                self.progress.epoch_seconds = time.perf_counter() - started
                self.epochs_trained += 1
                self.copy_weights_to_model()
            logs = self._logs()
            cut_short = self.epoch_progress[1] < num_batches
            if validation_data is not None and not cut_short:
                val_logs = self._evaluate_logs(validation_data, batch_size)
                logs.update({f"val_{k}": v for k, v in val_logs.items()})
            callback_list.on_epoch_end(epoch, logs)
            if self.model.stop_training:
                break
        callback_list.on_train_end(logs)
        return history

    # --- evaluate / predict -------------------------------------------------------------

    def _infer(self, x):
        """Outputs of the stages chained in inference mode, and their layer losses."""
        h, penalty = as_list(x), 0.0
        for runner in self.runners:
            h, stage_penalty = runner.infer(h)
            penalty += float(stage_penalty)
        return one_or_list(h), penalty

    def _evaluate_logs(self, data, batch_size, names=None):
        """Loss and metrics on `data`: `(x, y)` arrays or a dataset of `(x, y)` batches.

        Error messages call the data `validation_data` unless `names` gives the names of
        `x` and `y`.
        """
        x, y = input_checks.unpack_validation_data(data)
        names = input_checks.validation_names(y) if names is None else names
        ds = self._dataset(x, y, batch_size, shuffle=False, names=names)
        tracker = keras.metrics.Mean(name="loss")
        metrics = [m.__class__.from_config(m.get_config()) for m in self.metrics]
        for xb, yb in ds:
            logits, penalty = self._infer(xb)
            loss = self.loss(yb, logits) + penalty
            tracker.update_state(loss, sample_weight=tf.shape(yb)[0])
            for m in metrics:
                m.update_state(yb, logits)
        logs = {"loss": float(tracker.result())}
        for m in metrics:
            logs[m.name] = float(m.result())
        return logs

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", return_dict=False):
        """Loss and metrics on the data (inference mode), as `keras.Model.evaluate`.

        Uses the wrapped model's current weights (they are copied to the stages first).

        Args:
            x, y: arrays (`x` one per model input: a list, or a dict by input name), or
                `x` a `tf.data.Dataset` of `(x, y)` batches.
            batch_size: for arrays; default 32.
            verbose: 0 prints nothing; otherwise one line with the results.
            return_dict: return `{"loss": ..., metric: ...}` instead of a list.

        Returns:
            The loss (no metrics), a list `[loss, *metrics]`, or a dict.

        Raises:
            TypeError: for data that is not arrays or a dataset, or a non-bool
                `return_dict`.
            ValueError: if `compile` was not called, for bad `batch_size` or `verbose`,
                or data that does not fit the model (the message gives both shapes).
        """
        self._require_compiled()
        input_checks.check_verbose(verbose)
        input_checks.check_bool("return_dict", return_dict)
        data = x if isinstance(x, tf.data.Dataset) and y is None else (x, y)
        self._push_weights()
        logs = self._evaluate_logs(data, batch_size, names=("x", "y"))
        if verbose not in (0, "auto") and verbose:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()))
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x, batch_size=None, verbose="auto"):
        """Model outputs for `x` (arrays or a dataset of inputs), as a NumPy array.

        Uses the wrapped model's current weights (they are copied to the stages first).

        Args:
            x: an array (for several inputs a list of arrays, or a dict by input name), or
                a `tf.data.Dataset` of input batches (`(x, y)` batches are accepted, as in
                Keras).
            batch_size: for arrays; default 32.
            verbose: accepted for Keras compatibility; nothing is printed.

        Returns:
            The model's outputs for all of `x`, concatenated along the batch axis.

        Raises:
            TypeError: if `x` is not arrays or a dataset.
            ValueError: if `compile` was not called, for bad `batch_size` or `verbose`,
                or inputs that do not fit the model (the message gives both shapes).
        """
        self._require_compiled()
        input_checks.check_verbose(verbose)
        is_dataset = isinstance(x, tf.data.Dataset)
        if is_dataset:
            input_checks.check_predict_dataset(self.model, x)
            ds = x
        else:
            bs = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
            input_checks.check_int("batch_size", bs, 1)
            input_checks.check_inputs(self.model, x)
            inputs = input_checks.model_inputs(self.model, x)
            ds = tf.data.Dataset.from_tensor_slices(inputs).batch(bs)
        self._push_weights()
        outputs = []
        for xb in ds:
            if is_dataset and isinstance(xb, tuple) and len(xb) in (2, 3):
                xb = xb[0]  # (x, y) or (x, y, sample_weight), as in Keras
            outputs.append(np.asarray(self._infer(xb)[0]))
        if not outputs:
            raise ValueError("`x` is empty: the dataset yielded no batch.")
        return np.concatenate(outputs, axis=0)
