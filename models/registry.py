"""The model registry: build any model of the zoo by name, with validated arguments.

    model = get_model("resnet20", input_shape=(32, 32, 3), num_classes=10)
    model = get_model("residual_lstm", (128,), 2, vocab_size=10000)

Each entry says which builder makes the model, what input it takes (`model_input_kind`:
images, token ids or any shape) and the smallest image side it accepts. All arguments
are checked here, once, so the builders can assume valid input.
"""

import collections
import inspect
import numbers

from tf_spectrain.messages import did_you_mean

from . import resnet, small, text, vgg

IMAGE, TOKENS, ANY = "image", "tokens", "any"
"""The kinds of input `model_input_kind` names: images `(height, width, channels)` of
floats, int token ids `(seq_len,)` (0 is padding), or any shape of floats."""

_Entry = collections.namedtuple("_Entry", ["builder", "input_kind", "min_side"])

# Five 2x2 poolings (VGG16) or the ResNet-50 stem plus its strides need at least 32 pixels.
MIN_CONV_SIDE = 32

_MODELS = {
    "mlp": _Entry(small.mlp, ANY, min_side=None),
    "small_cnn": _Entry(small.small_cnn, IMAGE, min_side=MIN_CONV_SIDE),
    "vgg16": _Entry(vgg.vgg16, IMAGE, min_side=MIN_CONV_SIDE),
    "resnet20": _Entry(resnet.resnet20, IMAGE, min_side=MIN_CONV_SIDE),
    "resnet56": _Entry(resnet.resnet56, IMAGE, min_side=MIN_CONV_SIDE),
    "resnet50": _Entry(resnet.resnet50, IMAGE, min_side=MIN_CONV_SIDE),
    "transformer_lm": _Entry(text.transformer_lm, TOKENS, min_side=None),
    "transformer_classifier": _Entry(text.transformer_classifier, TOKENS, min_side=None),
    "residual_lstm": _Entry(text.residual_lstm, TOKENS, min_side=None),
}


def model_names():
    """Returns the names `get_model` accepts.

    Returns:
        A sorted list of model names.
    """
    return sorted(_MODELS)


def model_input_kind(name):
    """Tells what input a model of the zoo takes, e.g. to refuse images for a text model.

    Args:
        name: one of `model_names()`.

    Returns:
        `"image"` (`(height, width, channels)` floats: the convolutional models),
        `"tokens"` (int token ids `(seq_len,)`, 0 is padding: the text models) or `"any"`
        (floats of any shape: `"mlp"`).

    Raises:
        ValueError: if `name` is unknown.
    """
    return _lookup(name).input_kind


def get_model(name, input_shape, num_classes, **kwargs):
    """Builds a fresh, untrained model of the zoo.

    Every model outputs logits (no softmax), is named `name`, and names all its layers,
    so layer names can serve as pipeline cut points. Initial weights follow the global
    Keras seed (`keras.utils.set_random_seed`).

    Args:
        name: one of `model_names()`, e.g. `"vgg16"`.
        input_shape: shape of one example without the batch axis. For the convolutional
            models a tuple/list of 3 positive ints `(height, width, channels)` with height
            and width >= 32; for the text models (`model_input_kind(name) == "tokens"`)
            a tuple/list of one positive int `(seq_len,)`; for `"mlp"` any tuple/list of
            positive ints.
        num_classes: number of classes, an int >= 2; for `"transformer_lm"` the
            vocabulary size (it predicts the next token at every position).
        **kwargs: options of the chosen builder: `hidden` for `"mlp"`, `width` for
            `"small_cnn"`; `blocks`, `width`, `heads` and `mlp_width` for
            `"transformer_lm"`; the same and the required `vocab_size` (an int >= 2,
            padding id 0 included) for `"transformer_classifier"`; the required
            `vocab_size`, `blocks` and `width` for `"residual_lstm"`. The image models
            take none.

    Returns:
        A functional `keras.Model`.

    Raises:
        ValueError: if `name` is unknown, `input_shape` or `num_classes` is invalid, or a
            builder option has an invalid value.
        TypeError: if a keyword argument is not an option of the chosen builder, or a
            required one (`vocab_size`) is missing.
    """
    entry = _lookup(name)
    input_shape = _check_input_shape(input_shape, name, entry)
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


def _check_input_shape(input_shape, name, entry):
    """Returns `input_shape` as a tuple of ints, or raises a ValueError that explains it."""
    min_side = entry.min_side
    if entry.input_kind == TOKENS:
        expected = "a tuple/list of one positive int (seq_len,)"
    elif min_side is None:
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
    if valid and entry.input_kind == TOKENS:
        valid = len(input_shape) == 1
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


def _options(builder, required=False):
    """The builder's keyword-only parameters (only those without a default if `required`)."""
    parameters = inspect.signature(builder).parameters.values()
    return sorted(
        p.name
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY
        and (not required or p.default is inspect.Parameter.empty)
    )


def _check_options(kwargs, name, builder):
    valid = _options(builder)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        hint = did_you_mean(unknown[0], valid, ignore_case=True) if valid else ""
        raise TypeError(
            f"Unknown keyword argument(s) for model '{name}': {unknown}. "
            f"Valid keyword arguments: {valid if valid else 'none'}{hint}"
        )
    missing = [option for option in _options(builder, required=True) if option not in kwargs]
    if missing:
        raise TypeError(
            f"Model '{name}' requires the keyword argument(s) {missing}"
            f"{_REQUIRED_HINTS.get(missing[0], '')}. Received: kwargs={kwargs!r}"
        )


_REQUIRED_HINTS = {"vocab_size": " (the number of token ids, an int >= 2, padding id 0 included)"}
