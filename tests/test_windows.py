"""Windows (`compile(steps_per_execution=K)`): K mini-batches of every stage in one graph.

The modes themselves are checked against the NumPy reference at K = 1, 2 and one window per
epoch in test_pipeline_modes.py. Here: every option that changes what a pass keeps or how an
update is applied gives, in windows that cut the epoch anywhere (K = 3 over 7 mini-batches,
the last one smaller), the weights and losses of the pass-by-pass run (`run_eagerly=True`,
whose stage threads test_pipeline_model.py checks pass by pass); callbacks run once per
window, as Keras runs them with `steps_per_execution`; stopping, learning rates set by
callbacks, tracing.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf
from runtimes import EAGER, compile_quietly

import tf_spectrain
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.runtime import loop, window_graph

BATCH, NUM_BATCHES = 8, 7
LR, MOMENTUM = 0.05, 0.9


def model(seed=0, dropout=True, policy=None, regularize=False):
    """Dense, BatchNorm, Dropout | Dense | Dense: 3 stages; dropout and BN before the cuts."""
    keras.utils.set_random_seed(seed)
    dtype = policy
    inputs = keras.Input((5,))
    reg = keras.regularizers.L2(1e-3) if regularize else None
    h = keras.layers.Dense(16, activation="relu", name="dense0", kernel_regularizer=reg,
                           dtype=dtype)(inputs)
    h = keras.layers.BatchNormalization(name="bn", dtype=dtype)(h)
    if dropout:
        h = keras.layers.Dropout(0.3, seed=seed, name="drop", dtype=dtype)(h)
    h = keras.layers.Dense(12, activation="tanh", name="dense1", dtype=dtype)(h)
    h = keras.layers.Dense(8, activation="relu", name="dense2", dtype=dtype)(h)
    out = keras.layers.Dense(3, name="out", dtype=dtype)(h)
    return keras.Model(inputs, out)


CUTS = {2: ["dense1"], 3: ["dense1", "dense2"], 4: ["bn", "dense1", "dense2"]}


def data(num_batches=NUM_BATCHES, last=5):
    """`num_batches` mini-batches of BATCH, the last one `last` examples."""
    rng = np.random.default_rng(1)
    n = (num_batches - 1) * BATCH + last
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def fit(steps_per_execution, mode="stash", stages=3, epochs=2, optimizer=None, callbacks=(),
        policy=None, regularize=False, x=None, compile_options=None, **options):
    """Trains a fresh `model()` as a pipeline; returns (pipeline, weights, history)."""
    pipe = PipelineModel(model(policy=policy, regularize=regularize), cuts=CUTS[stages],
                         mode=mode, **options)
    compile_quietly(pipe, optimizer or SpecTrainSGD(LR, momentum=MOMENTUM),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"],
                    steps_per_execution=steps_per_execution, **(compile_options or {}))
    x, y = data() if x is None else x
    history = pipe.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                       callbacks=list(callbacks))
    return pipe, pipe.model.get_weights(), history.history


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(u, "float64") - np.asarray(v, "float64"))))
               for u, v in zip(a, b))


# Plain stash, vanilla and paper SpecTrain in windows of one and of a whole epoch are in
# tests/test_pipeline_modes.py's reference tests; here windows of 3, cut mid-stream.
CASES = {
    "sync-1f1b": dict(mode="sync", micro_batches=2, schedule="1f1b"),
    "paper": dict(mode="spectrain"),
    "consistent-micro": dict(mode="spectrain", spectrain_target="consistent",
                             micro_batches=2),
    "stash-micro-recompute": dict(mode="stash", micro_batches=2, recompute="always"),
    # Cuts that fall between micro-batches on stages > 0 (stage 0 feeds a mini-batch whole).
    "stash-4-stages-micro": dict(mode="stash", stages=4, micro_batches=2),
    "paper-micro-4": dict(mode="spectrain", micro_batches=4),
    "paper-4-stages-regularized": dict(mode="spectrain", stages=4, regularize=True),
    "stash-replicas": dict(mode="stash", stages=2, replicas=2),
    "sync-global-clipnorm": dict(mode="sync", optimizer="clip"),
    "vanilla-bfloat16": dict(mode="vanilla", policy="mixed_bfloat16"),
    "paper-float16-loss-scale": dict(mode="spectrain", policy="mixed_float16"),
    "sync-float16-one-scale": dict(mode="sync", policy="mixed_float16", micro_batches=2),
    "paper-adamw": dict(mode="spectrain", optimizer="adamw"),
}


def _optimizer(name):
    if name == "clip":
        return SpecTrainSGD(LR, momentum=MOMENTUM, global_clipnorm=0.05)
    if name == "adamw":
        return keras.optimizers.AdamW(0.01)
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_windows_give_the_pass_by_pass_weights_and_losses(case):
    options = dict(CASES[case])
    name = options.pop("optimizer", None)
    got, want = [fit(k, optimizer=_optimizer(name), **options) for k in (3, EAGER)]
    float16 = options.get("policy") == "mixed_float16"
    atol = 1e-3 if float16 else 2e-6
    assert max_diff(got[1], want[1]) < atol
    np.testing.assert_allclose(got[2]["loss"], want[2]["loss"], rtol=1e-3 if float16 else 1e-5)
    np.testing.assert_allclose(got[2]["accuracy"], want[2]["accuracy"], atol=1e-6)
    assert max_diff(got[1], model(policy=options.get("policy")).get_weights()) > 50 * atol
    for a, b in zip(got[0].all_runners, want[0].all_runners):
        assert a.updates == b.updates == 2 * NUM_BATCHES
        assert a.skipped == b.skipped
        # The same micro-batches in flight at once on each stage.
        assert a.memory.peak_micro_batches == b.memory.peak_micro_batches


def test_a_backward_in_a_later_window_recomputes_with_the_forwards_weights_and_mask():
    # Stash keeps a forward's activations for its backward, pass by pass; in windows of 2,
    # most of stage 0's backwards come in the window after their forward and recompute it
    # from its inputs, at the stashed weights, with the forward's dropout mask (dropout is
    # on stage 0). The weights must be the pass-by-pass ones; a recompute with another mask
    # (another seed's model) would not give them.
    got = fit(EAGER, mode="stash", epochs=1)[1]
    windows = fit(2, mode="stash", epochs=1)[1]
    assert max_diff(windows, got) < 2e-6
    other = PipelineModel(model(seed=5), cuts=CUTS[3], mode="stash")
    other.compile(SpecTrainSGD(LR, momentum=MOMENTUM),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=2)
    other.model.set_weights(model().get_weights())  # same weights, another dropout seed
    other.fit(*data(), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert max_diff(other.model.get_weights(), got) > 1e-4


class Calls(keras.callbacks.Callback):
    """Records the batch hooks' arguments and the learning rate each begin sets."""

    def __init__(self, rates=None):
        super().__init__()
        self.calls, self.rates = [], rates

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))
        if self.rates is not None:
            self.model.optimizer.learning_rate = self.rates(batch)

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch, round(float(logs["loss"]), 6)))


