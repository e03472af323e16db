"""`benchmarks.sync_gradient`: the one-step check of sync pipelines against Keras, tiny."""

import keras
import numpy as np
import pytest

from benchmarks import sync_gradient


def _branches():
    """Two stems, a residual add and a concat: several tensors cross most cuts."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 2), name="image")
    a = keras.layers.Conv2D(3, 3, padding="same", name="a")(inputs)
    b = keras.layers.Conv2D(3, 1, name="b")(inputs)
    b = keras.layers.BatchNormalization(name="bn")(b)
    s = keras.layers.Add(name="add")([a, b])
    c = keras.layers.Conv2D(3, 3, padding="same", name="c")(s)
    h = keras.layers.Concatenate(name="cat")([s, c, a])
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    outputs = keras.layers.Dense(4, activation="softmax", name="out")(h)
    return keras.Model(inputs, outputs)


def test_every_cut_of_a_branchy_model_equals_keras_after_one_step():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6, 6, 2)).astype("float32")
    y = np.arange(4)
    positions = list(range(1, len(_branches().layers) - 1))
    rows = sync_gradient.sweep(_branches, x, y, positions, ["/CPU:0", "/CPU:1"])
    assert [r["position"] for r in rows] == positions
    assert max(r["crossing"] for r in rows) >= 3  # the cut after "c" carries s, c and a
    for row in rows:
        assert row["relative_error"] < 1e-4, row
        assert row["variables_off"] == 0, row


def test_relative_error_sees_a_wrong_gradient():
    w0 = [np.zeros(3), np.zeros(2)]
    keras_w = [np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0])]
    assert sync_gradient.relative_error(keras_w, keras_w, w0) == (0.0, 0)
    swapped = [np.array([0.0, 1.0, 0.0]), np.array([0.0, 1.0])]  # one variable wrong
    error, off = sync_gradient.relative_error(swapped, keras_w, w0)
    assert error == pytest.approx(1.0) and off == 1


@pytest.mark.parametrize(
    "items, count, expected",
    [(range(10), 4, [0, 3, 6, 9]), (range(3), 5, [0, 1, 2]), (range(5), 1, [0]),
     (range(9), 3, [0, 4, 8])],
)
def test_evenly_spaced(items, count, expected):
    assert sync_gradient.evenly_spaced(items, count) == expected


def test_keras_sensitivity_is_float_noise_for_a_smooth_model():
    def smooth():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5,))
        h = keras.layers.Dense(6, activation="tanh")(inputs)
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))

    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    sensitivity = sync_gradient.keras_sensitivity(smooth, x, np.arange(4) % 3)
    assert 0 <= sensitivity < 1e-3
    assert sync_gradient.keras_sensitivity(smooth, x, np.arange(4) % 3, noise=1e-1) > 1e-3
