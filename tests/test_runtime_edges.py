"""Adversarial cases of the runtime (written as issue 13's review): the learning-rate board,
the feed/begin gate, global clipping, on_nan="skip" in the update's graph, loss scaling,
and the forward-only pipeline.

Every fit runs in a thread joined with a timeout, so a hang fails the test instead of
hanging the suite.

At the review (HEAD 9b2419a) these failed, each proving a bug since fixed:
- test_updates_counts_applied_updates_across_fits_with_different_on_nan
- test_global_clipnorm_of_a_float64_model_with_a_huge_gradient_equals_keras
- test_global_clipnorm_of_a_float64_model_equals_keras_to_float64_precision
- test_sync_with_a_loss_scale_factor_equals_keras (no_clip: already before the change)
- test_run_forward_with_a_window_of_0_refuses_instead_of_hanging
"""

import functools
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_keras_knobs as knobs
from step_helpers import rel_error
from test_keras_knobs import problem  # noqa: F401 - the fixture
from test_pipeline_modes import ATOL, EPOCHS, NUM_BATCHES
from test_pipeline_modes import MODES as REF_MODES

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

FIT_TIMEOUT = 60.0
BATCH = 4
N = 32  # 8 mini-batches of 4
MODES = ["sync", "vanilla", "stash", "spectrain"]


def _mlp(seed=0, layers=(6, 8, 8, 8, 3), activation="tanh"):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((layers[0],))
    h = inputs
    for n, width in enumerate(layers[1:]):
        last = n == len(layers) - 2
        h = keras.layers.Dense(width, activation=None if last else activation,
                               name=f"dense{n}")(h)
    return keras.Model(inputs, h)


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def _pipe(mode="stash", num_stages=3, micro_batches=1, optimizer=None, model=None):
    model = model or _mlp()
    cuts = {1: [], 2: ["dense1"], 3: ["dense0", "dense1"], 4: ["dense0", "dense1", "dense2"]}
    pipe = PipelineModel(model, cuts=cuts[num_stages],
                         devices=[f"/CPU:{k}" for k in range(num_stages)], mode=mode,
                         micro_batches=micro_batches)
    pipe.compile(optimizer=optimizer or SpecTrainSGD(0.05, momentum=0.9),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return pipe, model


def _fit_in_thread(pipe, *args, timeout=FIT_TIMEOUT, **kwargs):
    """Runs `pipe.fit` in a thread; fails the test if it does not end within `timeout`."""
    out = {}

    def target():
        try:
            out["history"] = pipe.fit(*args, **kwargs)
        except BaseException as error:  # re-raised in the test's thread
            out["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "fit hung"
    if "error" in out:
        raise out["error"]
    return out["history"]


class _Order(keras.callbacks.Callback):
    """Records batch begins and ends; may stop or raise at a chosen point."""

    def __init__(self, stop_at_end=None, stop_at_begin=None, raise_at_begin=None,
                 sleep=0.0):
        super().__init__()
        self.events = []
        self.stop_at_end, self.stop_at_begin = stop_at_end, stop_at_begin
        self.raise_at_begin, self.sleep = raise_at_begin, sleep

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch", epoch))

    def on_train_batch_begin(self, batch, logs=None):
        self.events.append(("begin", batch))
        if batch == self.raise_at_begin:
            raise KeyError(f"begin {batch} failed")
        if batch == self.stop_at_begin:
            self.model.stop_training = True
        time.sleep(self.sleep)

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("end", batch))
        if batch == self.stop_at_end:
            self.model.stop_training = True


def _check_keras_order(events, fed):
    """One epoch's events: begin 0, end 0, begin 1, ... end fed-1, nothing else."""
    batch_events = [e for e in events if e[0] != "epoch"]
    expected = [(kind, i) for i in range(fed) for kind in ("begin", "end")]
    assert batch_events == expected


def _iterations(pipe):
    return [int(r.optimizer.iterations.numpy()) for r in pipe.runners]


# --- 1. the feed/begin gate and the learning-rate board ------------------------------------


@pytest.mark.parametrize("mode, stop", [
    # sync and spectrain (the two schedules, sync_ops and async_ops) with both kinds of
    # stop; vanilla and stash (async_ops too, other passes) with one each
    ("sync", ("end", 2)), ("sync", ("begin", 0)), ("spectrain", ("end", 2)),
    ("spectrain", ("begin", 0)), ("vanilla", ("end", 2)), ("stash", ("begin", 0)),
])
def test_stop_from_a_callback_keeps_keras_order_and_every_fed_batch_updates(mode, stop):
    pipe, _ = _pipe(mode)
    kind, at = stop
    order = _Order(stop_at_end=at if kind == "end" else None,
                   stop_at_begin=at if kind == "begin" else None)
    x, y = _data()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                   callbacks=[order])
    fed = pipe.progress.epoch_progress[1]
    assert pipe.progress.epoch_progress[0] == 0  # stopped in the first epoch
    assert at + 1 <= fed <= 8
    _check_keras_order(order.events, fed)
    assert _iterations(pipe) == [fed] * 3


