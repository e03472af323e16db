"""Models with several outputs: compile, fit and evaluate as Keras 3.15 does them.

A three-stage pipeline (one output computed in the middle stage and handed on, a weight
regularizer on the other) is trained in sync mode beside plain Keras from the same initial
weights; weights, the History (keys, order and values, validation included) and
`evaluate` must match. Bad losses, weights, metrics and labels are refused before any
training step, with the bad value and what is valid in the message.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from step_helpers import rel_error

from tf_spectrain.pipeline_model import PipelineModel

CUTS = ["d0", "o1"]  # stage 0: d0; stage 1: d1, o1 (an output); stage 2: o2
DEVICES = ["/CPU:0", "/CPU:1", "/CPU:2"]
BATCH = 4
LR = 0.1


def _model(dict_outputs=False):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((5,), name="x")
    h = keras.layers.Dense(6, activation="relu", name="d0")(inputs)
    h2 = keras.layers.Dense(6, activation="relu", name="d1")(h)
    o1 = keras.layers.Dense(3, name="o1")(h2)
    # A layer loss on the last stage (one on an earlier stage is counted once per
    # micro-batch, a separate matter of micro_batches > 1).
    o2 = keras.layers.Dense(4, activation="softmax", name="o2",
                            kernel_regularizer=keras.regularizers.L2(0.01))(h2)
    return keras.Model(inputs, {"b": o1, "a": o2} if dict_outputs else [o1, o2], name="two")


def _data(n, seed=0, onehot=False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype("float32")
    y1 = rng.normal(size=(n, 3)).astype("float32")
    y2 = rng.integers(0, 4, size=n)
    if onehot:
        y2 = np.eye(4, dtype="float32")[y2]
    return x, y1, y2


def _scce():
    return keras.losses.SparseCategoricalCrossentropy()


CASES = {
    # (compile arguments, made fresh for each model; one-hot labels for o2)
    "list_weights": (lambda: dict(loss=["mse", _scce()], loss_weights=[0.5, 2.0],
                                  metrics=[["mae"], ["accuracy"]]), False),
    "dict": (lambda: dict(loss={"o2": _scce(), "o1": "mae"}, loss_weights={"o1": 2.0, "o2": 0.5},
                          metrics={"o2": ["accuracy", "accuracy"]}), False),
    "single_loss": (lambda: dict(loss=keras.losses.MeanSquaredError(), loss_weights=0.5,
                                 metrics=["mae", None]), True),
    "ce_by_shape": (lambda: dict(loss=["mse", "ce"], metrics=[None, "acc"]), False),
    "one_loss": (lambda: dict(loss=["mse", None], metrics=[["mse"], ["accuracy"]]), False),
}


def _labels(y1, y2, form):
    if form in ("dict", "dataset_dict"):
        return {"o2": y2, "o1": y1}  # by name, not in output order
    if form == "dataset_tuple":
        return (y1, y2)
    return [y1, y2]


def _feed(x, y, form):
    """`fit`'s (x, y) arguments: arrays, or a dataset of batches (and y None)."""
    if form.startswith("dataset"):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), None
    return x, y


def _pair(case, micro_batches=1, dict_outputs=False):
    """A sync pipeline and a plain Keras model with the same initial weights, compiled alike."""
    make, _ = CASES[case]
    model = _model(dict_outputs)
    reference = _model(dict_outputs)
    reference.set_weights(model.get_weights())
    reference.compile(optimizer=keras.optimizers.SGD(LR), **make())
    pipe = PipelineModel(model, cuts=CUTS, devices=DEVICES, mode="sync",
                         micro_batches=micro_batches)
    pipe.compile(keras.optimizers.SGD(LR), **make())
    return pipe, model, reference


