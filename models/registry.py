"""The model registry: build any model of the zoo by name, with validated arguments.

    model = get_model("resnet20", input_shape=(32, 32, 3), num_classes=10)

Each entry says which builder makes the model and the smallest image side it accepts
(None: any input shape, like the MLP). All arguments are checked here, once, so the
builders can assume valid input.
"""

import collections
import inspect
import numbers

from tf_spectrain.messages import did_you_mean

from . import resnet, small, vgg

_Entry = collections.namedtuple("_Entry", ["builder", "min_side"])

# Five 2x2 poolings (VGG16) or the ResNet-50 stem plus its strides need at least 32 pixels.
MIN_CONV_SIDE = 32

_MODELS = {
    "mlp": _Entry(small.mlp, min_side=None),
    "small_cnn": _Entry(small.small_cnn, min_side=MIN_CONV_SIDE),
    "vgg16": _Entry(vgg.vgg16, min_side=MIN_CONV_SIDE),
    "resnet20": _Entry(resnet.resnet20, min_side=MIN_CONV_SIDE),
    "resnet56": _Entry(resnet.resnet56, min_side=MIN_CONV_SIDE),
    "resnet50": _Entry(resnet.resnet50, min_side=MIN_CONV_SIDE),
}


def model_names():
    """Returns the names `get_model` accepts.

    Returns:
        A sorted list of model names.
    """
    return sorted(_MODELS)


def get_model(name, input_shape, num_classes, **kwargs):
    """Builds a fresh, untrained model of the zoo.

    Every model outputs logits (no softmax), is named `name`, and names all its layers,
    so layer names can serve as pipeline cut points. Initial weights follow the global
    Keras seed (`keras.utils.set_random_seed`).

    Args:
        name: one of `model_names()`, e.g. `"vgg16"`.
        input_shape: shape of one example without the batch axis. For the convolutional
            models a tuple/list of 3 positive ints `(height, width, channels)` with height
            and width >= 32; for `"mlp"` any tuple/list of positive ints.
        num_classes: number of classes, an int >= 2.
        **kwargs: options of the chosen builder: `hidden` for `"mlp"`, `width` for
            `"small_cnn"`; the other models take none.

    Returns:
        A functional `keras.Model`.

    Raises:
        ValueError: if `name` is unknown, `input_shape` or `num_classes` is invalid, or a
            builder option has an invalid value.
        TypeError: if a keyword argument is not an option of the chosen builder.
    """
    entry = _lookup(name)
    input_shape = _check_input_shape(input_shape, name, entry.min_side)
    _check_num_classes(num_classes)
    _check_options(kwargs, name, entry.builder)
    return entry.builder(input_shape, int(num_classes), **kwargs)


def _lookup(name):
    if isinstance(name, str) and name in _MODELS:
        return _MODELS[name]
    raise ValueError(
        f"`name` must be one of {model_names()}. Received: name={name!r}"
        + did_you_mean(name, model_names(), ignore_case=True)
    )


def _is_positive_int(value):
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value > 0


def _check_input_shape(input_shape, name, min_side):
    """Returns `input_shape` as a tuple of ints, or raises a ValueError that explains it."""
    if min_side is None:
        expected = "a non-empty tuple/list of positive ints"
    else:
        expected = (
            "a tuple/list of 3 positive ints (height, width, channels) with height and "
            f"width >= {min_side}"
        )
    valid = (
        isinstance(input_shape, (tuple, list))
        and len(input_shape) > 0
        and all(_is_positive_int(d) for d in input_shape)
    )
    if valid and min_side is not None:
        valid = len(input_shape) == 3 and min(input_shape[:2]) >= min_side
    if not valid:
        raise ValueError(
            f"`input_shape` for model '{name}' must be {expected}. "
            f"Received: input_shape={input_shape!r}"
        )
    return tuple(int(d) for d in input_shape)


def _check_num_classes(num_classes):
    if not _is_positive_int(num_classes) or num_classes < 2:
        raise ValueError(
            f"`num_classes` must be an int >= 2. Received: num_classes={num_classes!r}"
        )


def _options(builder):
    parameters = inspect.signature(builder).parameters.values()
    return sorted(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _check_options(kwargs, name, builder):
    valid = _options(builder)
    unknown = sorted(set(kwargs) - set(valid))
    if not unknown:
        return
    hint = did_you_mean(unknown[0], valid, ignore_case=True) if valid else ""
    raise TypeError(
        f"Unknown keyword argument(s) for model '{name}': {unknown}. "
        f"Valid keyword arguments: {valid if valid else 'none'}{hint}"
    )
