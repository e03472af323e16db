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

from tf_spectrain import compile_utils, devices as devices_lib, modes, partition, schedule
from tf_spectrain.optimizer import SpecTrainSGD
from tf_spectrain.runtime.executor import EpochRun
from tf_spectrain.runtime.stage import StageRunner, as_list, one_or_list

_DEFAULT_BATCH_SIZE = 32
ON_NAN = ("stop", "skip")


class NonFiniteLossError(FloatingPointError):
    """Training met a non-finite loss (with `on_nan="stop"`); the message says where."""


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")


def _check_optional_int(name, value, minimum):
    if value is not None:
        _check_int(name, value, minimum)


_VERBOSE_HELP = "'auto', 0 (silent), 1 (progress bar) or 2 (one line per epoch)"


def _check_verbose(verbose):
    if isinstance(verbose, str):
        ok = verbose == "auto"
    else:
        ok = isinstance(verbose, (int, np.integer)) and 0 <= verbose <= 2
    if not ok:
        raise ValueError(f"`verbose` must be {_VERBOSE_HELP}. Received: verbose={verbose!r}")


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be True or False. Received: {name}={value!r}")


def _check_callbacks(callbacks):
    if callbacks is None:
        return
    if isinstance(callbacks, keras.callbacks.Callback):
        raise TypeError(
            "`callbacks` must be a list of keras.callbacks.Callback instances. Received: "
            f"callbacks={callbacks!r}; did you mean callbacks=[{type(callbacks).__name__}(...)]?"
        )
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(
            "`callbacks` must be a list of keras.callbacks.Callback instances. "
            f"Received: callbacks={callbacks!r} of type {type(callbacks).__name__}"
        )
    for c in callbacks:
        if not isinstance(c, keras.callbacks.Callback):
            what = "a class, not an instance" if isinstance(c, type) else type(c).__name__
            raise TypeError(
                "`callbacks` must contain keras.callbacks.Callback instances. "
                f"Received: {c!r} ({what}) in callbacks"
            )


# --- data checks: shapes and structure, before any training step ---------------------------


def _shape(obj):
    """The shape of an array, tensor or TensorSpec as a tuple (None where unknown)."""
    shape = tf.TensorShape(obj.shape)
    return None if shape.rank is None else tuple(shape.as_list())


def _numpy_dtype(obj):
    dtype = obj.dtype
    return np.dtype(getattr(dtype, "as_numpy_dtype", dtype))


def _is_non_numeric(obj):
    return _numpy_dtype(obj).kind in "OSUV"  # objects, bytes, str, void


def _fits(expected, actual):
    return len(expected) == len(actual) and all(
        e is None or a is None or e == a for e, a in zip(expected, actual)
    )


def _input_parts(model, x, what):
    """`x` split into one part per model input: [(label, part, expected KerasTensor)]."""
    inputs = list(model.inputs)
    names = [t.name for t in inputs]
    if isinstance(x, dict):
        if set(x) != set(names):
            raise ValueError(
                f"`{what}` is a dict, so its keys must be the names of the model's inputs "
                f"{names}. Received keys: {sorted(x, key=str)}"
            )
        return [(f"{what}['{n}']", x[n], t) for n, t in zip(names, inputs)]
    if isinstance(x, (list, tuple)):
        if len(x) != len(inputs):
            raise ValueError(
                f"Model '{model.name}' has {len(inputs)} input(s) {names}, but `{what}` is a "
                f"{type(x).__name__} of {len(x)} items; pass one array per model input"
                + (" (a single NumPy array for a one-input model)." if len(inputs) == 1 else ".")
            )
        return [(f"{what}[{k}]", part, t) for k, (part, t) in enumerate(zip(x, inputs))]
    if len(inputs) != 1:
        raise ValueError(
            f"Model '{model.name}' has {len(inputs)} inputs {names}: pass `{what}` as a list "
            f"of {len(inputs)} arrays (or a dict by input name). Received: a single "
            f"{type(x).__name__}"
        )
    return [(what, x, inputs[0])]


