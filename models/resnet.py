"""Residual networks: the CIFAR ResNets of He et al. (2016) and a bottleneck ResNet-50.

A residual block is where a pipeline cut gets interesting: a cut inside a block (e.g. after
`stage2_block1_relu1`) is crossed by two tensors, the block input (for the shortcut) and the
main-path activation.
"""

import keras
from keras import layers

from .common import batch_norm

# Filters of the three stages of a CIFAR ResNet.
CIFAR_STAGE_FILTERS = (16, 32, 64)


def _basic_block(x, filters, stride, name):
    """Two 3x3 conv/BN layers plus a shortcut; a 1x1 conv/BN projection if shapes differ."""
    conv_args = dict(padding="same", use_bias=False, kernel_initializer="he_normal")
    y = layers.Conv2D(filters, 3, strides=stride, name=f"{name}_conv1", **conv_args)(x)
    y = batch_norm(f"{name}_bn1")(y)
    y = layers.Activation("relu", name=f"{name}_relu1")(y)
    y = layers.Conv2D(filters, 3, name=f"{name}_conv2", **conv_args)(y)
    y = batch_norm(f"{name}_bn2")(y)
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.Conv2D(
            filters, 1, strides=stride, name=f"{name}_shortcut_conv", **conv_args
        )(x)
        shortcut = batch_norm(f"{name}_shortcut_bn")(shortcut)
    y = layers.Add(name=f"{name}_add")([y, shortcut])
    return layers.Activation("relu", name=f"{name}_out")(y)


def cifar_resnet(input_shape, num_classes, blocks_per_stage, name, downsample=False):
    """Builds a CIFAR ResNet of depth `6 * blocks_per_stage + 2`.

    `conv1` (3x3, 16 filters) with `bn1` and `relu1`; three stages of `blocks_per_stage`
    basic blocks with 16, 32 and 64 filters, the first block of stages 2 and 3 with
    stride 2 and a projection shortcut; then `avg_pool` and `predictions`. Blocks are
    named `stage{s}_block{b}` (1-based) with layers `_conv1`, `_bn1`, `_relu1`, `_conv2`,
    `_bn2`, `_shortcut_conv`/`_shortcut_bn` (projection blocks only), `_add` and `_out`.

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: number of classes (units of the `predictions` layer).
        blocks_per_stage: number of basic blocks in each stage, an int >= 1.
        name: name of the returned model.
        downsample: if True, a 2x2 average pooling named `downsample` comes first and the
            network runs on inputs of half the height and width.

    Returns:
        A functional `keras.Model` that outputs logits.
    """
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = layers.AveragePooling2D(2, name="downsample")(inputs) if downsample else inputs
    x = layers.Conv2D(
        CIFAR_STAGE_FILTERS[0], 3, padding="same", use_bias=False,
        kernel_initializer="he_normal", name="conv1",
    )(x)
    x = batch_norm("bn1")(x)
    x = layers.Activation("relu", name="relu1")(x)
    for stage, filters in enumerate(CIFAR_STAGE_FILTERS, start=1):
        for block in range(1, blocks_per_stage + 1):
            stride = 2 if stage > 1 and block == 1 else 1
            x = _basic_block(x, filters, stride, name=f"stage{stage}_block{block}")
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(inputs, outputs, name=name)


def resnet20(input_shape, num_classes):
    """Builds ResNet-20 for CIFAR-sized images (3 basic blocks per stage).

    See `cifar_resnet` for the architecture and layer names.

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: number of classes (units of the `predictions` layer).

    Returns:
        A functional `keras.Model` named `"resnet20"` that outputs logits.
    """
    return cifar_resnet(input_shape, num_classes, blocks_per_stage=3, name="resnet20")


def resnet56(input_shape, num_classes):
    """Builds ResNet-56 for CIFAR-sized images (9 basic blocks per stage).

    See `cifar_resnet` for the architecture and layer names.

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: number of classes (units of the `predictions` layer).

    Returns:
        A functional `keras.Model` named `"resnet56"` that outputs logits.
    """
    return cifar_resnet(input_shape, num_classes, blocks_per_stage=9, name="resnet56")


def resnet50(input_shape, num_classes):
    """Builds the bottleneck ResNet-50 of `keras.applications`, untrained, with a new head.

    The layers are the application's own (`conv1_conv`, `conv3_block4_out`, `avg_pool`,
    ...), at the top level of the returned model (not nested), followed by `predictions`.
    No weights are downloaded.

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: number of classes (units of the `predictions` layer).

    Returns:
        A functional `keras.Model` named `"resnet50"` that outputs logits.
    """
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    backbone = keras.applications.ResNet50(
        weights=None,
        include_top=False,
        input_tensor=inputs,
        input_shape=tuple(input_shape),
        pooling="avg",
    )
    outputs = layers.Dense(num_classes, name="predictions")(backbone.output)
    return keras.Model(inputs, outputs, name="resnet50")
