"""Shared by the partition tests: small models to cut (a VGG-like chain, a CNN with
BatchNorm, residual blocks with and without a long skip, two inputs, two outputs), and
helpers to run a chain of stages and compare its outputs with the model's."""

import keras
import numpy as np
from keras import layers

RNG = np.random.default_rng(0)


def _images(shape, batch=2):
    return RNG.random((batch, *shape), dtype=np.float32)


def _run_chain(stages, x, **kwargs):
    for stage in stages:
        x = stage(x, **kwargs)
    return x


def _assert_same(a, b):
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def _op_names(model):
    """Operation names in Keras' topological order, without input layers."""
    ops = model.layers if isinstance(model, keras.Sequential) else model.operations
    return [op.name for op in ops if not isinstance(op, layers.InputLayer)]


# ----------------------------------------------------------------------------- models


def _vgg_sequential():
    return keras.Sequential(
        [
            keras.Input((8, 8, 3), name="image"),
            layers.Conv2D(4, 3, padding="same", activation="relu", name="block1_conv"),
            layers.MaxPooling2D(name="block1_pool"),
            layers.Conv2D(8, 3, padding="same", activation="relu", name="block2_conv"),
            layers.MaxPooling2D(name="block2_pool"),
            layers.Flatten(name="flatten"),
            layers.Dense(16, activation="relu", name="fc"),
            layers.Dense(3, name="predictions"),
        ],
        name="tiny_vgg",
    )


def _cnn_functional():
    inputs = keras.Input((8, 8, 3), name="image")
    x = layers.Conv2D(4, 3, padding="same", name="conv1")(inputs)
    x = layers.BatchNormalization(name="bn1")(x)
    x = layers.ReLU(name="relu1")(x)
    x = layers.MaxPooling2D(name="pool1")(x)
    x = layers.Conv2D(6, 3, padding="same", activation="relu", name="conv2")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(3, name="predictions")(x)
    return keras.Model(inputs, outputs, name="tiny_cnn")


def _residual_block(x, prefix):
    r = layers.Conv2D(8, 3, padding="same", name=f"{prefix}_conv1")(x)
    r = layers.BatchNormalization(name=f"{prefix}_bn1")(r)
    r = layers.ReLU(name=f"{prefix}_relu1")(r)
    r = layers.Conv2D(8, 3, padding="same", name=f"{prefix}_conv2")(r)
    x = layers.Add(name=f"{prefix}_add")([x, r])
    return layers.ReLU(name=f"{prefix}_out")(x)


def _tiny_resnet(long_skip):
    """stem -> two residual blocks -> (optional add of the stem output) -> head."""
    inputs = keras.Input((8, 8, 3), name="image")
    stem = layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    x = _residual_block(stem, "b1")
    x = _residual_block(x, "b2")
    if long_skip:
        # The stem output skips both blocks: cutting after b1_out and b2_out, it passes
        # through the whole middle stage.
        x = layers.Add(name="long_add")([x, stem])
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(3, name="head")(x)
    return keras.Model(inputs, outputs, name="tiny_resnet")


def _two_outputs():
    """h1 is a model output and also feeds h2: it passes through every later stage."""
    inputs = keras.Input((5,), name="features")
    h1 = layers.Dense(4, name="h1")(inputs)
    h2 = layers.Dense(4, name="h2")(h1)
    h3 = layers.Dense(2, name="h3")(h2)
    return keras.Model(inputs, [h1, h3], name="two_outputs")


def _two_inputs():
    a = keras.Input((4,), name="a")
    b = keras.Input((3,), name="b")
    da = layers.Dense(5, name="da")(a)
    db = layers.Dense(5, name="db")(b)
    x = layers.Concatenate(name="cat")([da, db])
    outputs = layers.Dense(2, name="out")(x)
    return keras.Model([a, b], outputs, name="two_inputs")
