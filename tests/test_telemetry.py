"""`tf_spectrain.callbacks.Telemetry`: TensorBoard scalars read back from the event files.

The values are checked against independent sources: Keras' History for the epoch metrics,
the optimizer for the learning rate, `schedule` for the version gaps and the schedule's
bubble, and, for the prediction error, a recording of every stage's weights and momentum
after each update, from which the test recomputes `|W_used - W_target|` and
`|W_stale - W_target|` with NumPy.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import collect_garbage
from runtimes import EAGER, compile_quietly
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tf_spectrain import schedule
from tf_spectrain.callbacks import Telemetry
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.schedule import modes

LR = 0.05


def mlp(seed=0, width=12):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,), name="features")
    h = inputs
    for n, units in enumerate([width, width, width, 3]):
        h = keras.layers.Dense(units, activation=None if n == 3 else "tanh", name=f"dense{n}")(h)
    return keras.Model(inputs, h, name="mlp")


def data(n=96, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (np.argmax(x[:, :3], axis=1)).astype("int32")
    return x, y


def pipeline(mode="spectrain", target="paper", cuts=("dense0", "dense1", "dense2"),
             steps_per_execution="auto"):
    pipe = PipelineModel(mlp(), cuts=list(cuts), mode=mode, spectrain_target=target)
    compile_quietly(
        pipe,
        SpecTrainSGD(LR, momentum=0.9),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return pipe


def read_scalars(logdir):
    """{tag: [(step, value)]} from the event files, as TensorBoard reads them."""
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
    }


class WeightRecorder:
    """Wraps each stage's `update` to record (weights, momenta) after every update."""

    def __init__(self, pipe):
        self.history = []  # per stage: list indexed by version of (weights, momenta)
        for runner in pipe.runners:
            self.history.append([self._state(runner)])
            runner.update = self._wrap(runner, runner.update, len(self.history) - 1)

    @staticmethod
    def _state(runner):
        weights = [np.array(v.numpy()) for v in runner.trainable]
        momenta = [np.array(runner.optimizer.momentum_of(v).numpy()) for v in runner.trainable]
        return weights, momenta

    def _wrap(self, runner, update, k):
        def wrapped(**options):
            update(**options)
            self.history[k].append(self._state(runner))

        return wrapped


def norm(a, b):
    return math.sqrt(sum(float(np.sum((x - y) ** 2)) for x, y in zip(a, b)))


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("telemetry")
    pipe = pipeline(steps_per_execution=EAGER)  # the recorder wraps the stage threads' updates
    recorder = WeightRecorder(pipe)
    x, y = data()
    telemetry = Telemetry(logdir, log_every=1, prediction_every=2)
    history = pipe.fit(
        x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
        validation_data=(x[:32], y[:32]), callbacks=[telemetry],
    )
    return dict(
        pipe=pipe, telemetry=telemetry, history=history.history,
        scalars=read_scalars(logdir), recorder=recorder,
    )


def test_tags_cover_steps_epochs_stages_and_predictions(paper_run):
    tags = set(paper_run["scalars"])
    expected = {
        "batch/loss", "batch/accuracy", "batch/learning_rate", "batch/images_per_second",
        "epoch/loss", "epoch/accuracy", "epoch/val_loss", "epoch/val_accuracy",
        "epoch/wall_time", "pipeline/bubble_fraction", "pipeline/bubble_fraction_schedule",
        "pipeline/skipped_batches", "pipeline/probe_seconds", "run/num_stages",
    }
    for k in range(4):
        names = ("busy_seconds", "utilisation", "s_f", "s_b")
        expected |= {f"pipeline/stage_{k}/{name}" for name in names}
        expected |= {f"prediction/stage_{k}/forward_{n}" for n in ("ratio", "error", "baseline")}
    assert expected <= tags, sorted(expected - tags)


def test_epoch_scalars_equal_the_keras_history(paper_run):
    scalars, history = paper_run["scalars"], paper_run["history"]
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        logged = [v for _, v in sorted(scalars[f"epoch/{name}"])]
        np.testing.assert_allclose(logged, history[name], rtol=1e-6)
    walls = [v for _, v in scalars["epoch/wall_time"]]
    assert len(walls) == 2 and all(w > 0 for w in walls)