@pytest.mark.parametrize("mode, micro_batches", [("spectrain", 1)])
def test_stop_from_another_thread_at_random_times_never_hangs_or_loses_a_begin(
    mode, micro_batches
):
    # One pipeline for the three trials (a fresh one costs its tracing): the first stop
    # lands while a fresh pipeline starts (traces), the others in a traced one's epoch.
    x, y = _data(64)
    rng = np.random.default_rng(1)
    pipe, _ = _pipe(mode, micro_batches=micro_batches)
    applied = 0
    for trial in range(3):
        order = _Order(sleep=0.002)
        delay = float(rng.uniform(0.0, 0.15))
        timer = threading.Timer(delay, pipe.request_stop)
        timer.start()
        _fit_in_thread(pipe, x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                       callbacks=[order])
        timer.join()
        fed = pipe.progress.epoch_progress[1]
        _check_keras_order(order.events, fed)
        applied += fed
        assert _iterations(pipe) == [applied] * 3, (trial, delay)


def test_stop_set_in_on_epoch_begin_runs_exactly_one_batch_as_keras():
    class StopAtEpochBegin(_Order):
        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            self.model.stop_training = True

    pipe, _ = _pipe("stash")
    order = StopAtEpochBegin()
    x, y = _data()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                   callbacks=[order])
    keras_model = _mlp()
    keras_model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    keras_order = StopAtEpochBegin()
    keras_model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                    callbacks=[keras_order])
    assert order.events == keras_order.events
    assert _iterations(pipe) == [1, 1, 1]


@pytest.mark.parametrize("mode, at", [("sync", 0), ("spectrain", 1), ("sync", 5)])
def test_an_error_in_on_train_batch_begin_ends_fit_with_that_error(mode, at):
    pipe, _ = _pipe(mode)
    order = _Order(raise_at_begin=at)
    x, y = _data()
    with pytest.raises(KeyError, match=f"begin {at} failed"):
        _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                       callbacks=[order])
    assert order.events[-1] == ("begin", at)
    assert not [t for t in threading.enumerate() if t.name.startswith("stage-")]
    # The pipeline is usable afterwards.
    history = _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False,
                             verbose=0)
    assert np.isfinite(history.history["loss"][-1])


@pytest.mark.parametrize("mode", MODES)
def test_steps_per_epoch_with_a_repeated_dataset_and_stop(mode):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    pipe, _ = _pipe(mode)
    order = _Order(stop_at_end=4)
    _fit_in_thread(pipe, ds, epochs=3, steps_per_epoch=6, verbose=0, callbacks=[order])
    fed = pipe.progress.epoch_progress[1]
    _check_keras_order(order.events, fed)
    assert _iterations(pipe) == [fed] * 3


# --- 2. forward_pipeline: evaluate / predict against Keras -------------------------------


def _eval_pipe(num_stages, model=None):
    pipe, model = _pipe("sync", num_stages=num_stages, model=model)
    pipe.compile(optimizer=SpecTrainSGD(0.05, momentum=0.9),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 metrics=["accuracy"])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return pipe, model


def _close(got, expected):
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("num_stages, batch_size", [(1, 5), (2, 32), (4, 64)])  # short
# last batch; exactly one batch; one short batch
def test_evaluate_and_predict_equal_keras_for_1_2_and_4_stages(num_stages, batch_size):
    pipe, model = _eval_pipe(num_stages)
    x, y = _data()
    _close(pipe.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
           model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True))
    np.testing.assert_allclose(pipe.predict(x, batch_size=batch_size),
                               model.predict(x, batch_size=batch_size, verbose=0), atol=1e-6)


def test_evaluate_and_predict_of_a_dataset_of_one_batch():
    pipe, model = _eval_pipe(3)
    x, y = _data(7)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    _close(pipe.evaluate(ds, verbose=0, return_dict=True),
           model.evaluate(ds, verbose=0, return_dict=True))
    np.testing.assert_allclose(pipe.predict(ds), model.predict(ds, verbose=0), atol=1e-6)


def test_predict_of_an_empty_dataset_raises_and_leaves_no_thread():
    pipe, _ = _eval_pipe(3)
    x, _ = _data()
    ds = tf.data.Dataset.from_tensor_slices(x).batch(4).take(0)
    with pytest.raises(ValueError, match="empty"):
        pipe.predict(ds)
    assert not [t for t in threading.enumerate() if t.name.startswith("infer-")]


def test_evaluate_with_a_sample_weighted_dataset_equals_keras_or_refuses():
    pipe, model = _eval_pipe(3)
    x, y = _data()
    w = np.linspace(0.0, 2.0, N).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(5)
    expected = model.evaluate(ds, verbose=0, return_dict=True)
    unweighted = model.evaluate(x, y, batch_size=5, verbose=0, return_dict=True)
    assert abs(expected["loss"] - unweighted["loss"]) > 1e-3  # the weights matter
    try:
        got = pipe.evaluate(ds, verbose=0, return_dict=True)
    except (ValueError, TypeError) as error:
        assert "weight" in str(error)  # a refusal must say why
    else:
        _close(got, expected)