def test_callbacks_run_once_per_window_as_with_keras_steps_per_execution():
    calls = Calls()
    _, _, history = fit(3, epochs=1, callbacks=[calls])
    assert [c[:2] for c in calls.calls] == [("begin", 0), ("end", 2), ("begin", 3),
                                           ("end", 5), ("begin", 6), ("end", 6)]
    # The last window's logs are the epoch's.
    assert calls.calls[-1][2] == pytest.approx(history["loss"][0], rel=1e-5)
    # Keras does the same with steps_per_execution=3, except that Keras 3.15 names the end
    # of a last, shorter window as if it were full (8 for an epoch of 7 mini-batches); the
    # pipeline names the last mini-batch run.
    keras_calls = Calls()
    plain = model()
    plain.compile(keras.optimizers.SGD(LR), "sparse_categorical_crossentropy",
                  steps_per_execution=3)
    plain.fit(*data(), batch_size=BATCH, epochs=1, verbose=0, callbacks=[keras_calls])
    assert [c[:2] for c in keras_calls.calls][:-1] == [c[:2] for c in calls.calls][:-1]
    assert keras_calls.calls[-1][:2] == ("end", 8)


def test_a_learning_rate_set_at_a_windows_begin_applies_to_its_mini_batches():
    # Set at every begin: with windows of 2 the rate of mini-batch i is the one set at
    # the begin of its window, 2 * (i // 2). The pass-by-pass run with those rates per
    # mini-batch must give the same weights.
    def rate(batch):
        return LR * (1 + 0.5 * batch)

    windows = fit(2, mode="spectrain", callbacks=[Calls(rate)], epochs=1)[1]
    same = fit(EAGER, mode="spectrain", callbacks=[Calls(lambda b: rate(2 * (b // 2)))],
               epochs=1)[1]
    other = fit(EAGER, mode="spectrain", callbacks=[Calls(rate)], epochs=1)[1]
    assert max_diff(windows, same) < 2e-6
    assert max_diff(windows, other) > 1e-4  # the test can tell


class StopAfter(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch >= self.batch:
            self.model.stop_training = True


@pytest.mark.parametrize("mode", ["spectrain", "sync"])
def test_stop_training_ends_the_epoch_after_the_fed_mini_batches(mode):
    # Stopped at the end of the first window (mini-batches 0-1): the mini-batches already
    # fed (stage 0 runs N - 1 ahead in the asynchronous modes) finish and update, exactly
    # the schedule of an epoch of that many, as the pass-by-pass runner does.
    x, y = data(num_batches=12, last=BATCH)
    pipe, got, _ = fit(2, mode=mode, epochs=3, callbacks=[StopAfter(0)], x=(x, y))
    epoch, done, total = pipe.epoch_progress
    assert (epoch, total) == (0, 12)
    # Sync windows hold whole mini-batches; in the asynchronous modes stage 0 has fed
    # beyond the window (at most N - 1 = 2 further).
    assert done == 2 if mode == "sync" else 2 < done <= 4
    shorter = fit(EAGER, mode=mode, epochs=1, x=(x[: done * BATCH], y[: done * BATCH]))[1]
    assert max_diff(got, shorter) < 2e-6
    assert all(r.updates == done for r in pipe.runners)


def test_a_stop_asked_before_the_epoch_feeds_exactly_one_mini_batch():
    x, y = data(num_batches=6, last=BATCH)
    pipe = PipelineModel(model(), cuts=CUTS[3], mode="stash")
    pipe.compile(SpecTrainSGD(LR, momentum=MOMENTUM),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 steps_per_execution=4)

    class Begin(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            pipe.request_stop()

    pipe.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[Begin()])
    assert pipe.epoch_progress == (0, 1, 6)
    assert all(r.updates == 1 for r in pipe.runners)


@pytest.mark.parametrize("probes", [False, True])
def test_each_window_shape_is_traced_once(monkeypatch, tmp_path, probes):
    traced = []
    emit = window_graph.WindowEmitter.emit

    def counting(self):
        traced.append((self.window.first, self.window.stop))
        return emit(self)

    def callbacks():  # which passes the probes sample changes no window's graph
        return [tf_spectrain.callbacks.Telemetry(tmp_path, prediction_every=3)] if probes else []

    monkeypatch.setattr(window_graph.WindowEmitter, "emit", counting)
    x, y = data(num_batches=16, last=3)
    pipe = fit(2, mode="spectrain", epochs=3, x=(x, y), callbacks=callbacks())[0]
    # 8 windows an epoch: the first (pipeline filling), the steady ones (one shape), the
    # last two (the smaller mini-batch, the drain) and their shapes again in later epochs.
    first_fit = len(traced)
    assert first_fit <= 5, traced
    pipe.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=callbacks())
    assert len(traced) == first_fit  # a second fit traces nothing


def test_window_size_auto_follows_the_callbacks(tmp_path):
    assert loop.window_size(4, None) == 4
    assert loop.window_size("auto", None) == loop.AUTO_WINDOW
    keras_own = [keras.callbacks.EarlyStopping(), keras.callbacks.ModelCheckpoint("m.keras"),
                 keras.callbacks.TerminateOnNaN(), tf_spectrain.callbacks.Telemetry(tmp_path)]
    assert loop.window_size("auto", keras_own) == loop.AUTO_WINDOW
    # A callback of the user's own with per-batch hooks sees every mini-batch.
    assert loop.window_size("auto", keras_own + [Calls()]) == 1
    hook = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None)
    assert loop.window_size("auto", [hook]) == 1
    epochs = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None)
    assert loop.window_size("auto", [epochs]) == loop.AUTO_WINDOW
    assert loop.window_size(4, [Calls()]) == 4  # asked for: per window, as Keras does
    # A trace keeps the windows: they time each pass for it.
    traced = tf_spectrain.callbacks.PipelineTrace(tmp_path / "trace")
    assert loop.window_size("auto", keras_own + [traced]) == loop.AUTO_WINDOW
    assert loop.pass_times(keras_own + [traced]) and not loop.pass_times(keras_own[:3])
    assert loop.pass_times(keras_own[3:])  # the telemetry's stage utilisation
    untimed = tf_spectrain.callbacks.PipelineTrace(tmp_path / "trace", pass_times=False)
    assert loop.window_size("auto", [untimed]) == loop.AUTO_WINDOW
    # Stages on workers' CPUs: windows of one; on a worker's GPU, or local: windows of 8.
    worker_cpu = "/job:worker/replica:0/task:1/device:CPU:0"
    assert loop.window_size("auto", None, devices=["/CPU:0", worker_cpu]) == 1
    assert loop.window_size(4, None, devices=[worker_cpu]) == 4
    assert loop.window_size("auto", None, devices=[worker_cpu.replace("CPU", "GPU"), "/CPU:0"]
                            ) == loop.AUTO_WINDOW
    assert loop.window_size("auto", None, devices=["/job:localhost/replica:0/task:0/device:CPU:0"]
                            ) == loop.AUTO_WINDOW
    assert not loop.pass_times([untimed])
    assert loop.window_size(4, [traced]) == 4
    # A short fit (all its epochs) runs windows of one: no shape of its own length to build.
    short = loop.SHORT_FIT - 1
    assert loop.window_size("auto", None, num_batches=short) == 1
    assert loop.window_size("auto", None, num_batches=short + 1) == loop.AUTO_WINDOW
    assert loop.window_size("auto", None, num_batches=None) == loop.AUTO_WINDOW  # unknown
    assert loop.window_size(4, None, num_batches=2) == 4
    assert loop.window_size("auto", None, run_eagerly=True, num_batches=2) is None


@pytest.mark.parametrize("value, error", [(0, ValueError), ("eight", ValueError),
                                          (2.5, TypeError), (True, TypeError)])
def test_steps_per_execution_must_be_auto_or_a_positive_int(value, error):
    pipe = PipelineModel(model(), cuts=CUTS[2], mode="stash")
    with pytest.raises(error, match=r"`steps_per_execution` must be 'auto' or an integer >= 1"
                       r".*Received: steps_per_execution="):
        pipe.compile(SpecTrainSGD(LR), "sparse_categorical_crossentropy",
                     steps_per_execution=value)


def test_data_that_runs_out_in_a_window_says_what_to_do():
    import tensorflow as tf

    pipe = PipelineModel(model(), cuts=CUTS[3], mode="stash")
    pipe.compile(SpecTrainSGD(LR, momentum=MOMENTUM),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 steps_per_execution=4)
    x, y = data(num_batches=4, last=BATCH)
    # A dataset of unknown length, so that fit cannot tell in advance.
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).filter(lambda a, b: True)
    with pytest.raises(ValueError, match=r"ran out after 4 mini-batches of an epoch of 6.*"
                       r"repeat"):
        pipe.fit(ds, epochs=1, steps_per_epoch=6, verbose=0)


RUNS = collections.Counter()  # layer name -> forwards computed (counted inside the graph)


class CountsForwards(keras.layers.Layer):
    """Passes its input on, counting each time its forward is computed."""

    def call(self, x):
        def count(_):
            RUNS[self.name] += 1
            return np.float32(0.0)

        zero = tf.numpy_function(count, [x], tf.float32)  # stateful: never pruned
        return x + tf.stop_gradient(tf.ensure_shape(zero, ()))

    def compute_output_shape(self, input_shape):
        return input_shape


@pytest.mark.parametrize("recompute, per_batch", [("auto", 1), ("always", 2)])
def test_windows_of_one_compute_each_forward_once_unless_asked_to_recompute(recompute,
                                                                            per_batch):
    # Windows of one: each of stage 0's backwards comes a window after its forward. Stash
    # takes the forward's intermediates there (runtime.split_pass): one forward per
    # mini-batch, as pass by pass; with recompute="always" its backward recomputes it.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(16, activation="relu", name="dense0")(inputs)
    h = CountsForwards(name="counted")(h)
    out = keras.layers.Dense(3, name="out")(keras.layers.Dense(8, name="dense1")(h))
    pipe = PipelineModel(keras.Model(inputs, out), cuts=["counted"], mode="stash",
                         recompute=recompute)
    pipe.compile(SpecTrainSGD(LR, momentum=MOMENTUM),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 steps_per_execution=1)
    x, y = data(num_batches=4, last=BATCH)
    RUNS.clear()
    pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert RUNS["counted"] == per_batch * 4
