"""Tests for tf_spectrain.partition.graph: the models it cannot read into a graph of layer
calls (subclassed, shared layers, unbuilt Sequential, not a model) are refused clearly.

Reading the graph of models it can cut is exercised by test_stages.py and test_cuts.py."""


import keras
import numpy as np
import pytest
from keras import layers

from tf_spectrain.partition import (
    split_model,
)


def test_subclassed_model_is_rejected():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__(name="subclassed")
            self.dense = layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="'subclassed'.*functional API.*Sequential"):
        split_model(model, [])


def test_shared_layer_is_rejected():
    inputs = keras.Input((4,))
    shared = layers.Dense(4, name="shared")
    outputs = shared(layers.ReLU(name="relu")(shared(inputs)))
    model = keras.Model(inputs, outputs)
    with pytest.raises(ValueError, match="'shared' is called 2 times"):
        split_model(model, ["relu"])


def test_unbuilt_sequential_and_non_models_are_rejected():
    with pytest.raises(ValueError, match="not built.*model.build"):
        split_model(keras.Sequential([layers.Dense(2)]), [])
    with pytest.raises(TypeError, match="must be a keras.Model"):
        split_model("model", [])