def test_predict_of_a_sample_weighted_dataset_uses_x():
    pipe, model = _eval_pipe(2)
    x, y = _data()
    w = np.ones(N, "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(5)
    np.testing.assert_allclose(pipe.predict(ds), model.predict(ds, verbose=0), atol=1e-6)


def _two_input_model():
    keras.utils.set_random_seed(4)
    a = keras.Input((6,), name="a")
    b = keras.Input((2,), name="b")
    h = keras.layers.Dense(8, activation="tanh", name="dense0")(a)
    h = keras.layers.Concatenate(name="join")([h, b])
    h = keras.layers.Dense(8, activation="tanh", name="dense1")(h)
    outputs = keras.layers.Dense(3, name="dense2")(h)
    return keras.Model({"a": a, "b": b}, outputs)


def _two_input_pipe():
    model = _two_input_model()
    pipe = PipelineModel(model, cuts=["dense0", "dense1"],
                         devices=["/CPU:0", "/CPU:1", "/CPU:2"], mode="sync")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    pipe.compile(optimizer=SpecTrainSGD(0.05, momentum=0.9), loss=loss, metrics=["accuracy"])
    model.compile(loss=loss, metrics=["accuracy"])
    return pipe, model


def test_dict_inputs_of_a_two_input_model_evaluate_and_predict_as_keras():
    pipe, model = _two_input_pipe()
    x, y = _data()
    inputs = {"a": x, "b": x[:, :2] * 3.0}
    _close(pipe.evaluate(inputs, y, batch_size=5, verbose=0, return_dict=True),
           model.evaluate(inputs, y, batch_size=5, verbose=0, return_dict=True))
    np.testing.assert_allclose(pipe.predict(inputs, batch_size=5),
                               model.predict(inputs, batch_size=5, verbose=0), atol=1e-6)
    ds = tf.data.Dataset.from_tensor_slices((inputs, y)).batch(5)
    _close(pipe.evaluate(ds, verbose=0, return_dict=True),
           model.evaluate(ds, verbose=0, return_dict=True))
    np.testing.assert_allclose(pipe.predict(ds), model.predict(ds, verbose=0), atol=1e-6)
    only_x = tf.data.Dataset.from_tensor_slices(inputs).batch(5)
    np.testing.assert_allclose(pipe.predict(only_x), model.predict(only_x, verbose=0),
                               atol=1e-6)


def test_a_generator_dataset_stopped_by_a_failing_stage_is_closed():
    pipe, _ = _eval_pipe(3)
    x, y = _data()
    closed = []

    def batches():
        try:
            for i in range(1000):
                yield x[:4] if i != 3 else x[:4, :5]  # batch 3 has a bad shape
        finally:
            closed.append(True)

    ds = tf.data.Dataset.from_generator(
        batches, output_signature=tf.TensorSpec((None, None), tf.float32))
    started = time.perf_counter()
    with pytest.raises(Exception) as info:  # noqa: B017 - whatever the stage raises
        pipe.predict(ds)
    assert time.perf_counter() - started < 10
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "stage 0 on /CPU:0" in notes and "batch 3" in notes, notes
    assert not [t for t in threading.enumerate() if t.name.startswith("infer-")]


def test_validation_data_as_a_dataset_equals_keras_evaluate():
    pipe, model = _eval_pipe(3)
    x, y = _data()
    val = tf.data.Dataset.from_tensor_slices((x[:11], y[:11])).batch(4)
    history = _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False,
                             verbose=0, validation_data=val)
    expected = model.evaluate(val, verbose=0, return_dict=True)
    _close({k[4:]: v[-1] for k, v in history.history.items() if k.startswith("val_")},
           expected)


# --- 3. stage.update: on_nan="skip" in the update's graph ------------------------------------

POISONED = 3


def _sqrt_bomb_mlp(seed=0):
    """dense0, bomb | dense1 | dense2: `bomb` is finite forward, NaN backward on poison.

    For a poisoned mini-batch (huge inputs) `bomb` outputs sqrt(0 * t) = 0, whose gradient
    is inf * 0 = NaN: only stage 0's gradient is not finite; the loss and every other
    stage's gradient stay finite.
    """
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="dense0")(inputs)
    h = keras.layers.Lambda(
        lambda t: tf.where(tf.reduce_max(tf.abs(t)) > 0.999999, tf.sqrt(t * 0.0), t),
        name="bomb")(h)
    h = keras.layers.Dense(8, activation="tanh", name="dense1")(h)
    outputs = keras.layers.Dense(3, name="dense2")(h)
    return keras.Model(inputs, outputs)


def _poisoned_data():
    x, y = _data()
    x[POISONED * BATCH:(POISONED + 1) * BATCH] = 1e6
    return x, y


