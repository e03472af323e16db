"""Small, fast models for tests, examples and CPU experiments: `mlp` and `small_cnn`.

Both output logits (no softmax) and name every layer, so that pipeline cuts can name them.
"""

import numbers

import keras
from keras import layers

from .common import batch_norm


def _check_positive_int(value, arg, model):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"`{arg}` of model '{model}' must be an int >= 1. Received: {arg}={value!r}"
        )


def _check_positive_number(value, arg, model):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(
            f"`{arg}` of model '{model}' must be a number > 0. Received: {arg}={value!r}"
        )


def mlp(input_shape, num_classes, *, hidden=128):
    """Builds a two-hidden-layer perceptron: `flatten`, `dense1`, `dense2`, `predictions`.

    Works for inputs of any shape, e.g. `(8, 8, 1)` digit images or `(20,)` feature rows.

    Args:
        input_shape: shape of one example, a tuple of positive ints.
        num_classes: number of classes (units of the `predictions` layer).
        hidden: units of each of the two hidden ReLU layers, an int >= 1.

    Returns:
        A functional `keras.Model` named `"mlp"` that outputs logits.

    Raises:
        ValueError: if `hidden` is not an int >= 1.
    """
    _check_positive_int(hidden, "hidden", "mlp")
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = layers.Flatten(name="flatten")(inputs)
    x = layers.Dense(hidden, activation="relu", name="dense1")(x)
    x = layers.Dense(hidden, activation="relu", name="dense2")(x)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(inputs, outputs, name="mlp")


def _conv_block(x, filters, index):
    x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{index}")(x)
    x = batch_norm(f"bn{index}")(x)
    x = layers.Activation("relu", name=f"relu{index}")(x)
    return layers.MaxPooling2D(2, name=f"pool{index}")(x)


def small_cnn(input_shape, num_classes, *, width=1.0):
    """Builds a two-block CNN that trains quickly on a CPU.

    Layers: `conv1`/`bn1`/`relu1`/`pool1`, `conv2`/`bn2`/`relu2`/`pool2`, `flatten`,
    `fc1` (ReLU), `predictions`. At `width=1` the convolutions have 16 and 32 filters and
    `fc1` has 64 units; `width` scales all three (each at least 1).

    Args:
        input_shape: `(height, width, channels)` of one image.
        num_classes: number of classes (units of the `predictions` layer).
        width: a number > 0 that multiplies the filter and unit counts.

    Returns:
        A functional `keras.Model` named `"small_cnn"` that outputs logits.

    Raises:
        ValueError: if `width` is not a number > 0.
    """
    _check_positive_number(width, "width", "small_cnn")

    def scaled(n):
        return max(1, round(n * width))

    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = _conv_block(inputs, scaled(16), 1)
    x = _conv_block(x, scaled(32), 2)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(scaled(64), activation="relu", name="fc1")(x)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(inputs, outputs, name="small_cnn")