def _assert_logs_equal(got, want):
    assert list(got) == list(want)  # Keras' names, in Keras' order
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize(
    "case, form, n, micro_batches",
    [
        ("list_weights", "list", 11, 2),  # micro-batches, and a short last batch
        ("dict", "dict", 12, 1),
        ("dict", "dataset_dict", 11, 1),
        ("single_loss", "list", 12, 1),
        ("ce_by_shape", "dataset_tuple", 12, 2),
        ("one_loss", "list", 12, 1),
    ],
)
@pytest.mark.filterwarnings("ignore:Gradients do not exist")  # Keras, for an output without loss
def test_fit_and_evaluate_equal_keras(case, form, n, micro_batches):
    onehot = CASES[case][1]
    x, y1, y2 = _data(n, onehot=onehot)
    xv, yv1, yv2 = _data(7, seed=1, onehot=onehot)
    pipe, model, reference = _pair(case, micro_batches)
    w0 = model.get_weights()
    fx, fy = _feed(x, _labels(y1, y2, form), form)
    vx, vy = _feed(xv, _labels(yv1, yv2, form), form)
    validation = vx if vy is None else (vx, vy)
    kwargs = dict(batch_size=None if fy is None else BATCH, epochs=2, shuffle=False, verbose=0,
                  validation_data=validation)
    want = reference.fit(fx, fy, **kwargs).history
    got = pipe.fit(fx, fy, **kwargs).history
    assert rel_error(model.get_weights(), reference.get_weights(), w0) < 1e-5
    _assert_logs_equal(got, want)
    assert any(k.startswith("val_o") for k in got) or case == "one_loss"

    evaluate = dict(batch_size=None if vy is None else BATCH, verbose=0)
    _assert_logs_equal(pipe.evaluate(vx, vy, return_dict=True, **evaluate),
                       reference.evaluate(vx, vy, return_dict=True, **evaluate))
    got_list = pipe.evaluate(vx, vy, **evaluate)
    want_list = reference.evaluate(vx, vy, **evaluate)
    np.testing.assert_allclose(got_list, want_list, rtol=2e-5, atol=1e-6)
    # the per-output logs are not a permutation of each other by accident
    assert len(set(np.round(np.atleast_1d(want_list), 6))) > 1 or case == "one_loss"
    if (case, form) == ("dict", "dict"):
        _check_keras_names(pipe, got, x, y1, y2)


def _check_keras_names(pipe, history, x, y1, y2):
    """The logs have Keras' names for each output, spelled out (not only as the reference
    Keras model names them): the "dict" case's History, then after compiling again."""
    assert [k for k in history if not k.startswith("val_")] == [
        "loss", "o1_loss", "o2_accuracy", "o2_accuracy_1", "o2_loss"
    ]
    pipe.compile("sgd", loss=["mse", _scce()], metrics=[["mae"], ["accuracy"]])
    assert pipe.evaluate(x, [y1, y2], verbose=0, return_dict=True).keys() == {
        "loss", "o1_loss", "o1_mae", "o2_accuracy", "o2_loss"
    }


def test_dict_outputs_are_named_by_their_keys():
    x, y1, y2 = _data(12)
    model = _model(dict_outputs=True)
    reference = _model(dict_outputs=True)
    reference.set_weights(model.get_weights())
    w0 = model.get_weights()

    def compiled(m):
        m.compile(keras.optimizers.SGD(LR), loss={"a": _scce(), "b": "mse"},
                  metrics={"a": "accuracy"})

    compiled(reference)
    pipe = PipelineModel(model, cuts=["d0", "d1"], devices=DEVICES, mode="sync")
    compiled(pipe)
    labels = {"a": y2, "b": y1}
    want = reference.fit(x, labels, batch_size=BATCH, shuffle=False, verbose=0).history
    got = pipe.fit(x, [y2, y1], batch_size=BATCH, shuffle=False, verbose=0).history  # a, b
    assert rel_error(model.get_weights(), reference.get_weights(), w0) < 1e-5
    _assert_logs_equal(got, want)
    assert "a_accuracy" in got and "b_loss" in got
    predicted, expected = pipe.predict(x, verbose=0), reference.predict(x, verbose=0)
    assert isinstance(predicted, dict) and predicted.keys() == expected.keys() == {"a", "b"}
    for name in expected:
        np.testing.assert_allclose(predicted[name], expected[name], atol=1e-5)


