"""Shared by the tests that compare a pipeline's step with Keras' and train the async modes."""

import keras
import numpy as np

import tf_spectrain


def rel_error(got, ref, w0):
    """|W_got - W_ref| / |W_ref - W_0| over all weights (BatchNorm statistics included)."""
    num = sum(float(np.sum((a - b) ** 2)) for a, b in zip(got, ref))
    den = sum(float(np.sum((a - b) ** 2)) for a, b in zip(ref, w0))
    assert den > 0  # the reference moved
    return np.sqrt(num / den)


def momentum_sgd(mode, learning_rate, momentum):
    """The optimizer of `mode`: `SpecTrainSGD` for spectrain (it predicts), else Keras' SGD."""
    cls = tf_spectrain.SpecTrainSGD if mode == "spectrain" else keras.optimizers.SGD
    return cls(learning_rate, momentum=momentum)
