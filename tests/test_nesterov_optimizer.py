"""Tests for `tf_spectrain.prediction.Nadam` and `nesterov_form` (SPECTRAIN.md 6e).

References independent of the code under test: Keras' own `Nadam` (at `momentum_decay=1.0`
the weights must be bit for bit the same) and the NumPy reference's NAdam step
(tests/spectrain_reference.py, float64), fed the same random gradients.
"""

import keras
import numpy as np
import pytest
import spectrain_reference as ref

from tf_spectrain import prediction
from tf_spectrain.schedule import modes

SHAPES = ((4, 3), (3,), (2, 5))
STEPS = 20
# Constants rounded to float32 first, so that the float64 reference computes with the
# very numbers the float32 optimizer holds (1 - 0.999 in float32 is 1.3e-5 off otherwise).
LR, B1, B2, EPS = (float(np.float32(x)) for x in (0.01, 0.9, 0.999, 1e-7))


# --- helpers ----------------------------------------------------------------------------


def _initial(seed=0):
    rng = np.random.RandomState(seed)
    return [(0.25 * rng.randn(*shape)).astype("float32") for shape in SHAPES]


def _gradients(seed=1):
    rng = np.random.RandomState(seed)
    return [[rng.randn(*shape).astype("float32") for shape in SHAPES] for _ in range(STEPS)]


def _keras_run(optimizer, initial, gradients):
    """The float32 weights after one `apply_gradients` per list of gradients."""
    variables = [keras.Variable(w) for w in initial]
    for grads in gradients:
        optimizer.apply_gradients(zip(grads, variables))
    return [np.asarray(v.numpy()) for v in variables]


def _reference_run(initial, gradients, weight_decay, momentum_decay):
    """The NumPy reference's NAdam (`_Stage.apply`, optimizer "nadam") in float64."""
    rule = ref.Rule("nadam", beta_1=B1, beta_2=B2, epsilon=EPS, momentum_decay=momentum_decay)
    stage = ref._Stage([w.astype(np.float64) for w in initial], final=True, rule=rule)
    for grads in gradients:
        stage.apply([g.astype(np.float64) for g in grads], LR, None, weight_decay)
    return stage.weights


def _assert_close(got, want):
    """Within float32 rounding of 20 steps: 1e-6, relative or (near 0) absolute."""
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


# --- Nadam --------------------------------------------------------------------------------


@pytest.mark.parametrize("weight_decay", [None, 0.05])
def test_nadam_at_momentum_decay_one_is_keras_nadam_exactly(weight_decay):
    initial, gradients = _initial(), _gradients()
    kwargs = dict(learning_rate=LR, beta_1=B1, beta_2=B2, epsilon=EPS, weight_decay=weight_decay)
    got = _keras_run(prediction.Nadam(momentum_decay=1.0, **kwargs), initial, gradients)
    want = _keras_run(keras.optimizers.Nadam(**kwargs), initial, gradients)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert _max_diff(got, initial) > 1e-2  # the steps did move the weights


@pytest.mark.parametrize("weight_decay", [None, 0.05])
def test_nadam_takes_the_reference_pytorch_schedule_steps(weight_decay):
    initial, gradients = _initial(), _gradients()
    opt = prediction.Nadam(LR, B1, B2, EPS, weight_decay=weight_decay)  # momentum_decay 0.004
    got = _keras_run(opt, initial, gradients)
    want = _reference_run(initial, gradients, weight_decay, momentum_decay=0.004)
    _assert_close(got, want)
    keras_nadam = _keras_run(keras.optimizers.Nadam(LR, B1, B2, EPS, weight_decay=weight_decay),
                             initial, gradients)
    assert _max_diff(got, keras_nadam) > 1e-4  # the schedules differ: the test can fail
    keras_like = _reference_run(initial, gradients, weight_decay, momentum_decay=1.0)
    _assert_close(keras_nadam, keras_like)  # and the reference's Keras schedule is Keras


@pytest.mark.parametrize("bad", [0, -0.5, "0.004", None, True])
def test_nadam_refuses_a_bad_momentum_decay(bad):
    with pytest.raises(ValueError, match="`momentum_decay` must be a float > 0"):
        prediction.Nadam(momentum_decay=bad)


def test_nadam_config_round_trip():
    opt = prediction.Nadam(2e-3, beta_1=0.8, weight_decay=0.01, clipnorm=1.0,
                           momentum_decay=0.5, name="stage_nadam")
    config = opt.get_config()
    assert config["momentum_decay"] == 0.5
    for clone in (prediction.Nadam.from_config(config),
                  keras.saving.deserialize_keras_object(
                      keras.saving.serialize_keras_object(opt))):
        assert type(clone) is prediction.Nadam
        assert clone.get_config() == config