def test_step_scalars_every_step_with_the_learning_rate(paper_run):
    scalars = paper_run["scalars"]
    steps = [s for s, _ in scalars["batch/loss"]]
    assert steps == list(range(24))  # 12 mini-batches per epoch, log_every=1
    np.testing.assert_allclose([v for _, v in scalars["batch/learning_rate"]], LR, rtol=1e-6)
    rates = [v for _, v in scalars["batch/images_per_second"]]
    assert all(r > 0 and math.isfinite(r) for r in rates)
    # The last step of each epoch logs the epoch's running loss, which History reports.
    last = dict(scalars["batch/loss"])
    np.testing.assert_allclose([last[11], last[23]], paper_run["history"]["loss"], rtol=1e-6)


def test_stage_scalars_match_the_schedule(paper_run):
    scalars, pipe = paper_run["scalars"], paper_run["pipe"]
    for k in range(4):
        s_f, s_b = schedule.version_gaps(k, 4, "paper")
        assert [v for _, v in scalars[f"pipeline/stage_{k}/s_f"]] == [s_f, s_f]
        assert [v for _, v in scalars[f"pipeline/stage_{k}/s_b"]] == [s_b, s_b]
        utilisation = [v for _, v in scalars[f"pipeline/stage_{k}/utilisation"]]
        assert all(0 < u <= 1.0 + 1e-6 for u in utilisation)
        busy = [v for _, v in scalars[f"pipeline/stage_{k}/busy_seconds"]]
        walls = [v for _, v in scalars["epoch/wall_time"]]
        assert all(0 < b <= w for b, w in zip(busy, walls))
    table = schedule.clock_table([schedule.async_ops(k, 4, 12) for k in range(4)])
    logged = [v for _, v in scalars["pipeline/bubble_fraction_schedule"]]
    np.testing.assert_allclose(logged, schedule.bubble_fraction(table), rtol=1e-6)
    bubble = [v for _, v in scalars["pipeline/bubble_fraction"]]
    assert all(0 <= b < 1 for b in bubble)
    assert pipe.runners[0].probe is None  # probes are removed at the end of fit


def test_prediction_error_equals_a_recomputation_from_recorded_weights(paper_run):
    """Each measurement, recomputed from every stage's recorded weight history."""
    results = paper_run["telemetry"].predictions
    history = paper_run["recorder"].history
    assert len(results) > 20
    kinds = {(r["stage"], r["pass"]) for r in results}
    # paper gaps for N=4: s_f = 3, 2, 2, 1; s_b = 0, 0, 1, 1
    assert kinds == {(0, "forward"), (1, "forward"), (2, "forward"), (3, "forward"),
                     (2, "backward"), (3, "backward")}
    for r in results:
        k, v, t = r["stage"], r["used_version"], r["target_version"]
        s_f, s_b = schedule.version_gaps(k, 4, "paper")
        steps = s_f if r["pass"] == "forward" else s_b
        assert t == v + steps
        weights, momenta = history[k][v]
        predicted = [w + steps * m for w, m in zip(weights, momenta)]
        target = history[k][t][0]
        np.testing.assert_allclose(r["error"], norm(predicted, target), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(r["baseline"], norm(weights, target), rtol=1e-4, atol=1e-7)
    # The paper's claim, on this smooth problem: predicting beats using stale weights.
    late = [r["ratio"] for r in results if r["used_version"] >= 4 and r["baseline"] > 0]
    assert np.mean(late) < 0.8, np.mean(late)


def test_measured_versions_follow_the_schedule(paper_run):
    """F(i) on stage k sees max(0, i - (N-1-k)) updates of its epoch, B(i) exactly i
    (SPECTRAIN.md 3); the pipeline drains at epoch ends, so epochs add 12 updates each."""
    for r in paper_run["telemetry"].predictions:
        i, k, epoch = r["batch"], r["stage"], r["epoch"]
        if r["pass"] == "forward":
            assert r["used_version"] == epoch * 12 + schedule.forward_version(i, k, 4)
        else:
            assert r["used_version"] == epoch * 12 + schedule.backward_version(i)


@pytest.mark.parametrize("mode", ["vanilla", "stash"])
def test_stale_modes_measure_the_staleness_distance(mode, tmp_path):
    pipe = pipeline(mode, steps_per_execution=EAGER)
    recorder = WeightRecorder(pipe)
    x, y = data()
    telemetry = Telemetry(tmp_path, prediction_every=3)
    pipe.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[telemetry])
    results = telemetry.predictions
    assert results
    for r in results:
        if r["pass"] == "forward" or mode == "vanilla":
            # no prediction: the used weights are the current (stale) ones
            assert r["error"] == pytest.approx(r["baseline"], rel=1e-6)
        k, v, t = r["stage"], r["used_version"], r["target_version"]
        h_f, h_b = modes.probe_horizons(mode, k, 4)
        if r["pass"] == "forward":
            assert t == v + h_f
            used = recorder.history[k][v][0]
        else:
            assert t == v + h_b
            # stash's backward computes with its forward's weights, vanilla's with the current
            forward_v = schedule.forward_version(r["batch"], k, 4)
            used = recorder.history[k][forward_v if mode == "stash" else v][0]
        np.testing.assert_allclose(r["error"], norm(used, recorder.history[k][t][0]), rtol=1e-4)
    assert any(r["error"] > 0 for r in results)


