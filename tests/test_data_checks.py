"""tf_spectrain.workflow.data_checks and data_structure: data against a model's inputs,
output and loss.

Through `fit`, `evaluate` and `predict` every rule is exercised in tests/test_bad_input.py;
here the functions themselves, on a two-input model.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain.workflow import data_checks, data_structure


@pytest.fixture(scope="module")
def two_inputs():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    out = keras.layers.Dense(4, name="out")(keras.layers.Concatenate()([a, b]))
    return keras.Model([a, b], out, name="two")


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_model_inputs_orders_a_dict_by_the_model_inputs(two_inputs):
    a, b = np.zeros((5, 3), "float32"), np.ones((5, 2), "float32")
    parts = data_structure.model_inputs(two_inputs, {"b": b, "a": a})
    assert isinstance(parts, tuple) and parts[0] is a and parts[1] is b
    assert data_checks.check_inputs(two_inputs, [a, b]) == 5


@pytest.mark.parametrize(
    "x, error, pattern",
    [
        (np.zeros((5, 3)), ValueError, r"2 inputs \['a', 'b'\].*single ndarray"),
        ({"a": np.zeros((5, 3))}, ValueError, r"keys must be the names.*\['a', 'b'\]"),
        ([np.zeros((5, 3)), np.zeros((4, 2))], ValueError, r"same number of examples.*\[5, 4\]"),
        ([np.zeros((5, 3)), np.zeros((5, 3))], ValueError,
         r"expects inputs of shape \(None, 2\) but x\[1\] has shape \(5, 3\)"),
        ([np.zeros((5, 3)), "b"], TypeError, r"x\[1\] of type str"),
    ],
)
def test_check_inputs_rejects(two_inputs, x, error, pattern):
    with pytest.raises(error, match=pattern):
        data_checks.check_inputs(two_inputs, x)


def test_check_data_probes_labels_and_datasets(two_inputs):
    x = [np.zeros((6, 3), "float32"), np.zeros((6, 2), "float32")]
    assert data_checks.check_data(two_inputs, loss(), x, np.arange(6) % 4) == 6
    with pytest.raises(ValueError, match=r"in \[0, 4\).*from 0 to 5"):
        data_checks.check_data(two_inputs, loss(), x, np.arange(6))
    ds = tf.data.Dataset.from_tensor_slices((tuple(x), np.zeros(6, "int32"))).batch(2)
    assert data_checks.check_data(two_inputs, loss(), ds, None) is None
    with pytest.raises(ValueError, match="empty dataset"):
        data_checks.check_predict_dataset(two_inputs, ds.take(0))