def _bomb_pipe(mode="sync", optimizer=None, micro_batches=1):
    model = _sqrt_bomb_mlp()
    pipe = PipelineModel(model, cuts=["bomb", "dense1"], devices=["/CPU:0", "/CPU:1", "/CPU:2"],
                         mode=mode, micro_batches=micro_batches)
    pipe.compile(optimizer=optimizer or keras.optimizers.SGD(0.1, momentum=0.9),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return pipe, model


def _keras_without_the_poisoned_batch(optimizer, epochs=1):
    x, y = _poisoned_data()
    keep = np.ones(N, bool)
    keep[POISONED * BATCH:(POISONED + 1) * BATCH] = False
    model = _sqrt_bomb_mlp()
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[keep], y[keep], batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


def _max_diff(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def test_the_bomb_model_really_gives_a_non_finite_gradient_on_stage_0_only():
    pipe, _ = _bomb_pipe()
    x, y = _poisoned_data()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                   on_nan="skip")
    assert [r.skipped for r in pipe.runners] == [1, 0, 0]
    assert [r.updates for r in pipe.runners] == [7, 8, 8]
    assert _iterations(pipe) == [7, 8, 8]
    assert pipe.batches_skipped == 0  # the loss was finite


@pytest.mark.parametrize("make_optimizer, micro_batches", [
    # each optimizer once, and whole mini-batches and accumulated micro-batches once each
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=0.05), 1),
    (lambda: SpecTrainSGD(0.1, momentum=0.9, global_clipnorm=0.05), 2),
], ids=["keras_sgd-1", "spectrain_sgd-2"])
def test_skip_with_global_clipnorm_skips_every_stage_as_if_the_batch_was_not_there(
    make_optimizer, micro_batches
):
    pipe, model = _bomb_pipe(optimizer=make_optimizer(), micro_batches=micro_batches)
    x, y = _poisoned_data()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                   on_nan="skip")
    assert [r.skipped for r in pipe.runners] == [1, 1, 1]
    assert [r.updates for r in pipe.runners] == [7, 7, 7]
    assert _iterations(pipe) == [7, 7, 7]
    expected = _keras_without_the_poisoned_batch(
        keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=0.05))
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    assert _max_diff(model.get_weights(), expected) < 1e-5


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: SpecTrainSGD(0.1, momentum=0.9),
])
def test_a_skipped_update_changes_no_weight_momentum_or_iteration_and_the_next_is_exact(
    make_optimizer
):
    pipe, _ = _bomb_pipe(optimizer=make_optimizer())
    runner = pipe.runners[1]
    runner.skip_non_finite = True
    variables = runner.trainable
    shapes = [tuple(v.shape) for v in variables]
    rng = np.random.default_rng(2)
    first = [rng.normal(size=s).astype("float32") for s in shapes]
    runner.updater.gradient = [tf.constant(g) for g in first]
    runner.update()
    w1 = [v.numpy().copy() for v in variables]
    momenta = [runner.optimizer.momentums[runner.optimizer._get_variable_index(v)].numpy()  # noqa: SLF001
               for v in variables]
    bad = [g.copy() for g in first]
    bad[0][0, 0] = np.nan
    runner.updater.gradient = [tf.constant(g) for g in bad]
    runner.update()
    assert runner.skipped == 1 and runner.updates == 1
    assert int(runner.optimizer.iterations.numpy()) == 1
    assert _max_diff([v.numpy() for v in variables], w1) == 0.0
    now = [runner.optimizer.momentums[runner.optimizer._get_variable_index(v)].numpy()  # noqa: SLF001
           for v in variables]
    assert _max_diff(now, momenta) == 0.0
    second = [rng.normal(size=s).astype("float32") for s in shapes]
    runner.updater.gradient = [tf.constant(g) for g in second]
    runner.update(learning_rate=0.05)
    # Keras' SGD: m = 0.9 m - lr g; w = w + m (the skipped gradient left no trace).
    expected = [w + (0.9 * m - 0.05 * g) for w, m, g in zip(w1, momenta, second)]
    assert _max_diff([v.numpy() for v in variables], expected) < 1e-6
    assert runner.updates == 2 and int(runner.optimizer.iterations.numpy()) == 2


def test_updates_counts_applied_updates_across_fits_with_different_on_nan():
    pipe, _ = _bomb_pipe()
    x, y = _poisoned_data()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                   on_nan="skip")
    assert pipe.runners[0].updates == 7
    clean_x, clean_y = _data()
    _fit_in_thread(pipe, clean_x, clean_y, batch_size=BATCH, epochs=1, shuffle=False,
                   verbose=0, on_nan="stop")
    # 7 + 8 updates applied on stage 0, as its optimizer counted.
    assert _iterations(pipe)[0] == 15
    assert pipe.runners[0].updates == 15


# --- 4. learning rates (SPECTRAIN.md section 6) ------------------------------------------


