"""`runtime.inference`: the stages chained in inference mode equal the unsplit model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime import inference


def _pipe():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(6, activation="relu", name="d0",
                           kernel_regularizer=keras.regularizers.L2(0.01))(inputs)
    h = keras.layers.Dropout(0.5, name="drop")(h)  # inactive in inference
    outputs = keras.layers.Dense(3, name="d1")(h)
    model = keras.Model(inputs, outputs)
    pipe = PipelineModel(model, cuts=["d0"], devices=["/CPU:0", "/CPU:1"], mode="stash")
    pipe.compile(optimizer=keras.optimizers.SGD(0.1),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 metrics=["accuracy"])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return pipe, model


X = np.random.default_rng(0).normal(size=(11, 5)).astype("float32")
Y = np.arange(11) % 3


def test_infer_equals_the_model_and_sums_the_layer_losses():
    pipe, model = _pipe()
    outputs, penalty = inference.infer(pipe.runners, tf.constant(X))
    np.testing.assert_allclose(outputs.numpy(), model(X, training=False).numpy(), atol=1e-6)
    kernel = model.get_layer("d0").kernel.numpy()
    assert penalty == pytest.approx(0.01 * float(np.sum(kernel**2)), rel=1e-5)


def test_evaluate_logs_equal_keras_evaluate_and_leave_training_metrics_alone():
    pipe, model = _pipe()
    pipe.metrics[0].update_state([0], [[1.0, 0.0, 0.0]])
    logs = inference.evaluate_logs(
        pipe.runners, pipe.model, pipe.loss, pipe.metrics, (X, Y), batch_size=4
    )
    expected = model.evaluate(X, Y, batch_size=4, verbose=0, return_dict=True)
    assert logs == {k: pytest.approx(v, rel=1e-5) for k, v in expected.items()}
    assert float(pipe.metrics[0].result()) == pytest.approx(1.0)  # untouched


@pytest.mark.parametrize("as_dataset", [False, True])
def test_predict_dataset_and_collect_outputs_equal_keras_predict(as_dataset):
    pipe, model = _pipe()
    x = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4) if as_dataset else X
    ds, is_dataset = inference.predict_dataset(pipe.model, x, batch_size=4)
    assert is_dataset == as_dataset
    got = inference.collect_outputs(pipe.runners, ds, is_dataset)
    np.testing.assert_allclose(got, model.predict(X, verbose=0), atol=1e-6)


def test_collect_outputs_of_an_empty_dataset_is_an_error():
    pipe, _ = _pipe()
    empty = tf.data.Dataset.from_tensor_slices(X[:0]).batch(4)
    with pytest.raises(ValueError, match="yielded no batch"):
        inference.collect_outputs(pipe.runners, empty, True)


def test_evaluate_and_predict_take_verbose_as_a_bool_as_keras_does():
    pipe, model = _pipe()
    got = pipe.evaluate(X, Y, batch_size=4, verbose=False, return_dict=True)
    expected = model.evaluate(X, Y, batch_size=4, verbose=False, return_dict=True)
    assert got == {k: pytest.approx(v, rel=1e-5) for k, v in expected.items()}
    np.testing.assert_allclose(pipe.predict(X, verbose=True), model.predict(X, verbose=0),
                               atol=1e-6)
