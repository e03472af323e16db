"""Tests for `tf_spectrain.prediction.SpecTrainSGD`.

References are independent of the code under test: Keras' own `SGD` (golden trajectories)
and small NumPy re-implementations of the update and prediction rules written here.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain.prediction import SpecTrainSGD

ATOL = 1e-6


# --- helpers ----------------------------------------------------------------------------


def _variables(seed=0, shapes=((3, 2), (2,))):
    rng = np.random.RandomState(seed)
    return [keras.Variable(rng.randn(*shape).astype("float32")) for shape in shapes]


def _grads(variables, seed):
    rng = np.random.RandomState(seed)
    return [rng.randn(*v.shape).astype("float32") for v in variables]


def _numpy(values):
    return [np.asarray(v) for v in values]


def _state(optimizer, variables):
    """Every number the optimizer or the variables hold, as NumPy arrays."""
    return _numpy(variables) + [np.asarray(v) for v in optimizer.variables]


def _dense_model():
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(2)]
    )


def _embedding_model():
    return keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(10, 4),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )


def _data(model_kind):
    rng = np.random.RandomState(42)
    if model_kind == "embedding":
        x = rng.randint(0, 6, size=(12, 3)).astype("int32")
    else:
        x = rng.randn(12, 4).astype("float32")
    return x, rng.randn(12, 2).astype("float32")


def _fit(optimizer, model_kind, initial_weights):
    model = _embedding_model() if model_kind == "embedding" else _dense_model()
    model.set_weights(initial_weights)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = _data(model_kind)
    model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0)
    return model.get_weights()


# --- construction and config --------------------------------------------------------------


@pytest.mark.parametrize("momentum", [-0.1, 1.0, 1.5, "0.9", None, True])
def test_bad_momentum_raises_with_keras_style_message(momentum):
    with pytest.raises(ValueError, match=r"`momentum` should be a float between \[0, 1\)"):
        SpecTrainSGD(momentum=momentum)
    with pytest.raises(ValueError, match=f"Received: momentum={momentum!r}"):
        SpecTrainSGD(momentum=momentum)


def test_nesterov_true_raises_and_false_is_accepted():
    with pytest.raises(ValueError, match=r"Nesterov.*keras\.optimizers\.SGD"):
        SpecTrainSGD(nesterov=True)
    assert SpecTrainSGD(momentum=0.5, nesterov=False).momentum == 0.5


def test_unknown_keyword_is_rejected_by_keras():
    with pytest.raises(ValueError, match="not recognized"):
        SpecTrainSGD(momentom=0.9)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(learning_rate=0.3, momentum=0.7, weight_decay=0.01, clipnorm=2.0),
        dict(momentum=0.0, global_clipnorm=1.5, use_ema=True, ema_momentum=0.5),
        dict(clipvalue=0.2, gradient_accumulation_steps=3, loss_scale_factor=128.0),
        dict(
            learning_rate=keras.optimizers.schedules.ExponentialDecay(0.1, 5, 0.5),
            name="stage_opt",
        ),
    ],
)
def test_config_round_trip(kwargs):
    optimizer = SpecTrainSGD(**kwargs)
    config = optimizer.get_config()
    assert config["momentum"] == kwargs.get("momentum", 0.9)
    restored = SpecTrainSGD.from_config(optimizer.get_config())
    assert restored.get_config() == config
    # Through Keras' registry, by the registered name.
    serialized = keras.optimizers.serialize(optimizer)
    revived = keras.optimizers.deserialize(serialized)
    assert type(revived) is SpecTrainSGD
    assert revived.get_config() == config


def test_keras_sgd_config_loads():
    config = keras.optimizers.SGD(learning_rate=0.2, momentum=0.4).get_config()
    assert SpecTrainSGD.from_config(config).momentum == 0.4


# --- the update rule ----------------------------------------------------------------------


@pytest.mark.parametrize("momentum", [0.0, 0.8])
def test_steps_match_numpy_update_rule(momentum):
    lr = 0.1
    variables = _variables()
    optimizer = SpecTrainSGD(learning_rate=lr, momentum=momentum)
    w = _numpy(variables)
    m = [np.zeros_like(x) for x in w]
    for seed in (1, 2, 3):
        grads = _grads(variables, seed)
        optimizer.apply_gradients(zip(grads, variables))
        m = [momentum * mi - lr * g for mi, g in zip(m, grads)]
        w = [wi + mi for wi, mi in zip(w, m)]
        for variable, expected_w, expected_m in zip(variables, w, m):
            np.testing.assert_allclose(variable.numpy(), expected_w, rtol=0, atol=ATOL)
            np.testing.assert_allclose(
                optimizer.momentum_of(variable).numpy(), expected_m, rtol=0, atol=ATOL
            )
    assert int(optimizer.iterations) == 3


def test_one_step_from_zero_momentum_is_plain_sgd():
    w0 = np.array([1.0, 2.0, 3.0, 4.0], "float32")
    g = np.array([1.0, 6.0, 7.0, 2.0], "float32")
    variable = keras.Variable(w0)
    optimizer = SpecTrainSGD(learning_rate=0.5, momentum=0.9)
    optimizer.apply_gradients([(g, variable)])
    np.testing.assert_allclose(variable.numpy(), w0 - 0.5 * g, rtol=0, atol=ATOL)
    np.testing.assert_allclose(optimizer.momentum_of(variable).numpy(), -0.5 * g, atol=ATOL)


GOLDEN_CASES = {
    "momentum_0.9": ("dense", dict(learning_rate=0.05, momentum=0.9)),
    "momentum_0": ("dense", dict(learning_rate=0.05, momentum=0.0)),
    "schedule": (
        "dense",
        dict(
            learning_rate=keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5),
            momentum=0.9,
        ),
    ),
    "weight_decay": ("dense", dict(learning_rate=0.05, momentum=0.9, weight_decay=0.1)),
    "clipnorm": ("dense", dict(learning_rate=0.05, momentum=0.9, clipnorm=0.05)),
    "global_clipnorm": ("dense", dict(learning_rate=0.05, momentum=0.9, global_clipnorm=0.05)),
    "clipvalue": ("dense", dict(learning_rate=0.05, momentum=0.9, clipvalue=0.01)),
    "sparse_momentum_0.9": ("embedding", dict(learning_rate=0.1, momentum=0.9)),
    "sparse_momentum_0": ("embedding", dict(learning_rate=0.1, momentum=0.0)),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_fit_matches_keras_sgd(case):
    model_kind, kwargs = GOLDEN_CASES[case]
    keras.utils.set_random_seed(7)
    initial = (_embedding_model() if model_kind == "embedding" else _dense_model()).get_weights()
    ours = _fit(SpecTrainSGD(**kwargs), model_kind, initial)
    reference = _fit(keras.optimizers.SGD(nesterov=False, **kwargs), model_kind, initial)
    moved = max(np.abs(a - b).max() for a, b in zip(reference, initial))
    assert moved > 1e-3, "the reference run must actually train"
    for got, expected in zip(ours, reference):
        np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


def test_momentum_zero_keeps_the_last_step_even_for_sparse_gradients():
    table = keras.Variable(np.ones((4, 2), "float32"))
    optimizer = SpecTrainSGD(learning_rate=0.5, momentum=0.0)
    first = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([0]), tf.constant([4, 2]))
    second = tf.IndexedSlices(tf.constant([[4.0, 4.0]]), tf.constant([2]), tf.constant([4, 2]))
    optimizer.apply_gradients([(first, table)])
    optimizer.apply_gradients([(second, table)])
    expected_m = np.zeros((4, 2), "float32")
    expected_m[2] = -0.5 * 4.0
    np.testing.assert_allclose(optimizer.momentum_of(table).numpy(), expected_m, atol=ATOL)


# --- momentum lookup ----------------------------------------------------------------------


def test_momentum_of_accepts_the_wrapped_tf_variable():
    variables = _variables()
    optimizer = SpecTrainSGD()
    optimizer.build(variables)
    for variable in variables:
        assert optimizer.momentum_of(variable) is optimizer.momentum_of(variable.value)
    assert optimizer.momentum_of(variables[0]) is not optimizer.momentum_of(variables[1])


def test_momentum_of_unknown_variable_raises():
    optimizer = SpecTrainSGD()
    optimizer.build(_variables())
    stranger = keras.Variable(np.zeros(3, "float32"), name="stranger")
    with pytest.raises(ValueError, match="Unknown variable 'stranger'.*built with 2"):
        optimizer.momentum_of(stranger)
    with pytest.raises(TypeError, match="must be a `keras.Variable`"):
        optimizer.momentum_of(np.zeros(3))


def test_momentum_of_before_build_raises():
    with pytest.raises(ValueError, match="not built yet"):
        SpecTrainSGD().momentum_of(keras.Variable(1.0))


# --- prediction ---------------------------------------------------------------------------


def _trained(momentum=0.9, steps=3):
    variables = _variables()
    optimizer = SpecTrainSGD(learning_rate=0.1, momentum=momentum)
    for seed in range(steps):
        optimizer.apply_gradients(zip(_grads(variables, seed + 10), variables))
    return optimizer, variables


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize(
    "steps",
    [0, 1, 3, 2.5, np.float32(2.0), "tensor_float", "tensor_int"],
)
def test_prediction_is_w_plus_s_m_and_changes_nothing(steps, traced):
    optimizer, variables = _trained()
    gap = {"tensor_float": tf.constant(2.0), "tensor_int": tf.constant(4)}.get(steps, steps)
    s = float(np.asarray(gap))
    expected = [
        v.numpy() + s * optimizer.momentum_of(v).numpy() for v in variables
    ]
    before = _state(optimizer, variables)
    def predict(gap):
        return optimizer.predicted_weights(variables, gap)

    if traced:  # as the pipeline runtime does: variables captured, not passed
        predict = tf.function(predict)
    got = predict(gap)
    assert len(got) == len(variables)
    for value, want in zip(got, expected):
        np.testing.assert_allclose(np.asarray(value), want, rtol=0, atol=ATOL)
    for now, then in zip(_state(optimizer, variables), before):
        np.testing.assert_array_equal(now, then)
    assert int(optimizer.iterations) == 3


def test_prediction_repeats_m_rather_than_estimating_the_next_step():
    # With g = 0 the next real step is exactly m_next = momentum * m; the paper's rule
    # W + 1 * m repeats m itself, so the two differ by (1 - momentum) * m: this tells the
    # paper's prediction apart from an estimate of the next step.
    optimizer, variables = _trained(momentum=0.5)
    prediction = _numpy(optimizer.predicted_weights(variables, 1))
    m = [optimizer.momentum_of(v).numpy() for v in variables]
    w = _numpy(variables)
    for p, wi, mi in zip(prediction, w, m):
        np.testing.assert_allclose(p, wi + mi, rtol=0, atol=ATOL)
        assert not np.allclose(p, wi + 0.5 * mi, atol=ATOL)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_prediction_before_any_update_is_w(momentum):
    variables = _variables()
    optimizer = SpecTrainSGD(momentum=momentum)
    optimizer.build(variables)
    for value, variable in zip(optimizer.predicted_weights(variables, 3), variables):
        np.testing.assert_array_equal(np.asarray(value), variable.numpy())


def test_prediction_with_momentum_zero_repeats_the_last_step():
    variables = _variables()
    optimizer = SpecTrainSGD(learning_rate=0.1, momentum=0.0)
    grads = _grads(variables, 5)
    optimizer.apply_gradients(zip(_grads(variables, 4), variables))
    optimizer.apply_gradients(zip(grads, variables))
    for value, variable, g in zip(optimizer.predicted_weights(variables, 2), variables, grads):
        np.testing.assert_allclose(
            np.asarray(value), variable.numpy() - 2 * 0.1 * g, rtol=0, atol=ATOL
        )


@pytest.mark.parametrize(
    "steps, error, message",
    [
        (-1, ValueError, r"`steps` must be >= 0.*steps=-1"),
        (float("nan"), ValueError, r"`steps` must be >= 0"),
        ("2", TypeError, r"Python number or a scalar tensor.*steps='2'"),
        (None, TypeError, r"Python number or a scalar tensor"),
        (tf.constant([1.0, 2.0]), ValueError, r"must be a scalar.*shape \(2,\)"),
    ],
)
def test_bad_steps_raise(steps, error, message):
    optimizer, variables = _trained(steps=1)
    with pytest.raises(error, match=message):
        optimizer.predicted_weights(variables, steps)


def test_prediction_of_a_single_variable_or_an_unknown_one_raises():
    optimizer, variables = _trained(steps=1)
    with pytest.raises(TypeError, match=r"list of variables.*\[variable\]"):
        optimizer.predicted_weights(variables[0], 1)
    with pytest.raises(ValueError, match="Unknown variable"):
        optimizer.predicted_weights([keras.Variable(1.0)], 1)


# --- stages: devices and clones -----------------------------------------------------------


def _on(device, value):
    with tf.device(device):
        return keras.Variable(value)


def test_slots_live_beside_the_weights_when_built_under_their_device():
    variables = [_on("/CPU:1", np.ones((2, 2), "float32")), _on("/CPU:1", np.zeros(2, "float32"))]
    optimizer = SpecTrainSGD()
    with tf.device("/CPU:1"):
        optimizer.build(variables)
    for variable in variables:
        assert optimizer.momentum_of(variable).value.device.endswith("CPU:1")


def test_slots_live_beside_the_weights_when_built_lazily_in_a_tf_function():
    variable = _on("/CPU:2", np.ones(3, "float32"))
    optimizer = SpecTrainSGD(learning_rate=0.1)

    @tf.function
    def step(gradient):
        optimizer.apply_gradients([(gradient, variable)])

    step(tf.ones(3))
    assert optimizer.momentum_of(variable).value.device.endswith("CPU:2")
    np.testing.assert_allclose(variable.numpy(), np.full(3, 0.9), atol=ATOL)


def test_clone_for_stage_is_fresh_with_the_same_config():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5)
    optimizer = SpecTrainSGD(learning_rate=schedule, momentum=0.7, weight_decay=0.01)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    variables = _variables()
    optimizer.apply_gradients(zip(_grads(variables, 0), variables))

    clone = optimizer.clone_for_stage()
    assert type(clone) is SpecTrainSGD and clone is not optimizer
    assert clone.get_config() == optimizer.get_config()
    assert not clone.built and int(clone.iterations) == 0
    bias = keras.Variable(np.ones(2, "float32"), name="bias")
    kernel = keras.Variable(np.ones(2, "float32"), name="kernel")
    clone.apply_gradients([(np.zeros(2, "float32"), bias), (np.zeros(2, "float32"), kernel)])
    np.testing.assert_allclose(bias.numpy(), np.ones(2), atol=ATOL)  # excluded from decay
    np.testing.assert_allclose(kernel.numpy(), np.full(2, 1 - 0.01 * 0.1), atol=ATOL)
    assert int(optimizer.iterations) == 1  # the original is untouched


# --- saving -------------------------------------------------------------------------------


def test_compiled_model_with_the_optimizer_saves_and_loads(tmp_path):
    keras.utils.set_random_seed(3)
    model = _dense_model()
    model.compile(optimizer=SpecTrainSGD(learning_rate=0.05, momentum=0.8), loss="mse")
    x, y = _data("dense")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    path = tmp_path / "m.keras"
    model.save(path)

    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is SpecTrainSGD
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations)
    for original, restored in zip(model.trainable_variables, loaded.trainable_variables):
        np.testing.assert_array_equal(restored.numpy(), original.numpy())
        np.testing.assert_array_equal(
            loaded.optimizer.momentum_of(restored).numpy(),
            model.optimizer.momentum_of(original).numpy(),
        )
