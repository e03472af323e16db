"""Tests of `tf_spectrain.workflow.compile_utils`: `compile`'s loss, metrics and optimizer
resolved as plain `keras.Model.compile` resolves them (checked against Keras itself on a tiny
model), bad arguments named, and one fresh optimizer per stage."""

import keras
import numpy as np
import pytest

from tf_spectrain import SpecTrainSGD
from tf_spectrain.prediction import clone_optimizer
from tf_spectrain.workflow.compile_utils import (
    resolve_loss,
    resolve_metrics,
    resolve_optimizer,
)

RNG = np.random.default_rng(0)


def _model(units, activation):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(units, activation)])


def _keras_logs(model, loss, y, metrics=()):
    """What plain Keras reports for `model` compiled with `loss` and `metrics` on X, y."""
    model.compile(optimizer="sgd", loss=loss, metrics=list(metrics))
    return model.evaluate(X, y, batch_size=len(X), verbose=0, return_dict=True)


X = RNG.normal(size=(16, 4)).astype("float32")
SPARSE = RNG.integers(0, 3, 16).astype("int32")
ONE_HOT = np.eye(3, dtype="float32")[SPARSE]
BINARY = RNG.integers(0, 2, (16, 1)).astype("float32")
REGRESSION = RNG.normal(size=(16,)).astype("float32")  # rank 1 against predictions (16, 1)


# --- resolve_loss -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loss, units, activation, y",
    [
        ("mse", 1, None, REGRESSION),
        ("mean_absolute_error", 1, None, REGRESSION),
        ("sparse_categorical_crossentropy", 3, "softmax", SPARSE),
        ("categorical_crossentropy", 3, "softmax", ONE_HOT),
        ("binary_crossentropy", 1, "sigmoid", BINARY),
        (keras.losses.mean_squared_error, 1, None, REGRESSION),
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), 3, None, SPARSE),
    ],
)
def test_resolved_loss_equals_what_keras_compile_computes(loss, units, activation, y):
    model = _model(units, activation)
    resolved = resolve_loss(loss)
    assert isinstance(resolved, keras.losses.Loss)
    got = float(resolved(y, model(X)))
    assert got == pytest.approx(_keras_logs(model, loss, y)["loss"], rel=1e-5)


def test_a_loss_object_is_used_as_given_and_a_name_keeps_its_name():
    loss = keras.losses.Huber()
    assert resolve_loss(loss) is loss
    assert resolve_loss("mse").name == "mean_squared_error"  # the function's name
    assert resolve_loss(keras.losses.mean_squared_error).name == "mean_squared_error"


def test_a_per_example_function_is_averaged_over_the_batch():
    def per_example(y_true, y_pred):
        return keras.ops.abs(y_true - y_pred)

    y_true, y_pred = np.array([1.0, 2.0, 4.0]), np.array([1.0, 0.0, 0.0])
    loss = resolve_loss(per_example)
    assert loss.name == "per_example"
    assert float(loss(y_true, y_pred)) == pytest.approx(2.0)  # mean of 0, 2, 4


@pytest.mark.parametrize(
    "loss, message",
    [
        (None, r"^`loss` is required: pass a Keras loss or its name, e\.g\. loss=keras\.losses"
               r"\.SparseCategoricalCrossentropy\(from_logits=True\)\. Received: loss=None$"),
        ("msee", r"^`loss` is not a Keras loss\. Received: loss='msee' \("),
        (3, r"^`loss` is not a Keras loss\. Received: loss=3 \("),
    ],
)
def test_bad_losses_are_named(loss, message):
    with pytest.raises(ValueError, match=message):
        resolve_loss(loss)


# --- resolve_metrics ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "loss, units, activation, y, expected",
    [
        ("sparse_categorical_crossentropy", 3, "softmax", SPARSE,
         keras.metrics.SparseCategoricalAccuracy),
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), 3, None, SPARSE,
         keras.metrics.SparseCategoricalAccuracy),
        ("categorical_crossentropy", 3, "softmax", ONE_HOT, keras.metrics.CategoricalAccuracy),
        (keras.losses.CategoricalCrossentropy(), 3, "softmax", ONE_HOT,
         keras.metrics.CategoricalAccuracy),
        ("binary_crossentropy", 1, "sigmoid", BINARY, keras.metrics.BinaryAccuracy),
    ],
)
@pytest.mark.parametrize("name", ["accuracy", "acc"])
def test_accuracy_fits_the_loss_as_in_keras_compile(loss, units, activation, y, expected, name):
    model = _model(units, activation)
    (metric,) = resolve_metrics([name], resolve_loss(loss))
    assert type(metric) is expected and metric.name == "accuracy"
    metric.update_state(y, model(X))
    keras_logs = _keras_logs(model, loss, y, metrics=[name])
    keras_name = "accuracy" if "accuracy" in keras_logs else "acc"
    assert float(metric.result()) == pytest.approx(keras_logs[keras_name], abs=1e-6)


def test_accuracy_defaults_to_sparse_for_other_losses():
    (metric,) = resolve_metrics(["accuracy"], resolve_loss("mse"))
    assert type(metric) is keras.metrics.SparseCategoricalAccuracy


