"""Checks that data fit a model and its loss, before any training step runs.

Shapes and dtypes of each part of `x` against the model's inputs, and labels against each
model output and its loss (probed once on two examples); the parts are those of
`tf_spectrain.workflow.data_structure`, which refuses a structure that does not fit.
Errors name the argument and give both shapes. Used by `tf_spectrain.workflow.input_checks`
and `PipelineModel`'s `fit`, `evaluate` and `predict`.
"""

import numpy as np
import tensorflow as tf

from tf_spectrain.workflow import outputs as outputs_lib
from tf_spectrain.workflow.data_structure import (
    fits,
    input_parts,
    label_parts,
    rank_adjusted,
    shape_of,
)


def _numpy_dtype(obj):
    """The NumPy dtype of an array, tensor or TensorSpec."""
    dtype = obj.dtype
    return np.dtype(getattr(dtype, "as_numpy_dtype", dtype))


def _is_non_numeric(obj):
    """Whether `obj` holds objects, bytes, strings or voids rather than numbers."""
    return _numpy_dtype(obj).kind in "OSUV"  # objects, bytes, str, void



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
    for label, part, expected in input_parts(model, x, what):
        if not (hasattr(part, "shape") and hasattr(part, "dtype")):
            raise TypeError(
                f"`{what}` must be a NumPy array or a tensor (a list of them for several "
                f"inputs). Received: {label} of type {type(part).__name__}"
            )
        want, got = tuple(expected.shape), shape_of(part)
        if got is not None and not fits(want, got) and not rank_adjusted(want, got):
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
    """Whether `loss` is a sparse categorical loss (by its name)."""
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

    For several outputs, `y` holds one part per output (checked with `label_parts`) and
    `loss` is the `outputs.OutputLoss`: each part is checked against its output and loss.
    """
    if not outputs_lib.is_multi_output(model):
        _check_output_labels(model, model.outputs[0], loss, y, what, from_dataset)
        return
    parts = label_parts(model, y, what, from_dataset)
    if not from_dataset:
        parts = [(label, _as_labels(part, label)) for label, part in parts]
    if isinstance(loss, outputs_lib.OutputLoss):
        losses = loss.losses_for([part for _, part in parts])
    else:  # not compiled by `PipelineModel`: nothing to probe with
        losses = [None] * len(parts)
    names = outputs_lib.output_names(model)
    for (label, part), out, fn, name in zip(parts, model.outputs, losses, names):
        _check_output_labels(model, out, fn, part, what if from_dataset else label,
                             from_dataset, output=name)


def _check_output_labels(model, out, loss, y, what, from_dataset, output=None):
    """Checks the labels of output `out` (named `output` when there are several)."""
    # The loss is run once, eagerly, on a two-example slice of the labels (zeros for a
    # dataset) and zero outputs: if that fails, training would fail the same way, later and
    # deep inside TensorFlow (a ValueError here). Sparse categorical labels are also checked
    # to lie in [0, num_classes): out-of-range labels give NaN losses on GPUs, not an error.
    # An output without a loss (None) is only checked for a batch axis and numbers.
    out_shape, y_shape = tuple(out.shape), shape_of(y)
    for_output = "" if output is None else f" for output '{output}'"
    if y_shape is None:
        return
    if len(y_shape) == 0:
        raise ValueError(
            f"`{what}` must have a batch axis{for_output}. Received: {what} of shape ()"
        )
    if _is_non_numeric(y):
        raise ValueError(
            f"`{what}` must hold numbers{for_output} (encode class names as integers). "
            f"Received: {what} of dtype {_numpy_dtype(y)}"
        )
    if loss is None or any(d is None for d in out_shape[1:] + y_shape[1:]):
        return  # no loss, or variable-size outputs or labels: nothing to probe with
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
        source = (f"the dataset `{what}` yields labels{for_output} of" if from_dataset
                  else f"`{what}` has")
        which = "output" if output is None else f"output '{output}'"
        raise ValueError(
            f"The labels do not fit the model's {which}: model '{model.name}' outputs shape "
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
    if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
        raise ValueError(
            f"`{what}` must be a tf.data.Dataset of (x, y) or (x, y, sample_weight) batches. "
            f"Received: a dataset of elements {spec}"
        )
    if int(ds.cardinality()) == 0:
        raise ValueError(f"`{what}` is an empty dataset (0 batches).")
    check_inputs(model, spec[0], what=what, from_dataset=True)
    _check_labels(model, loss, spec[1], what=what, from_dataset=True)


def check_data(model, loss, x, y, names=("x", "y")):
    """Checks `(x, y)` arrays or an `(x, y)` dataset against the model and the loss.

    Args:
        model: the wrapped Keras model.
        loss: the compiled loss (a callable `loss(y_true, y_pred)`; for several outputs
            the `outputs.OutputLoss`).
        x, y: arrays (`x` one per model input, `y` one per model output), or `x` a
            dataset and `y` None.
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
    if outputs_lib.is_multi_output(model):
        for label, part in label_parts(model, y, y_name):
            _check_example_count(x_name, n_x, label, _as_labels(part, label))
        _check_labels(model, loss, y, y_name)
        return n_x
    labels = _as_labels(y, y_name)
    _check_example_count(x_name, n_x, y_name, labels)
    _check_labels(model, loss, labels, y_name)
    return n_x


def _check_example_count(x_name, n_x, y_name, labels):
    """Labels must have as many examples as the inputs."""
    y_shape = shape_of(labels)
    if y_shape and y_shape[0] is not None and y_shape[0] != n_x:
        raise ValueError(
            f"`{x_name}` and `{y_name}` must have the same number of examples. "
            f"Received: {n_x} and {y_shape[0]}"
        )


def check_predict_dataset(model, ds):
    """Checks a dataset for `predict`: input batches, or `(x, y[, w])` batches as in Keras.

    Args:
        model: the wrapped Keras model.
        ds: the `tf.data.Dataset` passed to `predict` as `x`.

    Raises:
        ValueError: if the dataset has 0 batches.
        TypeError, ValueError: if its inputs do not fit the model (see `check_inputs`).
    """
    spec = ds.element_spec
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        spec = spec[0]
    if int(ds.cardinality()) == 0:
        raise ValueError("`x` is an empty dataset (0 batches).")
    check_inputs(model, spec, what="x", from_dataset=True)
