"""VGG16 for small images, as used in the SpecTrain paper (CIFAR-style, with BatchNorm).

Layer names follow `keras.applications.VGG16` (`block3_conv2`, `block3_pool`), with a
BatchNorm and a ReLU layer after every convolution (`block3_bn2`, `block3_relu2`), so that
every boundary in the network is a possible pipeline cut.
"""

import keras
from keras import layers

from tf_spectrain.models.common import batch_norm

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
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = inputs
    for block, filters_per_conv in enumerate(VGG16_BLOCKS, start=1):
        for conv, filters in enumerate(filters_per_conv, start=1):
            x = _conv_bn_relu(x, filters, block, conv)
        x = layers.MaxPooling2D(2, name=f"block{block}_pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(FC_UNITS, activation="relu", name="fc1")(x)
    x = layers.Dense(FC_UNITS, activation="relu", name="fc2")(x)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(inputs, outputs, name="vgg16")
