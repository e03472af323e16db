"""Bad arguments of `compile`, `fit`, `evaluate` and `predict` fail at once, and clearly.

Every bad call must raise ValueError or TypeError from tf_spectrain's own code (not from
deep inside Keras or TensorFlow), with a message that names the argument (and, for data
that does not fit the model, both shapes), and BEFORE any training step: the wrapped
model's weights and every stage optimizer's step count are compared before and after.

Every `fit` row runs twice: through `fit`, and on `check_fit_args` directly.
"""

import os
import traceback

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_spectrain
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.workflow.input_checks import check_fit_args

PACKAGE_DIR = os.path.dirname(os.path.realpath(tf_spectrain.__file__))
N, FEATURES, CLASSES, BATCH = 16, 5, 3, 4

def make_mlp():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,), name="features")
    h = inputs
    for n, width in enumerate([4, 4, CLASSES]):
        h = keras.layers.Dense(width, name=f"dense{n}")(h)
    return keras.Model(inputs, h, name="mlp")


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def data(n=N, features=FEATURES):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype("float32")
    y = rng.integers(0, CLASSES, size=n).astype("int32")
    return x, y


X, Y = data()


def ds(*tensors, batch=BATCH):
    d = tf.data.Dataset.from_tensor_slices(tensors if len(tensors) > 1 else tensors[0])
    return d if batch is None else d.batch(batch)


@pytest.fixture(scope="module")
def pipe():
    """A compiled 2-stage sync pipeline; no test trains it successfully."""
    p = PipelineModel(make_mlp(), cuts=["dense1"], mode="sync")
    p.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss_fn(),
              metrics=["accuracy"])
    return p


def _state(p):
    steps = [int(o.iterations) for o in p.stage_optimizers] if p.runners else []
    return p.model.get_weights(), steps


def assert_rejected(p, call, error, pattern):
    """`call()` raises `error` matching `pattern` from tf_spectrain, changing nothing."""
    weights, steps = _state(p)
    with pytest.raises(error, match=pattern) as info:
        call()
    where = os.path.realpath(traceback.extract_tb(info.value.__traceback__)[-1].filename)
    assert where.startswith(PACKAGE_DIR + os.sep), f"raised from {where}: {info.value}"
    new_weights, new_steps = _state(p)
    assert new_steps == steps, "an optimizer step ran before the error"
    for before, after in zip(weights, new_weights):
        np.testing.assert_array_equal(before, after)


# --- compile ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uncompiled():
    return PipelineModel(make_mlp(), cuts=["dense1"], mode="spectrain")


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(optimizer=None), ValueError, r"`optimizer` is required"),
        (dict(optimizer="sgdd"), ValueError, r"optimizer='sgdd'"),
        (dict(optimizer=3), ValueError, r"optimizer=3"),
        (dict(optimizer=keras.optimizers.SGD), ValueError, r"optimizer=<class"),
        (dict(optimizer="adamz"), ValueError, r"optimizer='adamz'"),
        (dict(loss=None), ValueError, r"`loss` is required"),
        (dict(loss="msee"), ValueError, r"loss='msee'"),
        (dict(loss=3), ValueError, r"loss=3"),
        (dict(loss={"out": "mse"}), ValueError, r"loss=\{'out': 'mse'\}"),
        (dict(metrics="accuracy"), TypeError, r"metrics='accuracy'"),
        (dict(metrics={"out": "accuracy"}), TypeError, r"metrics=\{'out'"),
        (dict(metrics=["accuraccy"]), ValueError, r"metric 'accuraccy'"),
        (dict(metrics=[3]), ValueError, r"metric 3"),
        (dict(metrics=[None]), ValueError, r"metric None"),
        (dict(metrics=[["accuracy"]]), ValueError, r"metric \['accuracy'\]"),
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, dict) else None,
)
def test_compile_rejects(uncompiled, kwargs, error, pattern):
    args = dict(optimizer=SpecTrainSGD(0.1, momentum=0.9), loss=loss_fn(), metrics=None)
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        uncompiled.compile(**args)
    assert uncompiled.runners is None  # a failed compile leaves the pipeline uncompiled


# --- fit --------------------------------------------------------------------------------------

