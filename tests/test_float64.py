"""A float64 model trains in a pipeline, and `sync` equals Keras' `model.fit` to float64
precision at every cut of a many-branch model, several tensors crossing.

In float32 a cut can differ from Keras by far more than rounding when an activation sits
within rounding of a ReLU's kink or a max-pool tie (the stages run as separate graphs, 1e-7
from Keras' one graph). In float64 that rounding is 1e-16, so any real mix-up of tensors or
gradients across a cut shows as a large error.
"""

import keras
import numpy as np
import pytest

from tf_spectrain.pipeline_model import PipelineModel


@pytest.fixture
def float64():
    # Both: a global dtype policy (another test may have set one) wins over floatx.
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def branchy_model():
    """Two cells of three branches (conv, pooled, identity) joined by add and concat."""
    x = inp = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(6, 3, padding="same", name="stem")(x)
    prev = x
    for c in range(2):
        a = keras.layers.ReLU(name=f"c{c}_relu")(x)
        a = keras.layers.SeparableConv2D(6, 3, padding="same", name=f"c{c}_sep")(a)
        a = keras.layers.BatchNormalization(name=f"c{c}_bn")(a)
        b = keras.layers.MaxPooling2D(3, strides=1, padding="same", name=f"c{c}_pool")(x)
        s = keras.layers.Add(name=f"c{c}_add")([a, b])
        t = keras.layers.Add(name=f"c{c}_add_prev")([b, prev])
        prev, x = x, keras.layers.Conv2D(6, 1, name=f"c{c}_mix")(
            keras.layers.Concatenate(name=f"c{c}_cat")([s, t, x]))
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inp, keras.layers.Dense(4, name="logits")(x))


def one_step(model, x, y, fit):
    w0 = model.get_weights()
    fit(model, x, y)
    return w0, model.get_weights()


def sgd():
    return keras.optimizers.SGD(0.05, momentum=0.9)


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def keras_step(model, x, y):
    model.compile(sgd(), LOSS)
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)


def rel_error(w, ref, w0):
    num = sum(float(np.sum((a - b) ** 2)) for a, b in zip(w, ref))
    den = sum(float(np.sum((a - b) ** 2)) for a, b in zip(ref, w0))
    return np.sqrt(num / den)


_KERAS = []


def keras_reference(model, x, y):
    """Keras' step from `model`'s weights: (w0, weights after). The same model (seed 4) and
    batch in every case below, so Keras steps once (the weights are checked)."""
    if not _KERAS:
        reference = keras.models.clone_model(model)
        reference.set_weights(model.get_weights())
        _KERAS.append(one_step(reference, x, y, keras_step))
    w0, ref = _KERAS[0]
    for a, b in zip(model.get_weights(), w0):
        np.testing.assert_array_equal(a, b)
    return w0, ref


# One cut of each kind of crossing (float32 covers every cut: test_sync_gradient.py).
@pytest.mark.parametrize("cut", ["stem", "c0_sep", "c0_cat", "c1_bn", "c1_add_prev"])
def test_sync_equals_keras_in_float64_at_every_cut(float64, cut):
    keras.utils.set_random_seed(4)
    model = branchy_model()
    assert model.weights[0].dtype == "float64"
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 8, 8, 3)), rng.integers(0, 4, 6)
    w0, ref = keras_reference(model, x, y)

    def pipe_step(m, xs, ys):
        pipe = PipelineModel(m, cuts=[cut], mode="sync")
        pipe.compile(sgd(), LOSS)
        pipe.fit(xs, ys, batch_size=len(xs), epochs=1, shuffle=False, verbose=0)

    _, got = one_step(model, x, y, pipe_step)
    assert sum(float(np.sum((a - b) ** 2)) for a, b in zip(ref, w0)) > 0  # weights moved
    assert rel_error(got, ref, w0) < 1e-9
