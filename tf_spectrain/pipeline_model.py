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

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import compile_utils, devices as devices_lib, modes, partition, schedule
from tf_spectrain.optimizer import SpecTrainSGD
from tf_spectrain.runtime.executor import EpochRun
from tf_spectrain.runtime.stage import StageRunner, as_list, one_or_list

_DEFAULT_BATCH_SIZE = 32


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")


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
        _check_int("micro_batches", micro_batches, 1)
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

    def _pull_weights(self):
        partition.copy_weights(self.stages, self._split)

    # --- data ---------------------------------------------------------------------------

    def _dataset(self, x, y, batch_size, shuffle):
        if isinstance(x, tf.data.Dataset):
            if y is not None:
                raise ValueError(
                    "`y` must be None when `x` is a tf.data.Dataset of (x, y) batches. "
                    f"Received: y of type {type(y).__name__}"
                )
            return x
        if x is None or y is None:
            raise ValueError(
                "`fit`/`evaluate` need `x` and `y` arrays, or a tf.data.Dataset of (x, y) "
                f"batches as `x`. Received: x={type(x).__name__}, y={type(y).__name__}"
            )
        batch_size = _DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        _check_int("batch_size", batch_size, 1)
        n_x, n_y = len(tf.nest.flatten(x)[0]), len(y)
        if n_x != n_y:
            raise ValueError(
                f"`x` and `y` must have the same number of examples. Received: {n_x} and {n_y}"
            )
        if isinstance(x, list):
            x = tuple(x)  # several inputs (a list would be stacked into one tensor)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if shuffle:
            ds = ds.shuffle(n_x, reshuffle_each_iteration=True)
        return ds.batch(batch_size).prefetch(2)

    @staticmethod
    def _num_batches(ds, steps):
        if steps is not None:
            _check_int("steps_per_epoch", steps, 1)
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

    def _record_batch(self, i, parts):
        # The loss Keras reports includes the layer losses (regularizers) of every stage.
        penalty = sum(float(p) for r in self.runners for p in r.penalties.pop(i, ()))
        loss = sum(float(p[0]) for p in parts) + penalty
        size = sum(int(tf.shape(p[1])[0]) for p in parts)
        self._loss_tracker.update_state(loss, sample_weight=size)
        for _, logits, labels in parts:
            for m in self.metrics:
                m.update_state(labels, logits)

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

        Returns:
            The `keras.callbacks.History` of the run.

        Raises:
            ValueError: before training, for bad arguments (`epochs`, `batch_size`, data
                of mismatched lengths, a dataset of unknown length without
                `steps_per_epoch`) or when `compile` was not called; during training,
                the first error of any stage or callback, re-raised with its traceback.

        A callback that sets `model.stop_training` ends training at the end of the
        current epoch (the pipeline drains only there), not after the current mini-batch.
        """
        runners = self._require_compiled()
        _check_int("epochs", epochs, 1)
        _check_int("initial_epoch", initial_epoch, 0)
        ds = self._dataset(x, y, batch_size, shuffle)
        num_batches = self._num_batches(ds, steps_per_epoch)
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
            batches = iterator if iterator is not None else iter(ds)
            op_lists = self._op_lists(num_batches)
            run = EpochRun(
                runners, op_lists, batches, self.micro_batches, self._keep_rules(op_lists)
            )

            def on_batch(i, parts):
                callback_list.on_train_batch_begin(i)
                self._record_batch(i, parts)
                callback_list.on_train_batch_end(i, self._logs())

            try:
                run.run(on_batch)
            finally:
                self._pull_weights()
            logs = self._logs()
            if validation_data is not None:
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

    def _evaluate_logs(self, data, batch_size):
        if isinstance(data, tuple):
            if len(data) != 2:
                raise ValueError(
                    "`validation_data` must be (x_val, y_val) or a tf.data.Dataset. "
                    f"Received: a tuple of {len(data)}"
                )
            ds = self._dataset(data[0], data[1], batch_size, shuffle=False)
        else:
            ds = self._dataset(data, None, batch_size, shuffle=False)
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
            x, y: arrays, or `x` a `tf.data.Dataset` of `(x, y)` batches.
            batch_size: for arrays; default 32.
            verbose: 0 prints nothing; otherwise one line with the results.
            return_dict: return `{"loss": ..., metric: ...}` instead of a list.

        Returns:
            The loss (no metrics), a list `[loss, *metrics]`, or a dict.

        Raises:
            ValueError: if `compile` was not called, or for bad data arguments.
        """
        self._require_compiled()
        self._push_weights()
        if isinstance(x, tf.data.Dataset):
            logs = self._evaluate_logs(x, batch_size)
        else:
            logs = self._evaluate_logs((x, y), batch_size)
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
            x: an array (a list of arrays for several inputs), or a `tf.data.Dataset` of
                input batches (`(x, y)` batches are accepted, as in Keras).
            batch_size: for arrays; default 32.
            verbose: accepted for Keras compatibility; nothing is printed.

        Returns:
            The model's outputs for all of `x`, concatenated along the batch axis.

        Raises:
            ValueError: if `compile` was not called or `batch_size` is invalid.
        """
        self._require_compiled()
        self._push_weights()
        is_dataset = isinstance(x, tf.data.Dataset)
        if is_dataset:
            ds = x
        else:
            bs = _DEFAULT_BATCH_SIZE if batch_size is None else batch_size
            _check_int("batch_size", bs, 1)
            ds = tf.data.Dataset.from_tensor_slices(tuple(x) if isinstance(x, list) else x)
            ds = ds.batch(bs)
        outputs = []
        for xb in ds:
            if is_dataset and isinstance(xb, tuple) and len(xb) in (2, 3):
                xb = xb[0]  # (x, y) or (x, y, sample_weight), as in Keras
            outputs.append(np.asarray(self._infer(xb)[0]))
        return np.concatenate(outputs, axis=0)