x_unbatched = ds(X, Y, batch=None)
FIT_CASES = [
    # (id, fit keyword arguments, error, pattern, checked by fit already)
    ("epochs0", dict(epochs=0), ValueError, r"epochs=0"),
    ("epochs-1", dict(epochs=-1), ValueError, r"epochs=-1"),
    ("epochs1.5", dict(epochs=1.5), TypeError, r"epochs=1.5"),
    ("epochs_str", dict(epochs="3"), TypeError, r"epochs='3'"),
    ("batch0", dict(batch_size=0), ValueError, r"batch_size=0"),
    ("batch2.5", dict(batch_size=2.5), TypeError, r"batch_size=2.5"),
    ("batch_str", dict(batch_size="4"), TypeError, r"batch_size='4'"),
    ("verbose3", dict(verbose=3), ValueError, r"`verbose` must be .*verbose=3"),
    ("verbose_str", dict(verbose="yes"), ValueError, r"verbose='yes'"),
    ("verbose_none", dict(verbose=None), TypeError, r"verbose=None"),
    ("callbacks_single", dict(callbacks=keras.callbacks.History()), TypeError,
     r"did you mean callbacks=\[History"),
    ("callbacks_str", dict(callbacks="cb"), TypeError, r"callbacks='cb'"),
    ("callbacks_int", dict(callbacks=[3]), TypeError, r"Received: 3 \(int\)"),
    ("callbacks_none", dict(callbacks=[None]), TypeError, r"Received: None"),
    ("callbacks_class", dict(callbacks=[keras.callbacks.History]), TypeError,
     r"a class, not an instance"),
    ("val_1tuple", dict(validation_data=(X,)), ValueError, r"validation_data.*tuple of 1"),
    ("val_weights_length", dict(validation_data=(X, Y, np.ones(N - 1))), ValueError,
     r"validation_data\[2\]` must have one weight per example.*16 long"),
    ("val_4tuple", dict(validation_data=(X, Y, np.ones(N), Y)), ValueError,
     r"validation_data.*tuple of 4"),
    ("val_array", dict(validation_data=X), TypeError, r"validation_data of type ndarray"),
    ("val_lengths", dict(validation_data=(X, Y[:5])), ValueError,
     r"same number of examples.*16 and 5"),
    ("val_shape", dict(validation_data=(X[:, :4], Y)), ValueError,
     r"expects inputs of shape \(None, 5\) but validation_data\[0\] has shape \(16, 4\)"),
    ("val_labels", dict(validation_data=(X, np.zeros((N, 2), "int32"))), ValueError,
     r"outputs shape \(None, 3\) but `validation_data\[1\]` has shape \(16, 2\)"),
    ("val_dataset_x_only", dict(validation_data=ds(X)), ValueError,
     r"\(x, y\) or \(x, y, sample_weight\) batches"),
    ("xy_lengths", dict(y=Y[:10]), ValueError, r"same number of examples.*16 and 10"),
    ("x_shape", dict(x=X[:, :4]), ValueError,
     r"expects inputs of shape \(None, 5\) but x has shape \(16, 4\)"),
    ("x_rank4", dict(x=X[:, :, None, None]), ValueError,
     r"\(None, 5\) but x has shape \(16, 5, 1, 1\)"),
    ("x_rank1", dict(x=X[:, 0]), ValueError, r"\(None, 5\) but x has shape \(16,\)"),
    ("x_strings", dict(x=np.full((N, FEATURES), "a")), ValueError, r"must hold numbers"),
    ("x_two_arrays", dict(x=[X, X]), ValueError, r"1 input\(s\) \['features'\].*2 items"),
    ("x_dict_keys", dict(x={"feature": X}), ValueError, r"keys.*\['features'\]"),
    ("x_scalar", dict(x=3.0), TypeError, r"x of type float"),
    ("x_none", dict(x=None), ValueError, r"x=NoneType"),
    ("x_empty", dict(x=X[:0], y=Y[:0]), ValueError, r"`x` is empty"),
    ("y_none", dict(y=None), ValueError, r"y=NoneType"),
    ("y_shape", dict(y=np.zeros((N, 2), "int32")), ValueError,
     r"outputs shape \(None, 3\) but `y` has shape \(16, 2\)"),
    ("y_onehot_4", dict(y=np.eye(4, dtype="float32")[Y]), ValueError, r"`y` has shape \(16, 4\)"),
    ("y_out_of_range", dict(y=np.where(np.arange(N) == 9, CLASSES, Y)), ValueError,
     r"\[0, 3\).*from 0 to 3"),
    ("y_negative", dict(y=np.where(np.arange(N) == 2, -1, Y)), ValueError, r"from -1 to"),
    ("y_strings", dict(y=np.array(["cat"] * N)), ValueError, r"`y` must hold numbers"),
    ("y_scalar", dict(y=np.int32(1)), ValueError, r"batch axis"),
    ("steps0", dict(steps_per_epoch=0), ValueError, r"steps_per_epoch=0"),
    ("steps1.5", dict(steps_per_epoch=1.5), TypeError, r"steps_per_epoch=1.5"),
    ("steps_bool", dict(steps_per_epoch=True), TypeError, r"steps_per_epoch=True"),
    ("steps_past_data", dict(steps_per_epoch=3, epochs=2), ValueError,
     r"needs 6 batches.*16 examples in batches of 4 give only 4"),
    ("steps_past_dataset", dict(x=ds(X, Y), y=None, steps_per_epoch=3, epochs=2), ValueError,
     r"needs 6 batches.*the dataset has only 4"),
    ("initial_eq_epochs", dict(initial_epoch=1, epochs=1), ValueError,
     r"initial_epoch=1, epochs=1"),
    ("initial_gt_epochs", dict(initial_epoch=3, epochs=2), ValueError,
     r"initial_epoch=3, epochs=2"),
    ("initial-1", dict(initial_epoch=-1), ValueError, r"initial_epoch=-1"),
    ("shuffle_str", dict(shuffle="batch"), TypeError, r"shuffle='batch'"),
    ("shuffle_none", dict(shuffle=None), TypeError, r"shuffle=None"),
    ("shuffle_int", dict(shuffle=1), TypeError, r"shuffle=1"),
    ("ds_x_only", dict(x=ds(X), y=None), ValueError,
     r"\(x, y\) or \(x, y, sample_weight\) batches"),
    ("ds_quadruples", dict(x=ds(X, Y, Y, Y), y=None), ValueError, r"sample_weight\) batches"),
    ("ds_unbatched", dict(x=x_unbatched, y=None), ValueError,
     r"yields inputs of shape \(5,\); batch the dataset"),
    ("ds_x_shape", dict(x=ds(X[:, :4], Y), y=None), ValueError,
     r"expects inputs of shape \(None, 5\) but the dataset `x` yields inputs of shape "
     r"\(None, 4\)"),
    ("ds_labels", dict(x=ds(X, np.zeros((N, 2), "int32")), y=None), ValueError,
     r"the dataset `x` yields labels of shape \(None, 2\)"),
    ("ds_and_y", dict(x=ds(X, Y), y=Y), ValueError, r"`y` must be None"),
    ("ds_empty", dict(x=ds(X[:0], Y[:0]), y=None), ValueError, r"empty dataset"),
]