class _RateLog(keras.callbacks.Callback):
    """Records the learning rate each mini-batch will use (read after every other callback)."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate))


def _plateau():
    return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                             min_delta=1e9, verbose=0)


def _scheduler():
    return keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.7 ** epoch)


_KERAS_RATES = {}


def _keras_rates(params, batches, make_callback):
    """Keras' fit with `make_callback()`: (weights, the rate of each mini-batch), computed
    once per callback for the cases that share it."""
    if make_callback not in _KERAS_RATES:
        keras_log = _RateLog()
        weights = knobs._keras_fit(params, batches, [make_callback(), keras_log])
        _KERAS_RATES[make_callback] = (weights, keras_log.rates)
    return _KERAS_RATES[make_callback]


# Every mode once, each callback in turn: ReduceLROnPlateau sets the rate in on_epoch_end,
# LearningRateScheduler in on_epoch_begin, both between epochs, when every stage has
# applied all of the epoch's updates, so the mode does not meet the callback's timing.
@pytest.mark.parametrize(
    "mode, target, make_callback",
    [(mode, target, [_plateau, _scheduler][n % 2]) for n, (mode, target) in enumerate(REF_MODES)],
    ids=[f"{mode}-{target}-{['plateau', 'scheduler'][n % 2]}"
         for n, (mode, target) in enumerate(REF_MODES)],
)
def test_epoch_level_rate_callbacks_reach_every_stage_as_keras_sets_them(
    problem, mode, target, make_callback  # noqa: F811
):
    params, batches = problem
    expected_keras, rates = _keras_rates(params, batches, make_callback)
    assert len(rates) == EPOCHS * NUM_BATCHES and len(set(rates)) > 1  # the rate changes
    pipe, model = knobs._pipe(params, mode, target)
    pipe_log = _RateLog()
    _fit_in_thread(pipe, *knobs._arrays(batches), batch_size=knobs.BATCH, epochs=EPOCHS,
                   shuffle=False, verbose=0, callbacks=[make_callback(), pipe_log])
    assert pipe_log.rates == pytest.approx(rates)
    expected = knobs._reference(problem, mode, target, lr=lambda step: rates[step])
    assert knobs.max_diff(model.get_weights(), expected) < ATOL
    if mode == "sync":
        w0 = knobs.keras_mlp(params).get_weights()
        assert rel_error(model.get_weights(), expected_keras, w0) < 1e-5
    # Every stage applied the last mini-batch at its rate (the last stage's optimizer may
    # have been changed again by on_epoch_end since: it is `model.optimizer`).
    assert all(float(r.optimizer.learning_rate) == pytest.approx(rates[-1])
               for r in pipe.runners[:-1])


@pytest.mark.parametrize("mode, target", REF_MODES)
def test_a_learning_rate_schedule_in_every_mode_uses_schedule_of_the_step(
    problem, mode, target, tmp_path  # noqa: F811
):
    params, batches = problem

    def schedule():
        return keras.optimizers.schedules.ExponentialDecay(knobs.LR, decay_steps=1,
                                                           decay_rate=0.8)

    pipe, model = knobs._pipe(params, mode, target, learning_rate=schedule())
    # The stash case also logs to TensorBoard (test_tensorboard_logs_the_learning_rates_
    # keras_logs, which checks the batch-callback rates the same way).
    board = [keras.callbacks.TensorBoard(tmp_path / "pipe")] if mode == "stash" else []
    _fit_in_thread(pipe, *knobs._arrays(batches), batch_size=knobs.BATCH, epochs=EPOCHS,
                   shuffle=False, verbose=0, callbacks=board)
    expected = knobs._reference(problem, mode, target,
                                lr=lambda step: knobs.LR * 0.8 ** step)
    assert knobs.max_diff(model.get_weights(), expected) < ATOL
    if mode == "sync":  # and sync equals plain Keras `fit` with the same schedule
        w0 = knobs.keras_mlp(params).get_weights()
        keras_weights = knobs._keras_fit(params, batches, learning_rate=schedule())
        assert rel_error(model.get_weights(), keras_weights, w0) < 1e-5
        # the schedule matters
        assert rel_error(knobs._keras_fit(params, batches), keras_weights, w0) > 1e-2
    if board:
        keras_dir = tmp_path / "keras"
        knobs._keras_fit(params, batches, [keras.callbacks.TensorBoard(keras_dir)],
                         learning_rate=schedule())
        logged = _logged_rates(keras_dir)
        assert len(logged) == EPOCHS and len(set(logged)) > 1
        assert _logged_rates(tmp_path / "pipe") == pytest.approx(logged, rel=1e-6)


def _logged_rates(logdir):
    values = {}
    for path in sorted((logdir / "train").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "epoch_learning_rate":
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return [values[k] for k in sorted(values)]


# A schedule's rates logged to TensorBoard: in the stash case of
# test_a_learning_rate_schedule_in_every_mode_uses_schedule_of_the_step.
@pytest.mark.parametrize("kind", ["batch_callback"])
def test_tensorboard_logs_the_learning_rates_keras_logs(problem, tmp_path, kind):  # noqa: F811
    params, batches = problem
    options, callbacks = {}, []
    if kind == "schedule":
        options["learning_rate"] = keras.optimizers.schedules.ExponentialDecay(
            knobs.LR, decay_steps=1, decay_rate=0.8)
    else:
        callbacks = [knobs._BatchRate(knobs._warmup, NUM_BATCHES)]
    keras_dir, pipe_dir = tmp_path / "keras", tmp_path / "pipe"
    knobs._keras_fit(params, batches, callbacks + [keras.callbacks.TensorBoard(keras_dir)],
                     **options)
    pipe, _ = knobs._pipe(params, "stash", "paper", **options)
    _fit_in_thread(pipe, *knobs._arrays(batches), batch_size=knobs.BATCH, epochs=EPOCHS,
                   shuffle=False, verbose=0,
                   callbacks=callbacks + [keras.callbacks.TensorBoard(pipe_dir)])
    expected = _logged_rates(keras_dir)
    assert len(expected) == EPOCHS and len(set(expected)) > 1
    assert _logged_rates(pipe_dir) == pytest.approx(expected, rel=1e-6)


# --- more of the gate: request_stop calls, data running out, errors at batch end ----------


class _PipeStopper(_Order):
    """Calls `pipeline.request_stop()` itself at a batch begin (a `set_pipeline` callback)."""

    def __init__(self, at):
        super().__init__()
        self.at, self.pipeline = at, None

    def set_pipeline(self, pipeline):
        self.pipeline = pipeline

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if batch == self.at:
            self.pipeline.request_stop()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("at", [2])
def test_request_stop_called_in_on_train_batch_begin(mode, at):
    pipe, _ = _pipe(mode)
    order = _PipeStopper(at)
    x, y = _data()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                   callbacks=[order])
    fed = pipe.progress.epoch_progress[1]
    assert fed >= at + 1
    if mode == "sync":
        assert fed == at + 1  # nothing else was begun, so nothing else was fed
    _check_keras_order(order.events, fed)
    assert _iterations(pipe) == [fed] * 3


def test_request_stop_before_fit_does_not_stop_it_as_in_keras():
    pipe, _ = _pipe("stash")
    pipe.request_stop()
    x, y = _data()
    order = _Order()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                   callbacks=[order])
    _check_keras_order(order.events, 8)


@pytest.mark.parametrize("mode", ["sync", "spectrain"])
def test_data_running_out_with_steps_per_epoch_raises_without_a_hang(mode):
    x, y = _data()
    # 8 batches, no repeat, of unknown length (so only the run can find out).
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).filter(lambda a, b: True)
    pipe, _ = _pipe(mode)
    order = _Order()
    with pytest.raises(ValueError, match="ran out"):
        _fit_in_thread(pipe, ds, epochs=2, steps_per_epoch=5, verbose=0, callbacks=[order])
    events = [e for e in order.events if e[0] != "epoch"]
    begins = [e for e in events if e[0] == "begin"]
    ends = [e for e in events if e[0] == "end"]
    assert len(begins) - len(ends) in (0, 1)
    assert not [t for t in threading.enumerate() if t.name.startswith("stage-")]


@pytest.mark.parametrize("mode", ["sync", "vanilla"])
def test_an_error_in_on_train_batch_end_ends_fit(mode):
    class FailAtEnd(_Order):
        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            if batch == 3:
                raise KeyError("end 3 failed")

    pipe, _ = _pipe(mode)
    order = FailAtEnd()
    x, y = _data()
    with pytest.raises(KeyError, match="end 3 failed"):
        _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                       callbacks=[order])
    _check_keras_order(order.events, 4)


def _padded_mlp(seed=0):
    """dense0 | pad (no weights) | dense1, dense2: a weightless middle stage."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="dense0")(inputs)
    h = keras.layers.Activation("tanh", name="pad")(h)
    h = keras.layers.Dense(8, activation="tanh", name="dense1")(h)
    outputs = keras.layers.Dense(3, name="dense2")(h)
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_global_clipnorm_with_a_weightless_stage_equals_keras(micro_batches):
    make = lambda: keras.optimizers.SGD(0.2, momentum=0.9, global_clipnorm=0.05)  # noqa: E731
    model = _padded_mlp()
    pipe = PipelineModel(model, cuts=["dense0", "pad"], devices=["/CPU:0", "/CPU:1", "/CPU:2"],
                         mode="sync", micro_batches=micro_batches)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    pipe.compile(optimizer=make(), loss=loss)
    assert not pipe.runners[1].trainable
    x, y = _data()
    order = _Order(stop_at_end=5)
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                   callbacks=[order])
    fed = pipe.progress.epoch_progress[1]
    assert fed in (6, 7)  # sync: at most one more mini-batch was in flight
    keras_model = _padded_mlp()
    keras_model.compile(optimizer=make(), loss=loss)
    keras_model.fit(x[:fed * BATCH], y[:fed * BATCH], batch_size=BATCH, epochs=1,
                    shuffle=False, verbose=0)
    w0 = _padded_mlp().get_weights()
    assert rel_error(model.get_weights(), keras_model.get_weights(), w0) < 1e-5
    unclipped = _padded_mlp()
    unclipped.compile(optimizer=keras.optimizers.SGD(0.2, momentum=0.9), loss=loss)
    unclipped.fit(x[:fed * BATCH], y[:fed * BATCH], batch_size=BATCH, epochs=1,
                  shuffle=False, verbose=0)
    assert rel_error(unclipped.get_weights(), keras_model.get_weights(), w0) > 1e-2