def _model_inputs(model, x):
    """Checked input arrays as the stages take them: one array, or a tuple in input order.

    A tuple, not a list: `from_tensor_slices` would stack a list into one tensor.
    """
    parts = tuple(part for _, part, _ in _input_parts(model, x, "x"))
    return parts[0] if len(parts) == 1 else parts


def _check_inputs(model, x, what="x", from_dataset=False):
    """Checks arrays, tensors or TensorSpecs `x` against the model's inputs.

    Args:
        model: the wrapped Keras model.
        x: one array per model input (a single one, a list/tuple or a dict by input
            name), or the matching TensorSpecs of a dataset's batches.
        what: how the error message calls `x`.
        from_dataset: `x` holds the `element_spec` of a dataset of batches.

    Returns:
        The number of examples (None for a dataset).

    Raises:
        TypeError: if a part is not an array or tensor.
        ValueError: if the structure, a shape or a dtype does not match the model.
    """
    sizes = []
    for label, part, expected in _input_parts(model, x, what):
        if not (hasattr(part, "shape") and hasattr(part, "dtype")):
            raise TypeError(
                f"`{what}` must be a NumPy array or a tensor (a list of them for several "
                f"inputs). Received: {label} of type {type(part).__name__}"
            )
        want, got = tuple(expected.shape), _shape(part)
        if got is not None and not _fits(want, got):
            if from_dataset:
                source = f"the dataset `{what}` yields {'inputs' if label == what else label} of"
            else:
                source = f"{label} has"
            hint = ""
            if from_dataset and len(got) == len(want) - 1:
                hint = "; batch the dataset first (dataset.batch(batch_size))"
            raise ValueError(
                f"Model '{model.name}' expects inputs of shape {want} but {source} shape "
                f"{got}{hint}."
            )
        if expected.dtype != "string" and _is_non_numeric(part):
            raise ValueError(
                f"`{what}` must hold numbers: the model's input '{expected.name}' is "
                f"{expected.dtype}, but {label} has dtype {_numpy_dtype(part)}."
            )
        if not from_dataset:
            sizes.append(got[0])
    if from_dataset:
        return None
    if len(set(sizes)) > 1:
        raise ValueError(
            f"All arrays of `{what}` must have the same number of examples. Received: {sizes}"
        )
    if sizes[0] == 0:
        raise ValueError(f"`{what}` is empty (0 examples).")
    return sizes[0]


def _is_sparse_categorical(loss):
    name = getattr(loss, "name", None) or getattr(loss, "__name__", "") or ""
    return "sparse_categorical" in name


def _as_labels(y, what):
    """`y` as an array-like with `shape` and `dtype` (a list of numbers becomes an array)."""
    if hasattr(y, "shape") and hasattr(y, "dtype"):
        return y
    if isinstance(y, (list, tuple)):
        try:
            return np.asarray(y)
        except ValueError:
            pass
    raise TypeError(
        f"`{what}` must be a NumPy array or a tensor of labels. "
        f"Received: {what} of type {type(y).__name__}"
    )


