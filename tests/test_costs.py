"""Tests of `tf_spectrain.partition.costs`: per-layer parameter counts and multiply-accumulate
estimates, counted here by hand. `default_cuts(..., cost=...)` is tested in test_cuts."""

import keras
import pytest
from keras import layers
from partition_helpers import _cnn_functional as _cnn

from tf_spectrain.partition import COSTS, layer_costs


def _two_branches():
    inputs = keras.Input((5,), name="features")
    a = layers.Dense(4, name="a")(inputs)
    b = layers.Dense(4, name="b")(inputs)
    x = layers.Add(name="add")([a, b])
    outputs = layers.Dense(2, name="out")(x)
    return keras.Model(inputs, outputs, name="branches")


def test_costs_are_the_two_known_kinds():
    assert COSTS == ("params", "macs")


def test_parameter_counts_by_hand():
    assert layer_costs(_cnn()) == {
        "conv1": 3 * 3 * 3 * 4 + 4,
        "bn1": 4 * 4,  # gamma, beta, moving mean and variance
        "relu1": 0,
        "pool1": 0,
        "conv2": 3 * 3 * 4 * 6 + 6,
        "gap": 0,
        "predictions": 6 * 3 + 3,
    }
    assert layer_costs(_cnn(), "params") == layer_costs(_cnn())


def test_macs_by_hand():
    # Per example: outputs * fan_in for conv and dense, 4 per output for BatchNorm, else 1.
    assert layer_costs(_cnn(), "macs") == {
        "conv1": 8 * 8 * 4 * (3 * 3 * 3),
        "bn1": 4 * 8 * 8 * 4,
        "relu1": 8 * 8 * 4,
        "pool1": 4 * 4 * 4,
        "conv2": 4 * 4 * 6 * (3 * 3 * 4),
        "gap": 6,
        "predictions": 3 * 6,
    }


def test_costs_follow_the_graph_order_without_input_layers():
    costs = layer_costs(_two_branches(), "macs")
    assert list(costs) == ["a", "b", "add", "out"]
    assert costs == {"a": 4 * 5, "b": 4 * 5, "add": 4, "out": 2 * 4}


@pytest.mark.parametrize("cost", ["flops", None, "MACS"])
def test_unknown_cost_is_named(cost):
    with pytest.raises(ValueError, match=r"^`cost` must be one of \['params', 'macs'\]\. "
                                         rf"Received: cost={cost!r}"):
        layer_costs(_cnn(), cost)


def test_not_a_model_is_a_type_error():
    with pytest.raises(TypeError, match="`model` must be a keras.Model"):
        layer_costs("vgg16")
