"""VGG16 for small images, as used in the SpecTrain paper (CIFAR-style, with BatchNorm).

Layer names follow `keras.applications.VGG16` (`block3_conv2`, `block3_pool`), with a
BatchNorm and a ReLU layer after every convolution (`block3_bn2`, `block3_relu2`), so that
every boundary in the network is a possible pipeline cut. `vgg16_narrow` (not in the
registry) is the same network with every width divided, for small machines.
"""

import keras
from keras import layers

from tf_spectrain import checks

from .common import batch_norm

# Filters of the convolutions in each of the five blocks.
VGG16_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))

FC_UNITS = 512


def _conv_bn_relu(x, filters, block, conv):
    prefix = f"block{block}"
    x = layers.Conv2D(
        filters, 3, padding="same", use_bias=False, name=f"{prefix}_conv{conv}"
    )(x)
    x = batch_norm(f"{prefix}_bn{conv}")(x)
    return layers.Activation("relu", name=f"{prefix}_relu{conv}")(x)


def vgg16(input_shape, num_classes):
    """Builds VGG16 with BatchNorm for images of at least 32x32 pixels.

    Thirteen 3x3 convolutions (no bias, each followed by BatchNorm and ReLU) in five blocks
    of 64, 128, 256, 512 and 512 filters, a 2x2 max-pool after each block, then `flatten`,
    `fc1` and `fc2` (512 units, ReLU) and `predictions`. About 15.26M parameters for
    32x32x3 inputs and 10 classes.

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: number of classes (units of the `predictions` layer).

    Returns:
        A functional `keras.Model` named `"vgg16"` that outputs logits.
    """
    return _vgg16(input_shape, num_classes, 1, "vgg16")


def vgg16_narrow(input_shape, num_classes, divisor=8):
    """Builds `vgg16` with every filter count and the dense width divided by `divisor`.

    The same layers and layer names as `vgg16`, each width `max(1, width // divisor)`.
    With `divisor=8`: 8 to 64 filters, 64 dense units, 0.24M weights for 32x32x3 inputs
    and 10 classes: a VGG16-shaped pipeline that trains in minutes on a CPU (the
    accuracy benchmark's `vgg`). Not in the registry (nor in the command line's
    `--model` list): `models.vgg16_narrow(...)` after `from tf_spectrain import models`.

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: number of classes (units of the `predictions` layer).
        divisor: an int >= 1 dividing every width.

    Returns:
        A functional `keras.Model` named `vgg16_div<divisor>` that outputs logits.

    Raises:
        TypeError: if `divisor` is not an int.
        ValueError: if `divisor` is < 1.
    """
    divisor = checks.check_int("divisor", divisor, 1)
    return _vgg16(input_shape, num_classes, divisor, f"vgg16_div{divisor}")


def _vgg16(input_shape, num_classes, divisor, name):
    """The VGG16 layers with widths divided by `divisor`, as a model named `name`."""
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = inputs
    for block, filters_per_conv in enumerate(VGG16_BLOCKS, start=1):
        for conv, filters in enumerate(filters_per_conv, start=1):
            x = _conv_bn_relu(x, max(1, filters // divisor), block, conv)
        x = layers.MaxPooling2D(2, name=f"block{block}_pool")(x)
    x = layers.Flatten(name="flatten")(x)
    units = max(1, FC_UNITS // divisor)
    x = layers.Dense(units, activation="relu", name="fc1")(x)
    x = layers.Dense(units, activation="relu", name="fc2")(x)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(inputs, outputs, name=name)