def _fit_kwargs(case_kwargs):
    kwargs = dict(x=X, y=Y, batch_size=BATCH, epochs=1, verbose=0, callbacks=None,
                  validation_data=None, shuffle=True, initial_epoch=0, steps_per_epoch=None)
    kwargs.update(case_kwargs)
    return kwargs


def _fit_params():
    for name, kwargs, error, pattern in FIT_CASES:
        yield pytest.param(kwargs, error, pattern, id=name)


@pytest.mark.parametrize("kwargs, error, pattern", list(_fit_params()))
def test_fit_rejects_before_any_training_step(pipe, kwargs, error, pattern):
    assert_rejected(pipe, lambda: pipe.fit(**_fit_kwargs(kwargs)), error, pattern)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [pytest.param(k, e, p, id=name) for name, k, e, p in FIT_CASES],
)
def testcheck_fit_args_rejects(pipe, kwargs, error, pattern):
    call = lambda: check_fit_args(pipe.model, pipe.loss, **_fit_kwargs(kwargs))  # noqa: E731
    assert_rejected(pipe, call, error, pattern)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(verbose="auto", callbacks=[keras.callbacks.History()], shuffle=False),
        dict(validation_data=[X, Y], steps_per_epoch=2, epochs=2, initial_epoch=1),
        dict(x={"features": X}, y=list(Y), validation_data=ds(X, Y)),
        dict(x=ds(X, Y), y=None, batch_size=None, verbose=np.int64(2)),
    ],
)
def testcheck_fit_args_accepts_valid_arguments(pipe, kwargs):
    # The checks must not reject what fit can train: each row is accepted silently.
    assert check_fit_args(pipe.model, pipe.loss, **_fit_kwargs(kwargs)) is None


def test_fit_before_compile_fails_before_the_data_is_read():
    p = PipelineModel(make_mlp(), cuts=["dense1"], mode="sync")
    assert_rejected(p, lambda: p.fit(X[:, :4], Y, epochs=0), ValueError, r"compile")


# --- evaluate and predict ---------------------------------------------------------------------