@pytest.mark.parametrize("mode, target, options", [
    ("spectrain", "paper", {}),
    ("spectrain", "consistent", {"micro_batches": 2}),
    ("stash", "paper", {"recompute": "always"}),
    ("2bw", "paper", {"accumulate": 4}),  # versions are applied updates: 3 an epoch
])
def test_windows_measure_what_the_stage_threads_measure(mode, target, options, tmp_path):
    # The same training in windows of 5 (forwards whose backward, and passes whose target
    # update, fall in a later window) and pass by pass: the same measurements, except those
    # whose target lies past the epoch's end, which windows leave out.
    x, y = data()
    results = {}
    for spe in (EAGER, 5):
        pipe = PipelineModel(mlp(), cuts=["dense0", "dense1", "dense2"], mode=mode,
                             spectrain_target=target, **options)
        compile_quietly(pipe, SpecTrainSGD(LR, momentum=0.9),
                        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        steps_per_execution=spe)
        telemetry = Telemetry(tmp_path / str(spe), prediction_every=3)
        pipe.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[telemetry])
        results[spe] = {(r["epoch"], r["batch"], r["stage"], r["pass"]): r
                        for r in telemetry.predictions}
    threads, windows = results[EAGER], results[5]
    # Pass by pass, a measurement whose target is in the next epoch waits there, and holds
    # one of the stage's `max_pending` places: windows, which leave it out, may measure a
    # pass the threads skipped at the next epoch's start; within an epoch they agree.
    first = {key for key in windows if key[0] == 0}
    assert len(windows) > 10 and first <= set(threads)
    per_epoch = 12 // options.get("accumulate", 1)  # updates an epoch
    for key in set(threads) - set(windows):
        assert threads[key]["target_version"] > per_epoch * (key[0] + 1), key  # next epoch's
    assert len(set(windows) - set(threads)) <= 2
    windows = {key: r for key, r in windows.items() if key in threads}
    for key, got in windows.items():
        want = threads[key]
        assert (got["used_version"], got["target_version"]) == (
            want["used_version"], want["target_version"]), key
        np.testing.assert_allclose([got["error"], got["baseline"]],
                                   [want["error"], want["baseline"]], rtol=1e-5, atol=1e-7)


def test_consistent_target_measures_forwards_against_n_minus_1_minus_k(tmp_path):
    pipe = pipeline("spectrain", "consistent")
    telemetry = Telemetry(tmp_path, prediction_every=2)
    x, y = data()
    pipe.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[telemetry])
    assert {r["pass"] for r in telemetry.predictions} == {"forward"}
    for r in telemetry.predictions:
        assert r["target_version"] - r["used_version"] == 3 - r["stage"]
    assert 3 not in {r["stage"] for r in telemetry.predictions}  # last stage: gap 0


