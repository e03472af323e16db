"""Tests for `tf_spectrain.prediction.formula`: the one home of `W + s * d`.

The expectations come from NumPy (float32 `W + s * d`), and from the two callers the
formula serves: `SpecTrain.predicted_weights` and the runtime's `StagePasses.weights`
must give the same bits.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain import SpecTrain, SpecTrainSGD
from tf_spectrain.prediction import formula
from tf_spectrain.runtime.passes import StagePasses


def _trained(optimizer):
    """A small model whose optimizer took two updates (so that `d` is not 0)."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(7)
    for _ in range(2):
        grads = [rng.normal(size=v.shape).astype("float32") for v in model.trainable_variables]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return model


@pytest.mark.parametrize("steps", [1, 2.5, np.float32(3), tf.constant(2.0)])
def test_predicted_weights_is_w_plus_s_times_d_in_the_weights_dtype(steps):
    w = [np.array([[1.0, -2.0], [0.5, 3.0]], "float32"), np.array([0.25], "float32")]
    d = [np.array([[0.1, 0.2], [-0.3, 0.4]], "float32"), np.array([-1.5], "float32")]
    got = formula.predicted_weights([tf.constant(x) for x in w], [tf.constant(x) for x in d],
                                    steps)
    s = np.float32(np.array(steps))
    for g, a, b in zip(got, w, d):
        assert g.dtype == tf.float32
        np.testing.assert_array_equal(np.array(g), a + s * b)


@pytest.mark.parametrize("steps", [-1, -0.5])
def test_check_steps_refuses_a_negative_gap(steps):
    with pytest.raises(ValueError, match=rf"steps={steps}"):
        formula.check_steps(steps)


def test_check_steps_refuses_a_non_scalar_and_a_non_number():
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        formula.check_steps(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"steps='2'"):
        formula.check_steps("2")
    with pytest.raises(TypeError):
        formula.check_steps(True)


@pytest.mark.parametrize("make_optimizer", [
    lambda: SpecTrainSGD(0.1, momentum=0.9),
    lambda: SpecTrain(keras.optimizers.AdamW(0.01, weight_decay=0.1)),
    lambda: SpecTrain(keras.optimizers.RMSprop(0.01)),
])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_the_stage_passes_and_the_wrapper_predict_the_same_bits(make_optimizer, steps):
    optimizer = make_optimizer()
    model = _trained(optimizer)
    passes = StagePasses(0, model, "/CPU:0", optimizer)
    runtime = passes.weights(steps)
    wrapper = optimizer.predicted_weights(model.trainable_variables, steps)
    for a, b in zip(runtime, wrapper):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    if steps:  # and the prediction moved the weights
        assert any(not np.array_equal(np.array(a), np.array(v))
                   for a, v in zip(runtime, model.trainable_variables))
