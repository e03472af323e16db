"""Checks of `PipelineModel`'s arguments and data, before any training step runs.

Every check raises `ValueError` or `TypeError` with a message that names the argument,
shows the bad value and says what is valid; data that does not fit the model gives both
shapes. `PipelineModel.fit`, `evaluate` and `predict` call these once, at the API boundary,
so a mistake never surfaces later from deep inside Keras, TensorFlow or a stage thread.
"""

import keras
import numpy as np
import tensorflow as tf

DEFAULT_BATCH_SIZE = 32
"""Batch size of `fit`, `evaluate` and `predict` when `batch_size` is None, as in Keras."""


def check_int(name, value, minimum):
    """Checks that argument `name` is an integer (not a bool) >= `minimum`.

    Raises:
        ValueError: if `value` is not such an integer.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")


def _check_optional_int(name, value, minimum):
    if value is not None:
        check_int(name, value, minimum)


_VERBOSE_HELP = "'auto', 0 (silent), 1 (progress bar) or 2 (one line per epoch)"


def check_verbose(verbose):
    """Checks `verbose` as Keras takes it: "auto", 0, 1 or 2.

    Raises:
        ValueError: for any other value.
    """
    if isinstance(verbose, str):
        ok = verbose == "auto"
    else:
        ok = isinstance(verbose, (int, np.integer)) and 0 <= verbose <= 2
    if not ok:
        raise ValueError(f"`verbose` must be {_VERBOSE_HELP}. Received: verbose={verbose!r}")


def check_bool(name, value):
    """Checks that argument `name` is a Python or NumPy bool.

    Raises:
        TypeError: if `value` is not a bool.
    """
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


def model_inputs(model, x):
    """Checked input arrays as the stages take them: one array, or a tuple in input order.

    A tuple, not a list: `from_tensor_slices` would stack a list into one tensor.

    Args:
        model: the wrapped Keras model.
        x: one array per model input (a single one, a list/tuple or a dict by input name).

    Returns:
        `x`'s single array, or a tuple of its arrays in the order of `model.inputs`.

    Raises:
        ValueError: if `x` does not hold one array per model input.
    """
    parts = tuple(part for _, part, _ in _input_parts(model, x, "x"))
    return parts[0] if len(parts) == 1 else parts


def check_inputs(model, x, what="x", from_dataset=False):
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
    check_inputs(model, spec[0], what=what, from_dataset=True)
    _check_labels(model, loss, spec[1], what=what, from_dataset=True)


def check_data(model, loss, x, y, names=("x", "y")):
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
    n_x = check_inputs(model, x, x_name)
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


def check_predict_dataset(model, ds):
    """Checks a dataset for `predict`: input batches, or `(x, y[, w])` batches as in Keras.

    Raises:
        TypeError, ValueError: if the dataset is empty or its inputs do not fit the model.
    """
    spec = ds.element_spec
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        spec = spec[0]
    if int(ds.cardinality()) == 0:
        raise ValueError("`x` is an empty dataset (0 batches).")
    check_inputs(model, spec, what="x", from_dataset=True)


def unpack_validation_data(validation_data):
    """`(x_val, y_val)` from `validation_data` (a tuple/list of 2, or a dataset and None).

    Returns:
        `(x_val, y_val)`, with `y_val` None when `validation_data` is a dataset.

    Raises:
        ValueError: for a tuple or list that does not have 2 items.
        TypeError: for anything else that is not a tuple, list or tf.data.Dataset.
    """
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


def validation_names(y_val):
    """How messages call the parts of `validation_data`: the `names` of `check_data`."""
    if y_val is None:
        return ("validation_data", "validation_data")
    return ("validation_data[0]", "validation_data[1]")


def check_fit_args(
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
    check_int("epochs", epochs, 1)
    check_int("initial_epoch", initial_epoch, 0)
    if initial_epoch >= epochs:
        raise ValueError(
            "`initial_epoch` must be smaller than `epochs` (fit trains epochs "
            f"initial_epoch .. epochs - 1). Received: initial_epoch={initial_epoch}, "
            f"epochs={epochs}"
        )
    _check_optional_int("batch_size", batch_size, 1)
    _check_optional_int("steps_per_epoch", steps_per_epoch, 1)
    check_verbose(verbose)
    _check_callbacks(callbacks)
    check_bool("shuffle", shuffle)
    n = check_data(model, loss, x, y)
    if validation_data is not None:
        x_val, y_val = unpack_validation_data(validation_data)
        check_data(model, loss, x_val, y_val, names=validation_names(y_val))
    if steps_per_epoch is not None:
        _check_enough_batches(x, n, batch_size, steps_per_epoch, epochs - initial_epoch)


def _check_enough_batches(x, n, batch_size, steps_per_epoch, num_epochs):
    """With `steps_per_epoch` one iterator runs through all epochs: it must last."""
    if n is not None:
        size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
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