def test_sync_mode_has_nothing_to_predict(tmp_path):
    pipe = pipeline("sync", steps_per_execution=1)  # a log per mini-batch
    telemetry = Telemetry(tmp_path, log_every=4)
    x, y = data()
    pipe.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[telemetry])
    scalars = read_scalars(tmp_path)
    assert telemetry.predictions == []
    assert not [t for t in scalars if t.startswith("prediction/")]
    # log_every=4: steps 0 (always the first), 3, 7, 11
    assert [s for s, _ in scalars["batch/loss"]] == [0, 3, 7, 11]
    assert [v for _, v in scalars["pipeline/stage_0/s_f"]] == [0]


def test_plain_keras_model_gets_step_and_epoch_scalars(tmp_path):
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(LR), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                        callbacks=[Telemetry(tmp_path, log_every=1, batch_size=8)])
    scalars = read_scalars(tmp_path)
    assert not [t for t in scalars if t.startswith(("pipeline/", "prediction/"))]
    np.testing.assert_allclose([v for _, v in scalars["epoch/loss"]], history.history["loss"],
                               rtol=1e-6)
    assert len(scalars["batch/loss"]) == 24
    assert "batch/images_per_second" in scalars


@pytest.mark.exclusive  # a share of wall time
def test_auto_interval_keeps_step_logging_under_two_percent(tmp_path):
    """A model whose step is not trivially short: in steady state (the third epoch, once
    the interval has adapted), per-step logging costs under 2% of the training time."""
    import time

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1")(inputs)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    out = keras.layers.Dense(10, name="logits")(h)
    pipe = PipelineModel(keras.Model(inputs, out), cuts=["conv1"], mode="spectrain")
    pipe.compile(SpecTrainSGD(0.01, momentum=0.9),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"],
                 steps_per_execution=1)  # per-step logging of every mini-batch
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2400, 16, 16, 3)).astype("float32")  # 150 steps per epoch
    y = rng.integers(0, 10, 2400).astype("int32")
    telemetry = Telemetry(tmp_path, prediction_every=0)
    marks = {}

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            marks[epoch] = (time.perf_counter(), telemetry.batch_log_seconds)

        def on_epoch_end(self, epoch, logs=None):
            begin, logged = marks[epoch]
            marks[epoch] = (time.perf_counter() - begin, telemetry.batch_log_seconds - logged)

    collect_garbage()  # no collection of earlier tests' garbage on conftest's thread now
    pipe.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[Clock(), telemetry])
    seconds, logged = marks[2]
    print(f"per-step logging in epoch 3: {logged / seconds:.3%}; interval {telemetry.log_interval}")
    assert logged / seconds < 0.02
    steps = [s for s, _ in read_scalars(tmp_path)["batch/loss"]]
    # It logs the first step, then every 10th until a write's cost is known, then adapts
    # (on a loaded machine the adapted interval may exceed the 150 steps of an epoch).
    assert steps[:2] == [0, 9] and telemetry.log_interval >= 1


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"log_every": 0}, "`log_every` must be an integer >= 1 or 'auto'"),
        ({"log_every": "often"}, "log_every"),
        ({"prediction_every": -1}, "`prediction_every` must be an integer >= 1"),
        ({"batch_size": 0}, "`batch_size`"),
    ],
)
def test_bad_arguments(kwargs, error, tmp_path):
    with pytest.raises(ValueError, match=error):
        Telemetry(tmp_path, **kwargs)


def test_bad_logdir_type():
    with pytest.raises(TypeError, match="`logdir` must be a path"):
        Telemetry(3)


def test_unwritable_logdir_fails_at_construction(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"`logdir` must be a directory.*file"):
        Telemetry(blocker / "logs")


def _event_tags(logdir):
    """{subdir: EventAccumulator tags} for every folder holding event files."""
    import os

    found = {}
    for folder, _, files in os.walk(logdir):
        if any(f.startswith("events") for f in files):
            acc = EventAccumulator(folder, size_guidance={"tensors": 0})
            acc.Reload()
            found[os.path.relpath(folder, logdir)] = acc.Tags()
    return found