# --- nesterov_form --------------------------------------------------------------------------


@pytest.mark.parametrize("num_stages", [1, 2, 4])
@pytest.mark.parametrize("make, base_name, want_type", [
    (lambda: keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3),
     "momentum", keras.optimizers.SGD),
    (lambda: keras.optimizers.AdamW(3e-3, beta_1=0.9, weight_decay=1e-2),
     "beta_1", prediction.Nadam),
])
def test_nesterov_form_table(make, base_name, want_type, num_stages):
    for k in range(num_stages):
        given = make()
        form = prediction.nesterov_form(given, k, num_stages)
        assert type(form) is want_type
        assert getattr(form, base_name) == modes.nesterov_coefficient(0.9, k, num_stages)
        assert getattr(given, base_name) == 0.9  # the input is not changed
        if want_type is keras.optimizers.SGD:
            assert form.nesterov
        else:
            assert form.momentum_decay == 0.004  # the paper's, for AdamW
            assert (form.beta_2, form.epsilon) == (given.beta_2, given.epsilon)
        assert form.weight_decay == given.weight_decay
        assert not form.built and form is not given
        form.learning_rate = 0.5
        assert float(given.learning_rate) != 0.5  # independent
    assert getattr(prediction.nesterov_form(make(), num_stages - 1, num_stages),
                   base_name) == 0.9  # the last stage keeps the base


def test_nesterov_form_keeps_schedule_settings_and_exclusions():
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, 10, 0.5)
    given = keras.optimizers.Adam(schedule, beta_2=0.99, epsilon=1e-6, clipnorm=2.0,
                                  gradient_accumulation_steps=2, weight_decay=0.01,
                                  name="mine")
    given.exclude_from_weight_decay(var_names=["bias"])
    form = prediction.nesterov_form(given, 0, 3)
    assert form._learning_rate is schedule
    config, want = form.get_config(), given.get_config()
    for key in ("beta_2", "epsilon", "clipnorm", "gradient_accumulation_steps",
                "weight_decay", "name"):
        assert config[key] == want[key], key
    assert form._exclude_from_weight_decay_pattern == given._exclude_from_weight_decay_pattern
    assert form.momentum_decay == 0.004


@pytest.mark.parametrize("given, momentum_decay", [
    (keras.optimizers.Nadam(beta_1=0.9), 1.0),  # Keras' own schedule, kept
    (prediction.Nadam(beta_1=0.9, momentum_decay=0.25), 0.25),
])
def test_nesterov_form_of_nadam_keeps_its_schedule(given, momentum_decay):
    form = prediction.nesterov_form(given, 0, 2)
    assert type(form) is prediction.Nadam
    assert form.momentum_decay == momentum_decay
    assert form.beta_1 == modes.nesterov_coefficient(0.9, 0, 2)


@pytest.mark.parametrize("wrap", [
    lambda: prediction.SpecTrain(keras.optimizers.SGD(0.1, momentum=0.9)),
    lambda: prediction.SpecTrainSGD(0.1, momentum=0.9),
])
def test_nesterov_form_unwraps_spectrain(wrap):
    form = prediction.nesterov_form(wrap(), 0, 2)
    assert type(form) is keras.optimizers.SGD and form.nesterov
    assert form.momentum == modes.nesterov_coefficient(0.9, 0, 2)


class _MySGD(keras.optimizers.SGD):
    pass


@pytest.mark.parametrize("given, name", [
    (keras.optimizers.RMSprop(), "RMSprop"),
    (keras.optimizers.Adam(amsgrad=True), "Adam with amsgrad=True"),
    (keras.optimizers.Adagrad(), "Adagrad"),
    (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), "LossScaleOptimizer"),
    (_MySGD(), "_MySGD"),
])
def test_other_optimizers_are_refused_by_name(given, name):
    for check in (prediction.check_nesterov_optimizer,
                  lambda opt: prediction.nesterov_form(opt, 0, 2)):
        with pytest.raises(ValueError, match=f"mode 'nesterov' takes SGD, Adam, AdamW or "
                                             f"Nadam.*Received: optimizer={name}$"):
            check(given)


def test_a_callable_beta_1_is_refused():
    with pytest.raises(ValueError, match="`beta_1`"):
        prediction.check_nesterov_optimizer(keras.optimizers.Adam(beta_1=lambda: 0.9))