def _check_labels(model, loss, y, what="y", from_dataset=False):
    """Checks labels (an array, or a dataset's TensorSpec) against the output and the loss.

    The loss is run once, eagerly, on a two-example slice of the labels (zeros for a
    dataset) and zero outputs: if that fails, training would fail the same way, later
    and deep inside TensorFlow. Sparse categorical labels are also checked to lie in
    `[0, num_classes)` (out-of-range labels give NaN losses on GPUs instead of an error).
    Models with several outputs are left to the loss.

    Raises:
        ValueError: if the labels do not fit the model's output and the loss.
    """
    if len(model.outputs) != 1:
        return
    out = model.outputs[0]
    out_shape, y_shape = tuple(out.shape), _shape(y)
    if y_shape is None:
        return
    if len(y_shape) == 0:
        raise ValueError(f"`{what}` must have a batch axis. Received: {what} of shape ()")
    if _is_non_numeric(y):
        raise ValueError(
            f"`{what}` must hold numbers (encode class names as integers). "
            f"Received: {what} of dtype {_numpy_dtype(y)}"
        )
    if any(d is None for d in out_shape[1:] + y_shape[1:]):
        return  # variable-size outputs or labels: nothing to probe with
    if not from_dataset and _is_sparse_categorical(loss):
        _check_label_range(loss, np.asarray(y), out_shape[-1], what)
    if from_dataset:
        sample = tf.zeros((2,) + y_shape[1:], dtype=y.dtype)
    else:
        sample = tf.convert_to_tensor(np.asarray(y[:2]))
    outputs = tf.zeros((int(sample.shape[0]),) + out_shape[1:], dtype=out.dtype or "float32")
    loss_name = getattr(loss, "name", None) or getattr(loss, "__name__", type(loss).__name__)
    try:
        loss(sample, outputs)
    except (ValueError, TypeError, tf.errors.OpError) as e:
        lines = str(e).strip().splitlines()
        reason = lines[-1] if lines else type(e).__name__
        source = f"the dataset `{what}` yields labels of" if from_dataset else f"`{what}` has"
        raise ValueError(
            f"The labels do not fit the model's output: model '{model.name}' outputs shape "
            f"{out_shape} but {source} shape {y_shape}, which the loss '{loss_name}' "
            f"cannot take ({reason})."
        ) from None


def _check_label_range(loss, y, num_classes, what):
    ignore = loss.get_config().get("ignore_class") if hasattr(loss, "get_config") else None
    values = y if ignore is None else y[y != ignore]
    if values.size and (values.min() < 0 or values.max() >= num_classes):
        raise ValueError(
            f"`{what}` holds class indices for the sparse categorical loss, which must lie "
            f"in [0, {num_classes}) for the model's {num_classes} outputs. Received: "
            f"labels from {values.min()} to {values.max()}"
        )


def _check_dataset(model, loss, ds, what="x"):
    """Checks that a dataset yields `(x, y)` batches that fit the model and the loss."""
    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        if isinstance(spec, tuple) and len(spec) == 3:
            found = "(x, y, sample_weight) triples; sample weights are not supported"
        else:
            found = f"elements {spec}"
        raise ValueError(
            f"`{what}` must be a tf.data.Dataset of (x, y) batches. Received: a dataset "
            f"of {found}"
        )
    if int(ds.cardinality()) == 0:
        raise ValueError(f"`{what}` is an empty dataset (0 batches).")
    _check_inputs(model, spec[0], what=what, from_dataset=True)
    _check_labels(model, loss, spec[1], what=what, from_dataset=True)


def _check_data(model, loss, x, y, names=("x", "y")):
    """Checks `(x, y)` arrays or an `(x, y)` dataset against the model and the loss.

    Args:
        model: the wrapped Keras model.
        loss: the compiled loss (a callable `loss(y_true, y_pred)`).
        x, y: arrays (`x` one per model input), or `x` a dataset and `y` None.
        names: how the messages call `x` and `y` (e.g. `("x_val", "y_val")`).

    Returns:
        The number of examples, or None for a dataset.

    Raises:
        TypeError, ValueError: for data that does not fit the model or the loss.
    """
    x_name, y_name = names
    if isinstance(x, tf.data.Dataset):
        if y is not None:
            raise ValueError(
                f"`{y_name}` must be None when `{x_name}` is a tf.data.Dataset of (x, y) "
                f"batches. Received: {y_name} of type {type(y).__name__}"
            )
        _check_dataset(model, loss, x, x_name)
        return None
    if x is None or y is None:
        raise ValueError(
            f"Pass `{x_name}` and `{y_name}` arrays, or a tf.data.Dataset of (x, y) batches "
            f"as `{x_name}`. Received: {x_name}={type(x).__name__}, {y_name}={type(y).__name__}"
        )
    n_x = _check_inputs(model, x, x_name)
    if len(model.outputs) != 1:
        return n_x  # several outputs: the loss decides what `y` holds
    labels = _as_labels(y, y_name)
    y_shape = _shape(labels)
    if y_shape and y_shape[0] is not None and y_shape[0] != n_x:
        raise ValueError(
            f"`{x_name}` and `{y_name}` must have the same number of examples. "
            f"Received: {n_x} and {y_shape[0]}"
        )
    _check_labels(model, loss, labels, y_name)
    return n_x


