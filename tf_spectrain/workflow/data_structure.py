"""The structure of `x` and `y`: one part per model input and per model output, in order.

`x` is one array per model input (a single one, a list or a dict by input name) and `y`,
for a model with several outputs, one array per output (a list or a dict by output name).
This module splits them into those parts, in the order of `model.inputs` and
`model.outputs`, and gives inputs the last axis of 1 that Keras' functional models add or
drop. Whether the parts fit the model and its loss is `tf_spectrain.workflow.data_checks`.
"""

import tensorflow as tf

from tf_spectrain.partition import model_structure
from tf_spectrain.workflow import outputs as outputs_lib


def shape_of(obj):
    """The shape of an array, tensor or TensorSpec as a tuple (None where unknown)."""
    shape = tf.TensorShape(obj.shape)
    return None if shape.rank is None else tuple(shape.as_list())



def fits(expected, actual):
    """Whether shape `actual` matches `expected` (None matches any size)."""
    return len(expected) == len(actual) and all(
        e is None or a is None or e == a for e, a in zip(expected, actual)
    )


def rank_adjusted(expected, actual):
    """Whether Keras' functional models take `actual` for `expected` by adding or dropping
    a last axis of 1 (`(None,)` data for a `(None, 1)` input, as Keras does)."""
    if len(actual) == len(expected) - 1 and expected[-1] == 1:
        return fits(expected[:-1], actual)
    if len(actual) == len(expected) + 1 and actual[-1] == 1:
        return fits(expected, actual[:-1])
    return False


def input_parts(model, x, what):
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
                  for _, part, expected in input_parts(model, x, "x"))
    return parts[0] if len(parts) == 1 else parts


def changes_inputs(model, x):
    """Whether `model_inputs` changes `x` (arrays or a dataset's TensorSpecs): a dict to
    put in order, or an input whose last axis of 1 Keras adds or drops."""
    if isinstance(x, dict):
        return True
    return any(shape_of(part) is not None and not fits(tuple(expected.shape), shape_of(part))
               for _, part, expected in input_parts(model, x, "x"))


def _as_input_rank(part, expected):
    """`part` (an array or tensor) with the last axis of 1 added or dropped that Keras'
    functional models add or drop (`rank_adjusted`), so that the stages see the inputs'
    own rank."""
    shape = shape_of(part)
    if shape is None or fits(expected, shape) or not rank_adjusted(expected, shape):
        return part
    return part[..., None] if len(shape) < len(expected) else part[..., 0]



def label_parts(model, y, what, from_dataset=False):
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
    return tuple(part for _, part in label_parts(model, y, "y"))