EVALUATE_CASES = [
    ("x_shape", dict(x=X[:, :4]), ValueError,
     r"expects inputs of shape \(None, 5\) but x has shape \(16, 4\)"),
    ("lengths", dict(y=Y[:3]), ValueError, r"same number of examples.*16 and 3"),
    ("batch0", dict(batch_size=0), ValueError, r"batch_size=0"),
    ("batch_str", dict(batch_size="4"), TypeError, r"batch_size='4'"),
    ("x_none", dict(x=None), ValueError, r"x=NoneType"),
    ("y_none", dict(y=None), ValueError, r"y=NoneType"),
    ("verbose", dict(verbose="x"), ValueError, r"verbose='x'"),
    ("return_dict", dict(return_dict="yes"), TypeError, r"return_dict='yes'"),
    ("ds_x_only", dict(x=ds(X), y=None), ValueError, r"\(x, y, sample_weight\) batches"),
    ("ds_and_y", dict(x=ds(X, Y), y=Y), ValueError, r"`y` must be None"),
    ("y_shape", dict(y=np.zeros((N, 2), "int32")), ValueError, r"`y` has shape \(16, 2\)"),
    ("y_out_of_range", dict(y=np.full(N, 7)), ValueError, r"\[0, 3\).*from 7 to 7"),
    ("x_empty", dict(x=X[:0], y=Y[:0]), ValueError, r"`x` is empty"),
]


@pytest.mark.parametrize(
    "kwargs, error, pattern", [pytest.param(k, e, p, id=i) for i, k, e, p in EVALUATE_CASES]
)
def test_evaluate_rejects(pipe, kwargs, error, pattern):
    args = dict(x=X, y=Y, batch_size=BATCH, verbose=0)
    args.update(kwargs)
    assert_rejected(pipe, lambda: pipe.evaluate(**args), error, pattern)


PREDICT_CASES = [
    ("x_shape", dict(x=X[:, :4]), ValueError,
     r"expects inputs of shape \(None, 5\) but x has shape \(16, 4\)"),
    ("x_rank4", dict(x=X[:, :, None, None]), ValueError, r"x has shape \(16, 5, 1, 1\)"),
    ("batch0", dict(batch_size=0), ValueError, r"batch_size=0"),
    ("x_none", dict(x=None), TypeError, r"x of type NoneType"),
    ("x_str", dict(x="abc"), TypeError, r"x of type str"),
    ("x_empty", dict(x=X[:0]), ValueError, r"`x` is empty"),
    ("x_two_arrays", dict(x=[X, X]), ValueError, r"2 items"),
    ("verbose", dict(verbose="x"), ValueError, r"verbose='x'"),
    ("ds_shape", dict(x=ds(X[:, :4])), ValueError, r"the dataset `x` yields inputs of shape"),
    ("ds_xy_shape", dict(x=ds(X[:, :4], Y)), ValueError, r"\(None, 4\)"),
    ("ds_empty", dict(x=ds(X[:0])), ValueError, r"empty dataset"),
]


@pytest.mark.parametrize(
    "kwargs, error, pattern", [pytest.param(k, e, p, id=i) for i, k, e, p in PREDICT_CASES]
)
def test_predict_rejects(pipe, kwargs, error, pattern):
    args = dict(x=X, batch_size=BATCH, verbose=0)
    args.update(kwargs)
    assert_rejected(pipe, lambda: pipe.predict(**args), error, pattern)


def test_checked_inputs_still_predict_and_evaluate_like_keras(pipe):
    # The checks must let valid data through unchanged: compare with the wrapped model.
    expected = pipe.model.predict(X, verbose=0)
    np.testing.assert_allclose(pipe.predict(X, batch_size=BATCH), expected, atol=1e-5)
    np.testing.assert_allclose(pipe.predict(ds(X, Y)), expected, atol=1e-5)
    np.testing.assert_allclose(pipe.predict({"features": X}), expected, atol=1e-5)
    reference = float(np.mean(loss_fn()(Y, expected)))
    assert pipe.evaluate(X, list(Y), batch_size=N, verbose=0)[0] == pytest.approx(
        reference, rel=1e-5
    )


@pytest.mark.parametrize(
    "batch_size, n, pattern",
    [
        (6, 16, r"`micro_batches`=4 must divide `batch_size`.*batch_size=6"),
        (8, 18, r"last mini-batch of an epoch has 2 examples \(18 examples, batch_size=8\), "
                r"fewer than `micro_batches`=4"),
    ],
)
def test_micro_batches_must_split_the_array_batches(batch_size, n, pattern):
    pipe = PipelineModel(make_mlp(), cuts=["dense0"], mode="sync", micro_batches=4)
    pipe.compile(SpecTrainSGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.zeros((n, FEATURES), "float32")
    y = np.zeros(n, "int32")
    assert_rejected(pipe, lambda: pipe.fit(x, y, batch_size=batch_size, verbose=0), ValueError,
                    pattern)