def _check_predict_dataset(model, ds):
    """Checks a dataset for `predict`: input batches, or `(x, y[, w])` batches as in Keras."""
    spec = ds.element_spec
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        spec = spec[0]
    if int(ds.cardinality()) == 0:
        raise ValueError("`x` is an empty dataset (0 batches).")
    _check_inputs(model, spec, what="x", from_dataset=True)


def _unpack_validation_data(validation_data):
    """`(x_val, y_val)` from `validation_data` (a tuple/list of 2, or a dataset and None)."""
    if isinstance(validation_data, tf.data.Dataset):
        return validation_data, None
    if isinstance(validation_data, (tuple, list)) and len(validation_data) == 2:
        return validation_data[0], validation_data[1]
    if isinstance(validation_data, (tuple, list)):
        extra = "; sample weights are not supported" if len(validation_data) == 3 else ""
        raise ValueError(
            "`validation_data` must be (x_val, y_val) or a tf.data.Dataset of (x, y) "
            f"batches. Received: a {type(validation_data).__name__} of "
            f"{len(validation_data)}{extra}"
        )
    raise TypeError(
        "`validation_data` must be (x_val, y_val) or a tf.data.Dataset of (x, y) batches. "
        f"Received: validation_data of type {type(validation_data).__name__}"
    )


def _validation_names(y_val):
    """How messages call the parts of `validation_data`."""
    if y_val is None:
        return ("validation_data", "validation_data")
    return ("validation_data[0]", "validation_data[1]")


def _check_fit_args(
    model,
    loss,
    *,
    x,
    y,
    batch_size,
    epochs,
    verbose,
    callbacks,
    validation_data,
    shuffle,
    initial_epoch,
    steps_per_epoch,
):
    """Checks every argument of `PipelineModel.fit` before anything runs.

    Call it first in `fit` (after `_require_compiled`), with `fit`'s arguments as passed.

    Args:
        model: the wrapped Keras model (its inputs and output give the expected shapes).
        loss: the compiled loss, probed once on the labels.
        x, y, batch_size, epochs, verbose, callbacks, validation_data, shuffle,
            initial_epoch, steps_per_epoch: `fit`'s arguments.

    Raises:
        TypeError: an argument of the wrong type (callbacks, shuffle, data that is not
            arrays or a dataset).
        ValueError: a bad value, or data whose shapes do not fit the model or the loss
            (the message gives both shapes); the message names the argument.
    """
    _check_int("epochs", epochs, 1)
    _check_int("initial_epoch", initial_epoch, 0)
    if initial_epoch >= epochs:
        raise ValueError(
            "`initial_epoch` must be smaller than `epochs` (fit trains epochs "
            f"initial_epoch .. epochs - 1). Received: initial_epoch={initial_epoch}, "
            f"epochs={epochs}"
        )
    _check_optional_int("batch_size", batch_size, 1)
    _check_optional_int("steps_per_epoch", steps_per_epoch, 1)
    _check_verbose(verbose)
    _check_callbacks(callbacks)
    _check_bool("shuffle", shuffle)
    n = _check_data(model, loss, x, y)
    if validation_data is not None:
        x_val, y_val = _unpack_validation_data(validation_data)
        _check_data(model, loss, x_val, y_val, names=_validation_names(y_val))
    if steps_per_epoch is not None:
        _check_enough_batches(x, n, batch_size, steps_per_epoch, epochs - initial_epoch)


