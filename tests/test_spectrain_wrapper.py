"""Tests for `tf_spectrain.SpecTrain(optimizer)` (docs/SPECTRAIN.md section 6c).

Every expectation comes from outside the wrapper: the Keras optimizer it wraps (training
must be that optimizer's, exactly), or Adam's update and the prediction rule written in
NumPy here from Keras' documented update (`keras/src/optimizers/adam.py`).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_spectrain
from tf_spectrain import SpecTrain, SpecTrainSGD

# Adam's constants exact in float32 (Keras takes beta^t of float32-cast constants).
B1, B2, EPS = 0.875, 1 - 2 ** -10, 1e-7


# --- helpers ------------------------------------------------------------------------------


def _variables(seed=0):
    rng = np.random.default_rng(seed)
    return [keras.Variable(rng.normal(size=(3, 2)).astype("float32"), name="kernel"),
            keras.Variable(rng.normal(size=(2,)).astype("float32"), name="bias")]


def _grads(seed, variables):
    rng = np.random.default_rng(100 + seed)
    return [rng.normal(size=v.shape).astype("float32") for v in variables]


def _state(optimizer, variables):
    """Every number the variables and the optimizer hold (slots, counts, rates)."""
    return [np.array(v) for v in list(variables) + list(optimizer.variables)]


def _model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                             keras.layers.Dense(2)])


def _data():
    rng = np.random.default_rng(42)
    return rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")


def _fit(optimizer, weights, epochs=2):
    model = _model()
    model.set_weights(weights)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(*_data(), batch_size=4, epochs=epochs, shuffle=False, verbose=0)
    return model


def _numpy_adam(weights, grads_list, lrs, wd=None, amsgrad=False, decays=None):
    """Keras' Adam/AdamW on NumPy arrays; returns (weights, d at the end as section 6c says).

    `lrs[t]` is the rate of update t (0-based) and `lrs[len(grads_list)]` the next one;
    `decays[j]` whether variable j takes the weight decay.
    """
    ws = [np.array(w, dtype=np.float64) for w in weights]
    m = [np.zeros_like(w) for w in ws]
    v = [np.zeros_like(w) for w in ws]
    v_max = [np.zeros_like(w) for w in ws]
    decays = decays or [True] * len(ws)
    for t, grads in enumerate(grads_list, 1):
        lr = lrs[t - 1]
        for j, g in enumerate(grads):
            if wd is not None and decays[j]:
                ws[j] = ws[j] - ws[j] * wd * lr
            m[j] = B1 * m[j] + (1 - B1) * g
            v[j] = B2 * v[j] + (1 - B2) * g * g
            v_max[j] = np.maximum(v_max[j], v[j])
            second = v_max[j] if amsgrad else v[j]
            ws[j] = ws[j] - lr * np.sqrt(1 - B2 ** t) / (1 - B1 ** t) * m[j] / (
                np.sqrt(second) + EPS)
    t, lr = len(grads_list), lrs[len(grads_list)]
    if t == 0:
        return ws, [np.zeros_like(w) for w in ws]
    ds = []
    for j, w in enumerate(ws):
        second = v_max[j] if amsgrad else v[j]
        d = -lr * np.sqrt(1 - B2 ** t) / (1 - B1 ** t) * m[j] / (np.sqrt(second) + EPS)
        if wd is not None and decays[j]:
            d = d - lr * wd * w
        ds.append(d)
    return ws, ds


def _trained(optimizer, steps=3, seed=0):
    variables = _variables(seed)
    optimizer.build(variables)
    for step in range(steps):
        optimizer.apply(_grads(step, variables), variables)
    return variables


# --- training is the inner optimizer's ----------------------------------------------------


def _adamw_excluding_bias():
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


INNER = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adamw_excluding_bias": _adamw_excluding_bias,
    "adam_schedule_clipnorm": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.02, 2, 0.5), clipnorm=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "lion": lambda: keras.optimizers.Lion(0.003, weight_decay=0.01),
}


@pytest.mark.parametrize("name", sorted(INNER))
def test_fit_gives_the_inner_optimizers_weights(name):
    keras.utils.set_random_seed(0)
    start = _model().get_weights()
    want = _fit(INNER[name](), start, epochs=1)
    got = _fit(SpecTrain(INNER[name]()), start, epochs=1)
    for a, b in zip(got.get_weights(), want.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert max(np.max(np.abs(a - b)) for a, b in zip(want.get_weights(), start)) > 1e-3
    assert int(got.optimizer.iterations) == int(want.optimizer.iterations) == 4


def test_exclusions_set_on_the_wrapper_reach_the_inner_optimizer():
    variables = _variables()
    wrapped = SpecTrain(keras.optimizers.AdamW(0.01, weight_decay=0.5))
    wrapped.exclude_from_weight_decay(var_names=["bias"])
    plain = _adamw_excluding_bias()
    plain.weight_decay = 0.5
    twins = _variables()
    for step in range(2):
        wrapped.apply(_grads(step, variables), variables)
        plain.apply(_grads(step, twins), twins)
    for a, b in zip(variables, twins):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-7)


# --- Adam's and AdamW's d ---------------------------------------------------------------


def _adamw_amsgrad_excluding_bias():
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.125, beta_1=B1, beta_2=B2,
                                       amsgrad=True)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


ADAM_CASES = {  # name: (the inner optimizer, _numpy_adam's options)
    "adam": (lambda: keras.optimizers.Adam(0.01, beta_1=B1, beta_2=B2), {}),
    "adam_amsgrad": (lambda: keras.optimizers.Adam(0.01, beta_1=B1, beta_2=B2, amsgrad=True),
                     dict(amsgrad=True)),
    "adamw": (lambda: keras.optimizers.AdamW(0.01, weight_decay=0.125, beta_1=B1, beta_2=B2),
              dict(wd=0.125)),
    "adamw_amsgrad_excluding_bias": (_adamw_amsgrad_excluding_bias,
                                     dict(wd=0.125, amsgrad=True, decays=[True, False])),
    "adam_with_weight_decay": (
        lambda: keras.optimizers.Adam(0.01, weight_decay=0.125, beta_1=B1, beta_2=B2),
        dict(wd=0.125)),
}


@pytest.mark.parametrize("name", sorted(ADAM_CASES))
@pytest.mark.parametrize("updates", [0, 1, 3])
def test_adam_prediction_matches_numpy(name, updates):
    make, options = ADAM_CASES[name]
    optimizer = SpecTrain(make())
    start = [np.array(v) for v in _variables()]
    variables = _trained(optimizer, steps=updates)
    want_w, want_d = _numpy_adam(start, [_grads(s, variables) for s in range(updates)],
                                 [0.01] * (updates + 1), **options)
    for v, w in zip(variables, want_w):
        np.testing.assert_allclose(np.array(v), w, rtol=1e-6, atol=1e-7)
    # Keras' float32 `1 - beta_2^t` has a relative error up to 2^-24 / (1 - beta_2^t),
    # 2e-5 at t = 3: d's tolerance.
    for got, d in zip(optimizer.update_directions(variables), want_d):
        np.testing.assert_allclose(np.array(got), d, rtol=5e-5, atol=1e-9)
    # W + s * d in float32: W's rounding (|W| < 3) is the tolerance.
    for steps, factor in ((0, 0.0), (1, 1.0), (2.5, 2.5), (tf.constant(1.5), 1.5)):
        got = optimizer.predicted_weights(variables, steps)
        for g, v, d in zip(got, variables, want_d):
            np.testing.assert_allclose(np.array(g), np.array(v) + factor * d, rtol=0, atol=5e-7)
    if updates:  # contrast: d is a real step, far above the tolerance
        assert min(np.max(np.abs(d)) for d in want_d) > 1e-3


def test_adam_prediction_uses_the_rate_of_the_next_update():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.02, 1, 0.5)
    optimizer = SpecTrain(keras.optimizers.AdamW(schedule, weight_decay=0.125, beta_1=B1,
                                                 beta_2=B2))
    start = [np.array(v) for v in _variables()]
    variables = _trained(optimizer, steps=3)
    lrs = [0.02 * 0.5 ** t for t in range(4)]  # update t uses schedule(t); d uses schedule(3)
    _, want_d = _numpy_adam(start, [_grads(s, variables) for s in range(3)], lrs, wd=0.125)
    for got, d in zip(optimizer.update_directions(variables), want_d):
        np.testing.assert_allclose(np.array(got), d, rtol=5e-5, atol=1e-9)
    # Contrast: the rate of the last update (schedule(2)) would give twice this d's step.
    assert np.max(np.abs(want_d[0])) > 1e-3


def test_adam_prediction_does_not_use_the_textbook_epsilon():
    # Keras puts eps beside sqrt(v): with gradients near eps the textbook form
    # m_hat / (sqrt(v_hat) + eps) differs by far more than rounding.
    optimizer = SpecTrain(keras.optimizers.Adam(0.01, beta_1=B1, beta_2=B2, epsilon=1e-3))
    v = keras.Variable(np.ones(3, "float32"), name="w")
    optimizer.build([v])
    g = np.array([1e-3, -2e-3, 5e-2], "float32")
    optimizer.apply([g], [v])
    d = np.array(optimizer.update_directions([v])[0])
    m, second = (1 - B1) * g, (1 - B2) * g.astype(np.float64) ** 2
    keras_form = -0.01 * np.sqrt(1 - B2) / (1 - B1) * m / (np.sqrt(second) + 1e-3)
    textbook = -0.01 * (m / (1 - B1)) / (np.sqrt(second / (1 - B2)) + 1e-3)
    np.testing.assert_allclose(d, keras_form, rtol=1e-5)
    assert np.max(np.abs(keras_form - textbook)) > 1e-3


@pytest.mark.parametrize("direction", ["auto", "last_update"])
def test_d_is_a_constant_to_the_gradient(direction):
    # SPECTRAIN.md section 5: a pass differentiates the stage at the weights it uses, so a
    # tape watching W through W + s * d gives the gradient at W_hat; AdamW's d reads W
    # (- lr * wd * W), and without a stop the gradient would be scaled by 1 - s * lr * wd.
    optimizer = SpecTrain(keras.optimizers.AdamW(0.1, weight_decay=0.5), direction=direction)
    variables = _trained(optimizer, steps=2)
    weights = np.random.default_rng(5).normal(size=(3, 2)).astype("float32")
    with tf.GradientTape() as tape:
        tape.watch(variables[0].value)
        w_hat = optimizer.predicted_weights(variables[:1], 4)[0]
        loss = tf.reduce_sum(w_hat * weights)
    grad = tape.gradient(loss, variables[0].value)
    np.testing.assert_allclose(np.array(grad), weights, rtol=1e-6)  # not (1 - 0.2) * weights


# --- prediction changes nothing; d = 0 before the first update ---------------------------


PREDICTORS = {
    "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "adam_last_update": lambda: keras.optimizers.Adam(0.01),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_prediction_changes_no_state(name, traced):
    direction = "last_update" if name.endswith("last_update") else "auto"
    optimizer = SpecTrain(PREDICTORS[name](), direction=direction)
    variables = _trained(optimizer, steps=2)
    before = _state(optimizer, variables)
    def predict(steps):
        return optimizer.predicted_weights(variables, steps)

    got = (tf.function(predict) if traced else predict)(tf.constant(2.0))
    after = _state(optimizer, variables)
    assert len(after) == len(before) and int(optimizer.iterations) == 2
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)
    assert max(np.max(np.abs(np.array(g) - np.array(v))) for g, v in zip(got, variables)) > 1e-4


@pytest.mark.parametrize("name", sorted(PREDICTORS) + ["lion"])
def test_prediction_before_the_first_update_is_w(name):
    make = PREDICTORS.get(name, lambda: keras.optimizers.Lion(0.01, weight_decay=0.1))
    direction = "last_update" if name.endswith("last_update") else "auto"
    optimizer = SpecTrain(make(), direction=direction)
    variables = _variables()
    optimizer.build(variables)
    for got, v in zip(optimizer.predicted_weights(variables, 3), variables):
        np.testing.assert_array_equal(np.array(got), np.array(v))


# --- the last-update rule -----------------------------------------------------------------


LAST_UPDATE = {
    "rmsprop": (lambda: keras.optimizers.RMSprop(0.01, weight_decay=0.1), "auto"),
    "lion": (lambda: keras.optimizers.Lion(0.003, weight_decay=0.1), "auto"),
    "sgd_nesterov": (lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True), "auto"),
    "adamw_last_update": (lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
                          "last_update"),
    "sgd_last_update": (lambda: keras.optimizers.SGD(0.05, momentum=0.9), "last_update"),
}


@pytest.mark.parametrize("name", sorted(LAST_UPDATE))
def test_last_update_rule_is_w_after_minus_w_before(name):
    make, direction = LAST_UPDATE[name]
    optimizer = SpecTrain(make(), direction=direction)
    assert optimizer.rule == "last_update"
    variables = _variables()
    optimizer.build(variables)
    for step in range(3):
        before = [np.array(v) for v in variables]
        optimizer.apply(_grads(step, variables), variables)
        for got, v, w in zip(optimizer.update_directions(variables), variables, before):
            u = np.array(v) - w
            np.testing.assert_allclose(np.array(got), u, rtol=1e-6, atol=0)
            assert np.max(np.abs(u)) > 1e-4


def test_last_update_survives_gradient_accumulation_steps():
    # With gradient_accumulation_steps=2 Keras updates on every second call (iterations
    # counts updates only); the calls between change no weight and are no update, so d
    # stays the last applied update (SPECTRAIN.md 6c: "the update the optimizer applied last").
    optimizer = SpecTrain(keras.optimizers.RMSprop(0.01, gradient_accumulation_steps=2))
    variables = _variables()
    optimizer.build(variables)
    for step in range(2):
        optimizer.apply(_grads(step, variables), variables)
    assert int(optimizer.iterations) == 1
    applied = [np.array(d) for d in optimizer.update_directions(variables)]
    assert min(np.max(np.abs(u)) for u in applied) > 1e-3
    optimizer.apply(_grads(2, variables), variables)  # accumulates only
    assert int(optimizer.iterations) == 1
    for got, u in zip(optimizer.update_directions(variables), applied):
        np.testing.assert_array_equal(np.array(got), u)


@pytest.mark.parametrize("make", [lambda: keras.optimizers.Adam(0.01),
                                  lambda: keras.optimizers.RMSprop(0.01)])
def test_a_variable_overwritten_with_its_gradient_has_no_direction(make):
    overwritten = keras.Variable(np.ones(3, "float32"), name="scale")
    overwritten.overwrite_with_gradient = True
    variables = [overwritten] + _variables()
    optimizer = SpecTrain(make())
    optimizer.build(variables)
    optimizer.apply([np.full(3, 5.0, "float32")] + _grads(0, variables[1:]), variables)
    np.testing.assert_array_equal(np.array(overwritten), np.full(3, 5.0))
    ds = optimizer.update_directions(variables)
    np.testing.assert_array_equal(np.array(ds[0]), np.zeros(3))
    assert np.max(np.abs(np.array(ds[1]))) > 1e-3


def test_momentum_sgd_predicts_from_its_momentum_slot():
    optimizer = SpecTrain(keras.optimizers.SGD(0.05, momentum=0.9))
    assert optimizer.rule == "momentum"
    variables = _variables()
    velocity = [np.zeros(v.shape) for v in variables]
    optimizer.build(variables)
    for step in range(3):
        for j, g in enumerate(_grads(step, variables)):
            velocity[j] = 0.9 * velocity[j] - 0.05 * g
        optimizer.apply(_grads(step, variables), variables)
    for got, m in zip(optimizer.update_directions(variables), velocity):
        np.testing.assert_allclose(np.array(got), m, rtol=1e-5, atol=1e-8)


# --- configuration, saving, cloning -------------------------------------------------------


def test_config_round_trips_directly_and_through_keras_serialization():
    optimizer = SpecTrain(keras.optimizers.AdamW(0.003, weight_decay=0.02, amsgrad=True,
                                                 clipnorm=1.0), direction="last_update")
    config = optimizer.get_config()
    for restored in (SpecTrain.from_config(config), keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(optimizer))):
        assert type(restored) is SpecTrain and not restored.built
        assert restored.get_config() == config
        assert type(restored.inner_optimizer) is keras.optimizers.AdamW
        assert restored.direction == "last_update" and restored.inner_optimizer.amsgrad


def test_saved_model_restores_the_inner_and_the_wrappers_slots(tmp_path):
    keras.utils.set_random_seed(1)
    model = _fit(SpecTrain(keras.optimizers.AdamW(0.01, weight_decay=0.1),
                           direction="last_update"), _model().get_weights(), epochs=1)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is SpecTrain
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    # iteration, learning rate, then m and v of 4 variables, then 4 last-update slots; the
    # slots' names hold the layers' names, which differ in the loaded model.
    saved, restored = model.optimizer.variables, loaded.optimizer.variables
    assert len(restored) == len(saved) == 2 + 2 * 4 + 4
    assert [v.name.endswith("last_update") for v in restored][-4:] == [True] * 4
    for a, b in zip(restored, saved):
        assert a.shape == b.shape and a.name.split("_")[-1] == b.name.split("_")[-1]
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert int(loaded.optimizer.iterations) == 4
    for a, b in zip(loaded.optimizer.predicted_weights(loaded.trainable_variables, 2),
                    model.optimizer.predicted_weights(model.trainable_variables, 2)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-7)


def test_clone_for_stage_is_fresh_and_shares_a_callable_rate():
    rate = [0.01]

    def current_rate():
        return rate[0]

    inner = keras.optimizers.AdamW(current_rate, weight_decay=0.1, clipnorm=2.0)
    inner.exclude_from_weight_decay(var_names=["bias"])
    optimizer = SpecTrain(inner, direction="last_update", name="stage_opt")
    variables = _trained(optimizer, steps=1)
    clone = optimizer.clone_for_stage()
    assert type(clone) is SpecTrain and clone is not optimizer
    assert clone.inner_optimizer is not optimizer.inner_optimizer
    assert clone.name == "stage_opt" and clone.direction == "last_update"
    assert clone.clipnorm == 2.0 and clone.weight_decay == 0.1
    assert not clone.built and int(clone.iterations) == 0
    rate[0] = 0.5
    assert float(clone.learning_rate) == float(optimizer.learning_rate) == 0.5
    twins = _variables(seed=3)
    clone.apply([np.zeros((3, 2), "float32"), np.zeros(2, "float32")], twins)
    # The decay applied to the kernel only (the exclusion carried over) at the shared rate.
    np.testing.assert_allclose(np.array(twins[0]), np.array(_variables(3)[0]) * (1 - 0.05),
                               rtol=1e-6)
    np.testing.assert_array_equal(np.array(twins[1]), np.array(_variables(3)[1]))
    assert int(optimizer.iterations) == 1 and int(clone.iterations) == 1
    assert len(clone.variables) == len(optimizer.variables)
    assert not any(a is b for a in clone.variables for b in optimizer.variables)
    del variables


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("make, kwargs, error, message", [
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()), {}, ValueError,
     "Wrap the other way round.*Received: SpecTrain\\(LossScaleOptimizer"),
    (lambda: SpecTrain(keras.optimizers.Adam()), {}, ValueError,
     "already a `SpecTrain` optimizer; wrap the Keras optimizer once. Received: optimizer="),
    (lambda: keras.optimizers.Adam(), dict(direction="momentum"), ValueError,
     "`direction` must be one of .*Received: direction='momentum'"),
    (lambda: "adamz", {}, ValueError, "instance or name.*Received: optimizer='adamz'"),
    (lambda: 3, {}, ValueError, "Received: optimizer=3"),
    (lambda: keras.optimizers.Adam(), dict(clipnorm=1.0), ValueError,
     "set them on the optimizer it wraps"),
])
def test_bad_arguments_raise_keras_style(make, kwargs, error, message):
    with pytest.raises(error, match=message):
        SpecTrain(make(), **kwargs)


def test_a_name_resolves_to_the_keras_optimizer():
    optimizer = SpecTrain("adamw")
    assert type(optimizer.inner_optimizer) is keras.optimizers.AdamW
    assert optimizer.name == "spectrain_" + optimizer.inner_optimizer.name


def test_prediction_before_build_or_of_an_unknown_variable_raises():
    optimizer = SpecTrain(keras.optimizers.Adam())
    variables = _variables()
    with pytest.raises(ValueError, match="is not built yet, so it cannot predict 'kernel'"):
        optimizer.predicted_weights(variables, 1)
    optimizer.build(variables[:1])
    with pytest.raises(ValueError, match="Unknown variable 'bias'"):
        optimizer.predicted_weights(variables, 1)
    with pytest.raises(TypeError, match="pass \\[variable\\] instead"):
        optimizer.predicted_weights(variables[0], 1)
    with pytest.raises(ValueError, match="steps=-1"):
        optimizer.predicted_weights(variables[:1], -1)


# --- loss scaling -------------------------------------------------------------------------


@pytest.fixture
def mixed_float16():
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(policy)


def test_loss_scale_optimizer_around_the_wrapper_trains_like_around_adam(mixed_float16):
    keras.utils.set_random_seed(2)
    start = _model().get_weights()
    want = _fit(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01)), start, 1)
    got = _fit(keras.optimizers.LossScaleOptimizer(SpecTrain(keras.optimizers.Adam(0.01))),
               start, 1)
    for a, b in zip(got.get_weights(), want.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert int(got.optimizer.iterations) == int(want.optimizer.iterations) > 0
    assert float(got.optimizer.dynamic_scale) == float(want.optimizer.dynamic_scale)
    inner = got.optimizer.inner_optimizer
    assert isinstance(inner, SpecTrain) and int(inner.iterations) > 0
    d = inner.update_directions(got.trainable_variables)
    assert all(t.dtype == "float32" for t in d)


# --- SpecTrainSGD is the wrapper around SGD, compatible with earlier versions --------------


def test_spectrain_sgd_variables_keep_their_old_names_shapes_and_order():
    # As the SpecTrainSGD of commit 98bd98a~1 (a Keras optimizer of its own) built them.
    optimizer = SpecTrainSGD(0.01, momentum=0.9)
    optimizer.build(_variables())
    got = [(v.path, tuple(v.shape), str(v.dtype)) for v in optimizer.variables]
    assert got == [("spectrain_sgd/iteration", (), "int64"),
                   ("spectrain_sgd/learning_rate", (), "float32"),
                   ("spectrain_sgd/kernel_momentum", (3, 2), "float32"),
                   ("spectrain_sgd/bias_momentum", (2,), "float32")]
    assert isinstance(optimizer, SpecTrain) and optimizer.rule == "momentum"


def test_spectrain_sgd_loads_an_old_flat_config():
    old = {"name": "spectrain_sgd", "learning_rate": 0.009999999776482582,
           "weight_decay": None, "clipnorm": None, "global_clipnorm": None, "clipvalue": None,
           "use_ema": False, "ema_momentum": 0.99, "ema_overwrite_frequency": None,
           "loss_scale_factor": None, "gradient_accumulation_steps": None, "momentum": 0.9}
    optimizer = SpecTrainSGD.from_config(old)
    assert type(optimizer) is SpecTrainSGD and optimizer.momentum == 0.9
    assert optimizer.get_config() == old
    # `keras.saving.serialize_keras_object` of the old class, as .keras files hold it.
    restored = keras.saving.deserialize_keras_object(
        {"module": "tf_spectrain.optimizer", "class_name": "SpecTrainSGD", "config": old,
         "registered_name": "tf_spectrain>SpecTrainSGD"})
    assert type(restored) is SpecTrainSGD and restored.get_config() == old


def test_spectrain_sgd_is_exported_at_the_top_level():
    assert tf_spectrain.SpecTrain is SpecTrain and tf_spectrain.SpecTrainSGD is SpecTrainSGD