def test_stash_trains_two_outputs_and_evaluates_as_the_wrapped_model():
    x, y1, y2 = _data(24)
    model = _model()
    pipe = PipelineModel(model, cuts=CUTS, devices=DEVICES, mode="stash")
    make = CASES["list_weights"][0]
    pipe.compile(keras.optimizers.SGD(0.2, momentum=0.5), **make())
    keras_model = _model()  # the wrapped model's twin, evaluated by Keras itself
    keras_model.compile(**make())

    def check_evaluate():
        keras_model.set_weights(model.get_weights())
        want = keras_model.evaluate(x, [y1, y2], batch_size=BATCH, verbose=0, return_dict=True)
        got = pipe.evaluate(x, [y1, y2], batch_size=BATCH, verbose=0, return_dict=True)
        _assert_logs_equal(got, want)
        return got

    before = check_evaluate()  # evaluate first: the labels seen here build the metrics
    history = pipe.fit(x, {"o1": y1, "o2": y2}, batch_size=BATCH, epochs=6, verbose=0)
    after = check_evaluate()
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert after["loss"] < before["loss"]
    assert after["o1_loss"] < before["o1_loss"] and after["o2_loss"] < before["o2_loss"]


# --- bad input ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe():
    return PipelineModel(_model(), cuts=CUTS, devices=DEVICES, mode="sync")


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(loss=["mse", "mse", "mse"]), ValueError,
         r"`loss` is a list of 3 items, but model 'two' has 2 outputs \['o1', 'o2'\]"),
        (dict(loss=["mse"]), ValueError, r"`loss` is a list of 1 items"),
        (dict(loss={"o1": "mse", "oX": "mse"}), ValueError,
         r"keys must be exactly the names of the outputs.*\['o1', 'o2'\].*unknown: \['oX'\]"),
        (dict(loss={"o1": "mse"}), ValueError, r"missing: \['o2'\]"),
        (dict(loss=[None, None]), ValueError, r"gives no output of model 'two' a loss"),
        (dict(loss=["mse", "nonsense"]), ValueError,
         r"`loss` for output 'o2' is not a Keras loss. Received: 'nonsense'"),
        (dict(loss=["mse", ["mse"]]), ValueError, r"Each entry of `loss` must be one Keras loss"),
        (dict(loss=None), ValueError, r"`loss` is required"),
        (dict(loss=["mse", "mse"], loss_weights=[1.0]), ValueError,
         r"`loss_weights` is a list of 1 items, but model 'two' has 2 outputs"),
        (dict(loss="mse", loss_weights=[1.0, 2.0]), ValueError,
         r"With one `loss` for every output, `loss_weights` must be one number"),
        (dict(loss=["mse", "mse"], loss_weights=0.5), ValueError,
         r"`loss_weights` must give one weight per output"),
        (dict(loss=["mse", "mse"], loss_weights={"o1": 1.0, "oX": 2.0}), ValueError,
         r"`loss_weights` is a dict.*unknown: \['oX'\]"),
        (dict(loss=["mse", "mse"], loss_weights={"o1": 1.0}), ValueError,
         r"`loss_weights` has no weight for the outputs \['o2'\]"),
        (dict(loss=["mse", "mse"], loss_weights=[1.0, "2"]), TypeError,
         r"`loss_weights` must hold numbers. Received: '2' for output 'o2'"),
        (dict(loss="mse", metrics=["mae"]), ValueError,
         r"`metrics` of model 'two' with 2 outputs \['o1', 'o2'\] must be a list of one "
         r"entry per output.*Received: metrics=\['mae'\]"),
        (dict(loss="mse", metrics="mae"), ValueError, r"Received: metrics='mae'"),
        (dict(loss="mse", metrics={"oX": "mae"}), ValueError,
         r"`metrics` is a dict, so its keys must be among the names.*unknown: \['oX'\]"),
        (dict(loss="mse", metrics={"o2": ["mae", "nonsense"]}), ValueError,
         r"`metrics` for output 'o2' must hold Keras metrics.*Received: 'nonsense'"),
    ],
)
def test_compile_refuses_what_does_not_fit_the_outputs(pipe, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        pipe.compile("sgd", **kwargs)


def test_loss_weights_need_several_outputs():
    inputs = keras.Input((5,))
    single = keras.Model(inputs, keras.layers.Dense(2, name="d")(inputs), name="one")
    pipe = PipelineModel(single, cuts=[], devices=["/CPU:0"], mode="sync")
    with pytest.raises(ValueError, match=r"model 'one' has one output.*loss_weights=\[1.0\]"):
        pipe.compile("sgd", loss="mse", loss_weights=[1.0])


def _dataset(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


X, Y1, Y2 = _data(12)


@pytest.fixture(scope="module")
def refusing_pipe():
    """One compiled sync pipeline for the refusals below: each checks that no step ran (its
    weights stay as the case found them), so they can share it (a pipeline costs its set-up)."""
    model = _model()
    pipe = PipelineModel(model, cuts=CUTS, devices=DEVICES, mode="sync")
    pipe.compile("sgd", loss=["mse", _scce()])
    return pipe, model


@pytest.mark.parametrize(
    "make_kwargs, pattern",
    [
        (lambda: dict(x=X, y=Y1),
         r"Model 'two' has 2 outputs \['o1', 'o2'\]: pass `y` as a list of 2 arrays, one per "
         r"output \(or a dict by output name\). Received: a single ndarray"),
        (lambda: dict(x=X, y=[Y1, Y2, Y2]),
         r"Model 'two' has 2 outputs \['o1', 'o2'\], but `y` is a list of 3 items"),
        (lambda: dict(x=X, y={"o1": Y1, "oX": Y2}),
         r"`y` is a dict, so its keys must be the names of the model's outputs \['o1', 'o2'\]. "
         r"Received keys: \['o1', 'oX'\]"),
        (lambda: dict(x=X, y=[Y1, Y2[:10]]),
         r"`x` and `y\[1\]` must have the same number of examples. Received: 12 and 10"),
        (lambda: dict(x=X, y={"o1": Y1, "o2": np.ones((12, 3), "float32")}),
         r"The labels do not fit the model's output 'o2': model 'two' outputs shape "
         r"\(None, 4\) but `y\['o2'\]` has shape \(12, 3\)"),
        (lambda: dict(x=X, y=[Y1, Y2 + 4]),
         r"`y\[1\]` holds class indices .* \[0, 4\)"),
        (lambda: dict(x=_dataset(X, Y1)),
         r"the dataset `x` must yield \(x, y\) batches whose y is a tuple of 2 tensors"),
        (lambda: dict(x=_dataset(X, (Y1, Y2, Y2))),
         r"but the dataset `x` yields labels that are a tuple of 3 items"),
        (lambda: dict(x=_dataset(X, {"o1": Y1, "o2": np.ones((12, 2), "float32")})),
         r"the dataset `x` yields labels for output 'o2' of shape \(None, 2\)"),
        (lambda: dict(x=X, y=[Y1, Y2], validation_data=(X, [Y1])),
         r"but `validation_data\[1\]` is a list of 1 items"),
    ],
)
def test_fit_refuses_labels_that_do_not_fit_before_training(refusing_pipe, make_kwargs,
                                                           pattern):
    pipe, model = refusing_pipe
    w0 = model.get_weights()
    with pytest.raises(ValueError, match=pattern):
        pipe.fit(batch_size=BATCH, verbose=0, **make_kwargs())
    for a, b in zip(model.get_weights(), w0):
        np.testing.assert_array_equal(a, b)  # no step ran
    with pytest.raises(ValueError, match=r"`y` is a list of 1 items"):
        pipe.evaluate(X, [Y1], verbose=0)