def test_skip_with_adam_leaves_weights_slots_and_iterations_alone():
    pipe, _ = _bomb_pipe(optimizer=keras.optimizers.Adam(0.01))
    x, y = _poisoned_data()
    before = [r.optimizer.iterations.numpy() for r in pipe.runners]
    assert before == [0, 0, 0]
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                   on_nan="skip")
    assert [r.skipped for r in pipe.runners] == [1, 0, 0]
    assert _iterations(pipe) == [7, 8, 8]
    assert all(np.all(np.isfinite(v.numpy())) for r in pipe.runners
               for v in r.optimizer.variables)


@pytest.fixture
def float64():
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def test_global_clipnorm_of_a_float64_model_with_a_huge_gradient_equals_keras(float64):
    # The gradient's norm (~1e21) is finite in float64, where Keras computes it, but its
    # square overflows float32: clipping is exactly what such a gradient needs.
    make = lambda: keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=1.0)  # noqa: E731
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data(8)
    x = x.astype("float64") * 1e20
    keras_model = _mlp(activation=None)
    keras_model.compile(optimizer=make(), loss=loss)
    keras_model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    expected = keras_model.get_weights()
    assert all(np.all(np.isfinite(w)) for w in expected)
    model = _mlp(activation=None)
    pipe = PipelineModel(model, cuts=["dense0", "dense1"],
                         devices=["/CPU:0", "/CPU:1", "/CPU:2"], mode="sync")
    pipe.compile(optimizer=make(), loss=loss)
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    got = model.get_weights()
    assert all(np.all(np.isfinite(w)) for w in got), "the clipped update made NaN weights"
    w0 = _mlp(activation=None).get_weights()
    assert rel_error(got, expected, w0) < 1e-6