def test_named_and_function_metrics_compute_as_in_keras():
    model = _model(1, None)
    metrics = resolve_metrics(["mae", keras.metrics.mean_squared_error], resolve_loss("mse"))
    assert [m.name for m in metrics] == ["mean_absolute_error", "mean_squared_error"]
    for metric in metrics:
        assert isinstance(metric, keras.metrics.Metric)
        metric.update_state(REGRESSION[:, None], model(X))
    logs = _keras_logs(model, "mse", REGRESSION[:, None], metrics=["mae", "mse"])
    assert float(metrics[0].result()) == pytest.approx(logs["mae"], rel=1e-5)
    assert float(metrics[1].result()) == pytest.approx(logs["mse"], rel=1e-5)


def test_metric_objects_are_kept_and_names_give_new_objects_each_time():
    auc = keras.metrics.AUC()
    loss = resolve_loss("binary_crossentropy")
    first = resolve_metrics([auc, "accuracy"], loss)
    second = resolve_metrics([auc, "accuracy"], loss)
    assert first[0] is auc and second[0] is auc
    assert first[1] is not second[1]
    assert resolve_metrics(None, loss) == [] and resolve_metrics((), loss) == []


@pytest.mark.parametrize(
    "metrics, error, message",
    [
        ("accuracy", TypeError, r"^`metrics` must be a list of Keras metrics or their names\. "
                                r"Received: metrics='accuracy'$"),
        (["accurracy"], ValueError, r"^`metrics` must hold Keras metrics or their names, such "
                                    r"as 'accuracy' or keras\.metrics\.AUC\(\)\. Received: "
                                    r"metric 'accurracy' in metrics=\['accurracy'\]$"),
        ([None], ValueError, r"Received: metric None in metrics=\[None\]$"),
        (["accuracy", 3], ValueError, r"Received: metric 3 in metrics=\['accuracy', 3\]$"),
    ],
)
def test_bad_metrics_are_named(metrics, error, message):
    with pytest.raises(error, match=message):
        resolve_metrics(metrics, resolve_loss("mse"))


# --- resolve_optimizer and clone_optimizer ------------------------------------------------


@pytest.mark.parametrize(
    "name, cls", [("sgd", keras.optimizers.SGD), ("adam", keras.optimizers.Adam),
                  ("rmsprop", keras.optimizers.RMSprop)]
)
def test_optimizer_names_resolve_as_in_keras(name, cls):
    optimizer = resolve_optimizer(name)
    assert type(optimizer) is cls
    config, expected = optimizer.get_config(), keras.optimizers.get(name).get_config()
    config.pop("name"), expected.pop("name")  # numbered per instance: rm_sprop, rm_sprop_1
    assert config == expected


def test_an_optimizer_object_is_used_as_given():
    optimizer = SpecTrainSGD(0.01, momentum=0.9)
    assert resolve_optimizer(optimizer) is optimizer


@pytest.mark.parametrize(
    "optimizer, message",
    [
        (None, r"^`optimizer` is required, e\.g\. optimizer=tf_spectrain\.SpecTrainSGD\("
               r"learning_rate=0\.01, momentum=0\.9\)\. Received: optimizer=None$"),
        ("sgdd", r"^`optimizer` must be a Keras optimizer instance or name, such as "
                 r"keras\.optimizers\.AdamW\(1e-3\), 'adamw', 'sgd' or "
                 r"tf_spectrain\.SpecTrainSGD\(0\.01, momentum=0\.9\)\. "
                 r"Received: optimizer='sgdd'$"),
        (0.01, r"Received: optimizer=0\.01$"),
    ],
)
def test_bad_optimizers_are_named(optimizer, message):
    with pytest.raises(ValueError, match=message):
        resolve_optimizer(optimizer)


@pytest.mark.parametrize(
    "optimizer",
    [
        keras.optimizers.SGD(0.1, momentum=0.5, nesterov=True),
        keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)),
        SpecTrainSGD(0.05, momentum=0.8, weight_decay=1e-4),
    ],
)
def test_clone_is_a_fresh_optimizer_with_the_same_config(optimizer):
    variable = keras.Variable(np.ones(3, "float32"))
    optimizer.apply([np.ones(3, "float32")], [variable])  # built, one step taken
    clone = clone_optimizer(optimizer)
    assert type(clone) is type(optimizer) and clone is not optimizer
    assert clone.get_config() == optimizer.get_config()
    assert not clone.built and int(clone.iterations) == 0
    assert int(optimizer.iterations) == 1  # the original is untouched


def test_spectrain_clone_keeps_a_callable_learning_rate_and_decay_exclusions():
    def rate():
        return 0.02

    optimizer = SpecTrainSGD(rate, momentum=0.9, weight_decay=1e-3)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    clone = clone_optimizer(optimizer)
    inner, original = clone.inner_optimizer, optimizer.inner_optimizer
    assert inner is not original
    assert inner._learning_rate is rate
    assert inner._exclude_from_weight_decay == original._exclude_from_weight_decay
    pattern = original._exclude_from_weight_decay_pattern  # the wrapper passed it on
    assert pattern and inner._exclude_from_weight_decay_pattern == pattern
