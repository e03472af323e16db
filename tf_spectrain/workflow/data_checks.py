"""Checks that data fit a model and its loss, before any training step runs.

The structure of `x` (one array per model input, a list or a dict by input name) and of
`y` (for several outputs, one array per output: a list or a dict by output name), shapes,
dtypes, and labels against each model output and its loss (probed once on two examples).
Errors name the argument and give both shapes. Used by `tf_spectrain.workflow.input_checks` and
`PipelineModel`'s `fit`, `evaluate` and `predict`.
"""

import numpy as np
import tensorflow as tf

from tf_spectrain.partition import model_structure
from tf_spectrain.workflow import outputs as outputs_lib


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


def _rank_adjusted(expected, actual):
    """Whether Keras' functional models take `actual` for `expected` by adding or dropping
    a last axis of 1 (`(None,)` data for a `(None, 1)` input, as Keras does)."""
    if len(actual) == len(expected) - 1 and expected[-1] == 1:
        return _fits(expected[:-1], actual)
    if len(actual) == len(expected) + 1 and actual[-1] == 1:
        return _fits(expected, actual[:-1])
    return False


def _input_parts(model, x, what):
    """`x` split into one part per model input: [(label, part, expected KerasTensor)]."""
    inputs = list(model.inputs)
    names = input_names(model)
    if isinstance(x, dict):
        missing = [n for n in names if n not in x]
        if missing:
            raise ValueError(
                f"`{what}` is a dict, so its keys must be the names of the model's inputs "
                f"{names} (missing: {missing}). Received keys: {sorted(x, key=str)}"
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


def input_names(model):
    """The keys by which a dict of inputs feeds `model.inputs`, in that order, as in Keras:
    the keys of the dict the model was built with (`keras.Model(inputs={...})`, its inputs
    in sorted key order), else the input tensors' names."""
    structure = model_structure.input_structure(model)
    if isinstance(structure, dict):
        return sorted(structure)
    return [t.name for t in model.inputs]


def model_inputs(model, x):
    """Checked input arrays as the stages take them: one array, or a tuple in input order.

    A tuple, not a list: `from_tensor_slices` would stack a list into one tensor.

    Args:
        model: the wrapped Keras model.
        x: one array per model input (a single one, a list/tuple or a dict by input name).

    Returns:
        `x`'s single array, or a tuple of its arrays in the order of `model.inputs`, each
        given a last axis of 1 the model's input has and it lacks (or the reverse), as
        Keras' functional models do.

    Raises:
        ValueError: if `x` does not hold one array per model input.
    """
    parts = tuple(_as_input_rank(part, tuple(expected.shape))
                  for _, part, expected in _input_parts(model, x, "x"))
    return parts[0] if len(parts) == 1 else parts


def changes_inputs(model, x):
    """Whether `model_inputs` changes `x` (arrays or a dataset's TensorSpecs): a dict to
    put in order, or an input whose last axis of 1 Keras adds or drops."""
    if isinstance(x, dict):
        return True
    return any(_shape(part) is not None and not _fits(tuple(expected.shape), _shape(part))
               for _, part, expected in _input_parts(model, x, "x"))


def _as_input_rank(part, expected):
    """`part` (an array or tensor) with the last axis of 1 added or dropped that Keras'
    functional models add or drop (`_rank_adjusted`), so that the stages see the inputs'
    own rank."""
    shape = _shape(part)
    if shape is None or _fits(expected, shape) or not _rank_adjusted(expected, shape):
        return part
    return part[..., None] if len(shape) < len(expected) else part[..., 0]


def _label_parts(model, y, what, from_dataset=False):
    """`y` of a model with several outputs, split per output: [(label, part)] in order."""
    names = outputs_lib.output_names(model)
    whose = f"the dataset `{what}` yields labels that are" if from_dataset else f"`{what}` is"
    if isinstance(y, dict):
        if set(y) != set(names):
            raise ValueError(
                f"{whose} a dict, so its keys must be the names of the model's outputs "
                f"{names}. Received keys: {sorted(y, key=str)}"
            )
        return [(f"{what}['{n}']", y[n]) for n in names]
    if isinstance(y, (list, tuple)):
        if len(y) != len(names):
            raise ValueError(
                f"Model '{model.name}' has {len(names)} outputs {names}, but {whose} a "
                f"{type(y).__name__} of {len(y)} items; pass one label array per model "
                "output, in that order (or a dict by output name)."
            )
        return [(f"{what}[{k}]", part) for k, part in enumerate(y)]
    if from_dataset:
        raise ValueError(
            f"Model '{model.name}' has {len(names)} outputs {names}: the dataset `{what}` "
            f"must yield (x, y) batches whose y is a tuple of {len(names)} tensors, one per "
            f"output (or a dict by output name). Received: labels {y}"
        )
    raise ValueError(
        f"Model '{model.name}' has {len(names)} outputs {names}: pass `{what}` as a list of "
        f"{len(names)} arrays, one per output (or a dict by output name). Received: a "
        f"single {type(y).__name__}"
    )


def model_labels(model, y):
    """Labels as the stages take them: as given for one output, else a tuple in output order.

    A tuple, not a list: `from_tensor_slices` would stack a list into one tensor.

    Args:
        model: the wrapped Keras model.
        y: the labels (already checked); for several outputs a list, tuple or dict by output
            name of one array (or tensor) per output.

    Returns:
        `y` for a model with one output, else a tuple of its parts in the order of
        `model.outputs`.
    """
    if not outputs_lib.is_multi_output(model):
        return y
    return tuple(part for _, part in _label_parts(model, y, "y"))


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
        if got is not None and not _fits(want, got) and not _rank_adjusted(want, got):
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

    For several outputs, `y` holds one part per output (checked with `_label_parts`) and
    `loss` is the `outputs.OutputLoss`: each part is checked against its output and loss.
    """
    if not outputs_lib.is_multi_output(model):
        _check_output_labels(model, model.outputs[0], loss, y, what, from_dataset)
        return
    parts = _label_parts(model, y, what, from_dataset)
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
    out_shape, y_shape = tuple(out.shape), _shape(y)
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
        for label, part in _label_parts(model, y, y_name):
            _check_example_count(x_name, n_x, label, _as_labels(part, label))
        _check_labels(model, loss, y, y_name)
        return n_x
    labels = _as_labels(y, y_name)
    _check_example_count(x_name, n_x, y_name, labels)
    _check_labels(model, loss, labels, y_name)
    return n_x


def _check_example_count(x_name, n_x, y_name, labels):
    """Labels must have as many examples as the inputs."""
    y_shape = _shape(labels)
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