def test_global_clipnorm_of_a_float64_model_equals_keras_to_float64_precision(float64):
    # Sync mode equals Keras to 1e-16-ish in float64 (test_float64.py); with
    # global_clipnorm the clipping scale must be computed in float64 too, as Keras does.
    make = lambda: keras.optimizers.SGD(0.3, momentum=0.9, global_clipnorm=0.05)  # noqa: E731
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data()
    x = x.astype("float64")
    keras_model = _mlp()
    keras_model.compile(optimizer=make(), loss=loss)
    keras_model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = _mlp()
    pipe = PipelineModel(model, cuts=["dense0", "dense1"],
                         devices=["/CPU:0", "/CPU:1", "/CPU:2"], mode="sync")
    pipe.compile(optimizer=make(), loss=loss)
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    w0 = _mlp().get_weights()
    unclipped = _keras_float64_unclipped()
    assert rel_error(unclipped, keras_model.get_weights(), w0) > 1e-2  # clips
    assert rel_error(model.get_weights(), keras_model.get_weights(), w0) < 1e-10


_FLOAT64_UNCLIPPED = []


def _keras_float64_unclipped():
    """Keras' float64 fit of `_mlp()` with SGD(0.3, momentum=0.9), no clipping: the "it
    clips" contrast above and the control's reference below (computed once, under the
    `float64` fixture of the test that asks first)."""
    if not _FLOAT64_UNCLIPPED:
        x, y = _data()
        keras_model = _mlp()
        assert keras_model.weights[0].dtype == "float64"
        keras_model.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.9),
                            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        keras_model.fit(x.astype("float64"), y, batch_size=BATCH, epochs=2, shuffle=False,
                        verbose=0)
        _FLOAT64_UNCLIPPED.append(keras_model.get_weights())
    return _FLOAT64_UNCLIPPED[0]


def test_control_a_float64_sync_pipeline_without_clipping_equals_keras_to_1e_10(float64):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data()
    x = x.astype("float64")
    expected = _keras_float64_unclipped()
    model = _mlp()
    pipe = PipelineModel(model, cuts=["dense0", "dense1"],
                         devices=["/CPU:0", "/CPU:1", "/CPU:2"], mode="sync")
    pipe.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.9), loss=loss)
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert rel_error(model.get_weights(), expected, _mlp().get_weights()) < 1e-10