def test_train_py_graph_and_histograms_only_on_request(tmp_path, capsys):
    from tf_spectrain.app import cli

    argv = ["--model", "mlp", "--gpus", "2", "--limit", "32", "--batch-size", "16",
            "--epochs", "1", "--prediction-every", "1", "--cuts", "dense1"]  # weights on both
    plain, extra = tmp_path / "plain", tmp_path / "extra"
    assert cli.main(argv + ["--logdir", str(plain)]) == 0
    assert cli.main(argv + ["--logdir", str(extra), "--graph", "--histograms"]) == 0
    capsys.readouterr()
    tags = _event_tags(plain)
    assert list(tags) == ["."]  # Telemetry's file only
    scalars = set(tags["."]["tensors"])
    assert {"batch/loss", "epoch/val_accuracy", "pipeline/stage_1/utilisation"} <= scalars
    assert "prediction/stage_0/forward_ratio" in scalars
    assert not [t for t in scalars if "histogram" in t]
    tags = _event_tags(extra)
    train = tags["train"]
    assert "keras" in train["tensors"]  # the model's graph, as Keras' TensorBoard writes it
    assert any(t.endswith("/histogram") for t in train["tensors"])


def test_one_telemetry_over_two_fits_numbers_steps_continuously(tmp_path):
    """As train.py does when it resumes in the middle of an epoch: two fits, one callback."""
    pipe = pipeline(steps_per_execution=1)  # a step log per mini-batch
    x, y = data()
    telemetry = Telemetry(tmp_path, log_every=1, prediction_every=4, steps_per_epoch=12)
    pipe.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[telemetry])
    pipe.fit(x, y, batch_size=8, epochs=2, initial_epoch=1, verbose=0, callbacks=[telemetry])
    steps = [s for s, _ in read_scalars(tmp_path)["batch/loss"]]
    assert steps == list(range(24))
    assert {r["epoch"] for r in telemetry.predictions} == {0, 1}


@pytest.mark.parametrize("mode, accumulate", [("nesterov", 1), ("2bw", 4), ("2bw", 5)])
def test_nesterov_and_2bw_measure_their_staleness(mode, accumulate, tmp_path):
    # SPECTRAIN.md 6e: neither predicts, so a pass's error is its distance from the weights
    # `h` applied updates later (stash's horizons for nesterov, one update for 2bw); the
    # backward uses its forward's weights, version `floor(max(0, i - s_k) / A)`.
    pipe = PipelineModel(mlp(), cuts=["dense0", "dense1", "dense2"], mode=mode,
                         accumulate=accumulate if mode == "2bw" else None)
    compile_quietly(pipe, keras.optimizers.SGD(LR, momentum=0.9),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=EAGER)  # `_recording` wraps the stage threads' updates
    history = []
    for runner in pipe.runners:
        history.append([[np.array(v.numpy()) for v in runner.trainable]])
        runner.update = _recording(runner, history[-1])
    x, y = data()
    telemetry = Telemetry(tmp_path, prediction_every=2)
    pipe.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[telemetry])
    results = telemetry.predictions
    assert results and any(r["error"] > 0 for r in results)
    for r in results:
        k, i, v, t = r["stage"], r["batch"], r["used_version"], r["target_version"]
        h_f, h_b = modes.probe_horizons(mode, k, 4)
        assert t == v + (h_f if r["pass"] == "forward" else h_b)
        used = history[k][max(0, i - (3 - k)) // accumulate]
        np.testing.assert_allclose(r["error"], norm(used, history[k][t]), rtol=1e-4, atol=1e-7)
        if r["pass"] == "forward":
            assert r["error"] == pytest.approx(r["baseline"], rel=1e-6)


def _recording(runner, history):
    """`runner.update`, appending the stage's weights after each applied update."""
    update = runner.update

    def wrapped(**options):
        before = runner.updater.attempts
        update(**options)
        if runner.updater.attempts > before:
            history.append([np.array(v.numpy()) for v in runner.trainable])

    return wrapped