def _check_enough_batches(x, n, batch_size, steps_per_epoch, num_epochs):
    """With `steps_per_epoch` one iterator runs through all epochs: it must last."""
    if n is not None:
        size = _DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        available, source = -(-n // size), f"{n} examples in batches of {size} give"
        fix = "lower `steps_per_epoch`, or pass a repeated tf.data.Dataset"
    else:
        available, source = int(x.cardinality()), "the dataset has"
        fix = "repeat the dataset (dataset.repeat()) or lower `steps_per_epoch`"
    needed = steps_per_epoch * num_epochs
    if 0 <= available < needed:
        raise ValueError(
            f"`steps_per_epoch`={steps_per_epoch} for {num_epochs} epoch(s) needs {needed} "
            f"batches (one iterator runs through all epochs), but {source} only "
            f"{available}: {fix}."
        )


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
        self._epoch_run = None
        self.epoch_progress = None  # (epoch, mini-batches done in it, mini-batches per epoch)
        self.epoch_seconds = 0.0  # wall time of the last epoch's training part (no validation)
        self.images_seen = 0  # training examples reported so far in this `fit`
        self.batches_skipped = 0  # mini-batches left out by on_nan="skip" in this `fit`

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

    def _dataset(self, x, y, batch_size, shuffle, names=("x", "y")):
        """`(x, y)` batches from arrays or a dataset, checked against the model and loss."""
        batch_size = _DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        _check_int("batch_size", batch_size, 1)
        n_x = _check_data(self.model, self.loss, x, y, names)
        if n_x is None:
            return x  # a dataset of (x, y) batches, used as given
        ds = tf.data.Dataset.from_tensor_slices((_model_inputs(self.model, x), y))
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

    def _record_batch(self, epoch, i, parts, on_nan):
        # The loss Keras reports includes the layer losses (regularizers) of every stage.
        penalty = sum(float(p) for r in self.runners for p in r.penalties.pop(i, ()))
        loss = sum(float(p[0]) for p in parts) + penalty
        size = sum(int(tf.shape(p[1])[0]) for p in parts)
        self.images_seen += size
        if not np.isfinite(loss):
            if on_nan == "stop":
                raise NonFiniteLossError(self._non_finite_message(epoch, i, loss))
            self.batches_skipped += 1
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
        _check_fit_args(
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
        for runner in runners:
            runner.skip_non_finite = on_nan == "skip"
        self._attach(callbacks)
        self.images_seen = 0
        self.batches_skipped = 0
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
                runners,
                op_lists,
                batches,
                self.micro_batches,
                self._keep_rules(op_lists),
                label=f"epoch {epoch}",
            )
            for runner in runners:
                runner.timeline.clear()
            self.epoch_progress = (epoch, 0, num_batches)

            def on_batch(i, parts, epoch=epoch, run=run):
                callback_list.on_train_batch_begin(i)
                self._record_batch(epoch, i, parts, on_nan)
                self.epoch_progress = (epoch, i + 1, num_batches)
                callback_list.on_train_batch_end(i, self._logs())
                if self.model.stop_training:
                    run.request_stop()

            self._epoch_run = run
            started = time.perf_counter()
            try:
                if self.model.stop_training:
                    run.request_stop()  # stopped from outside before this epoch began
                run.run(on_batch)
            finally:
                self._epoch_run = None
                self.epoch_seconds = time.perf_counter() - started
                self._pull_weights()
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
        x, y = _unpack_validation_data(data)
        names = _validation_names(y) if names is None else names
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
        _check_verbose(verbose)
        _check_bool("return_dict", return_dict)
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
        _check_verbose(verbose)
        is_dataset = isinstance(x, tf.data.Dataset)
        if is_dataset:
            _check_predict_dataset(self.model, x)
            ds = x
        else:
            bs = _DEFAULT_BATCH_SIZE if batch_size is None else batch_size
            _check_int("batch_size", bs, 1)
            _check_inputs(self.model, x)
            ds = tf.data.Dataset.from_tensor_slices(_model_inputs(self.model, x)).batch(bs)
        self._push_weights()
        outputs = []
        for xb in ds:
            if is_dataset and isinstance(xb, tuple) and len(xb) in (2, 3):
                xb = xb[0]  # (x, y) or (x, y, sample_weight), as in Keras
            outputs.append(np.asarray(self._infer(xb)[0]))
        if not outputs:
            raise ValueError("`x` is empty: the dataset yielded no batch.")
        return np.concatenate(outputs, axis=0)