@pytest.mark.parametrize("clip", [{}, {"global_clipnorm": 0.05}], ids=["no_clip", "global"])
def test_sync_with_a_loss_scale_factor_equals_keras(clip):
    # Keras' train_step multiplies the loss by `loss_scale_factor` (optimizer.scale_loss)
    # and `apply_gradients` divides the gradients by it again: the factor changes nothing.
    make = lambda: keras.optimizers.SGD(0.3, momentum=0.9, loss_scale_factor=64.0,  # noqa: E731
                                        **clip)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data()
    keras_model = _mlp()
    keras_model.compile(optimizer=make(), loss=loss)
    keras_model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model = _mlp()
    pipe = PipelineModel(model, cuts=["dense0", "dense1"],
                         devices=["/CPU:0", "/CPU:1", "/CPU:2"], mode="sync")
    pipe.compile(optimizer=make(), loss=loss)
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert rel_error(model.get_weights(), keras_model.get_weights(), _mlp().get_weights()) < 1e-5


@pytest.mark.parametrize("mode", MODES)
def test_model_optimizer_iterations_at_each_batch_begin_count_the_steps_as_in_keras(mode):
    # Warm-up callbacks often compute the rate from `model.optimizer.iterations`.
    class Steps(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_train_batch_begin(self, batch, logs=None):
            self.seen.append(int(self.model.optimizer.iterations.numpy()))

    pipe, _ = _pipe(mode)
    steps = Steps()
    x, y = _data()
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                   callbacks=[steps])
    assert steps.seen == list(range(16))


def test_run_forward_with_a_window_of_0_refuses_instead_of_hanging(monkeypatch):
    from tf_spectrain.runtime import forward_pipeline

    runs = []

    class Recorded(forward_pipeline._ForwardRun):  # noqa: SLF001 - to clean up a hang
        def __init__(self, *args):
            super().__init__(*args)
            runs.append(self)

    monkeypatch.setattr(forward_pipeline, "_ForwardRun", Recorded)

    class Stage:
        k, device = 0, "/CPU:0"

        def infer(self, inputs):
            return [inputs[0]], tf.constant(0.0)

    out = {}

    def target():
        try:
            out["count"] = forward_pipeline.run_forward(
                [Stage(), Stage()], [tf.constant(1.0)] * 3, lambda e: ([e], None),
                lambda r: None, window=0)
        except BaseException as error:  # noqa: B036 - any refusal will do
            out["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(3.0)
    hung = thread.is_alive()
    if hung:
        for run in runs:
            run.failure.abort.set()  # let its threads end
        thread.join(5.0)
    assert not hung, "run_forward(window=0) hangs"
    assert isinstance(out.get("error"), ValueError), out


class _Warmup(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.learning_rate = 0.05 * (1 + batch % 3)


def _clipping_sgd():
    return keras.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=0.1)


@functools.cache
def _keras_clipped(warmup):
    """Keras' fit of `_mlp()` with `_clipping_sgd()`, with or without `_Warmup`'s rates (the
    same for every case below: computed once)."""
    x, y = _data()
    keras_model = _mlp()
    keras_model.compile(optimizer=_clipping_sgd(),
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    keras_model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                    callbacks=[_Warmup()] if warmup else [])
    return keras_model.get_weights()


@pytest.mark.parametrize("num_stages, micro_batches", [(1, 1), (2, 2), (4, 1)])
def test_sync_batch_rates_and_global_clipnorm_for_1_2_and_4_stages_equal_keras(
    num_stages, micro_batches
):
    x, y = _data()
    pipe, model = _pipe("sync", num_stages=num_stages, micro_batches=micro_batches,
                        optimizer=_clipping_sgd())
    _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                   callbacks=[_Warmup()])
    w0 = _mlp().get_weights()
    keras_weights = _keras_clipped(warmup=True)
    assert rel_error(model.get_weights(), keras_weights, w0) < 1e-5
    # rates matter
    assert rel_error(_keras_clipped(warmup=False), keras_weights, w0) > 1e-2


def test_on_nan_stop_with_global_clipnorm_stops_at_the_first_nan_loss_without_a_hang():
    from tf_spectrain import NonFiniteLossError

    pipe, _ = _bomb_pipe(optimizer=keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=0.05))
    x, y = _poisoned_data()
    order = _Order()
    with pytest.raises(NonFiniteLossError, match=f"mini-batch {POISONED + 1} of epoch 0"):
        _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                       callbacks=[order])
    # Batch 3's NaN global norm made every stage's weights NaN, so batch 4's loss is NaN.
    assert order.events[-1] == ("begin", POISONED + 1)


def test_an_error_in_on_train_batch_begin_of_a_later_epochs_first_batch():
    class FailEpoch1(_Order):
        def on_train_batch_begin(self, batch, logs=None):
            super().on_train_batch_begin(batch, logs)
            if self.events.count(("epoch", 1)) and batch == 0:
                raise KeyError("epoch 1 begin 0 failed")

    pipe, _ = _pipe("spectrain")
    order = FailEpoch1()
    x, y = _data()
    with pytest.raises(KeyError, match="epoch 1 begin 0 failed"):
        _fit_in_thread(pipe, x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                       callbacks=[order])
    assert _iterations(pipe) == [8, 8, 8]
    assert not [t for t in threading.enumerate() if t.name.startswith("stage-")]
