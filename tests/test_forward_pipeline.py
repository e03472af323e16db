"""`runtime.forward_pipeline`: evaluate and predict as a forward-only pipeline.

Results must equal the unsplit Keras model's; the stages must really work at once; a
failure anywhere must stop every thread at once with the stage named.
"""

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain import SpecTrainSGD
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime import forward_pipeline, inference

X = np.random.default_rng(0).normal(size=(23, 6)).astype("float32")
Y = np.arange(23) % 3


def _model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu", name="d0",
                           kernel_regularizer=keras.regularizers.L2(0.02))(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dense(7, activation="tanh", name="d1",
                           activity_regularizer=keras.regularizers.L1(0.01))(h)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    outputs = keras.layers.Dense(3, name="d2")(h)
    return keras.Model(inputs, outputs)


def _pipe(cuts=("d0", "d1"), mode="spectrain"):
    model = _model()
    devices = [f"/CPU:{k}" for k in range(len(cuts) + 1)]
    pipe = PipelineModel(model, cuts=list(cuts), devices=devices, mode=mode)
    pipe.compile(optimizer=SpecTrainSGD(0.1, momentum=0.9),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    return pipe, model


def _close(got, expected, rel=1e-5):
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=rel, abs=1e-6), key


@pytest.mark.parametrize("batch_size", [4, 23, 50])  # a short last batch; one batch; more
@pytest.mark.parametrize("pipelined", [True, False])
def test_evaluate_equals_keras_with_layer_losses_and_a_short_last_batch(batch_size, pipelined):
    pipe, model = _pipe()
    pipe.copy_weights_to_stages()
    got = inference.evaluate_logs(pipe.runners, pipe.model, pipe.loss, pipe.metrics, (X, Y),
                                  batch_size, pipelined=pipelined)
    _close(got, model.evaluate(X, Y, batch_size=batch_size, verbose=0, return_dict=True))


def test_pipeline_evaluate_and_predict_equal_keras_after_training():
    pipe, model = _pipe(mode="stash")
    pipe.fit(X, Y, batch_size=5, epochs=1, verbose=0)
    _close(pipe.evaluate(X, Y, batch_size=4, return_dict=True, verbose=0),
           model.evaluate(X, Y, batch_size=4, verbose=0, return_dict=True))
    np.testing.assert_allclose(pipe.predict(X, batch_size=4), model.predict(X, batch_size=4,
                                                                           verbose=0), atol=1e-5)


def test_validation_in_fit_equals_keras_evaluate_at_the_epoch_end():
    pipe, model = _pipe(mode="sync")
    history = pipe.fit(X, Y, batch_size=6, epochs=2, validation_data=(X[:9], Y[:9]), verbose=0)
    expected = model.evaluate(X[:9], Y[:9], batch_size=6, verbose=0, return_dict=True)
    _close({k[4:]: v[-1] for k, v in history.history.items() if k.startswith("val_")}, expected)


def _two_output_model():
    keras.utils.set_random_seed(5)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu", name="d0")(inputs)
    first = keras.layers.Dense(3, name="first")(h)
    h2 = keras.layers.Dense(5, activation="relu", name="d1")(h)
    second = keras.layers.Dense(2, name="second")(h2)
    return keras.Model(inputs, [first, second])


@pytest.mark.parametrize("pipelined", [True, False])
def test_predict_of_a_two_output_model_gives_one_array_per_output(pipelined):
    model = _two_output_model()
    pipe = PipelineModel(model, cuts=["d0"], devices=["/CPU:0", "/CPU:1"], mode="sync")
    pipe.compile(optimizer="sgd", loss="mse")
    ds, is_dataset = inference.predict_dataset(pipe.model, X, 4)
    pipe.copy_weights_to_stages()
    got = inference.collect_outputs(pipe.runners, ds, is_dataset, pipelined=pipelined)
    expected = model.predict(X, batch_size=4, verbose=0)
    assert isinstance(got, list) and len(got) == 2
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, atol=1e-6)


# --- concurrency, order, window, failures: stages replaced by slow Python stand-ins ------


class _SlowStage:
    """Stands in for a `StageRunner`: adds `k + 1`, sleeps, records when it ran."""

    def __init__(self, k, seconds, log, fail_at=None):
        self.k, self.device, self.seconds = k, f"/CPU:{k}", seconds
        self.log, self.fail_at = log, fail_at
        self.calls = 0

    def infer(self, inputs):
        index = self.calls
        self.calls += 1
        if index == self.fail_at:
            raise RuntimeError(f"boom in stage {self.k}")
        start = time.perf_counter()
        time.sleep(self.seconds)
        self.log.append((self.k, index, start, time.perf_counter()))
        return [inputs[0] + (self.k + 1)], tf.constant(float(self.k))


def _identity_split(element):
    return [element], element


@pytest.mark.exclusive  # a wall-time bound
def test_stages_work_on_different_batches_at_the_same_time_and_results_stay_in_order():
    log, seen = [], []
    stages = [_SlowStage(k, 0.03, log) for k in range(3)]
    data = [tf.constant(float(i)) for i in range(8)]
    started = time.perf_counter()
    count = forward_pipeline.run_forward(stages, data, _identity_split, seen.append)
    wall = time.perf_counter() - started
    assert count == 8
    assert [r.index for r in seen] == list(range(8))
    for r in seen:  # each stage added k + 1, in order, to this very batch
        assert float(r.outputs[0]) == pytest.approx(float(r.extra) + 6.0)
        assert [float(p) for p in r.penalties] == [0.0, 1.0, 2.0]
    # 24 passes of 30 ms: 0.72 s one after another, about (8 + 2) * 30 ms pipelined.
    assert wall < 0.6
    overlapping = [
        (a, b) for a in log for b in log
        if a[0] < b[0] and a[2] < b[3] and b[2] < a[3]
    ]
    assert overlapping, log


def test_run_in_order_runs_one_stage_at_a_time():
    log, seen = [], []
    stages = [_SlowStage(k, 0.005, log) for k in range(3)]
    forward_pipeline.run_in_order(stages, [tf.constant(1.0)] * 3, _identity_split, seen.append)
    assert len(seen) == 3
    for a, b in zip(log, log[1:]):
        assert b[2] >= a[3]


def test_no_more_than_window_batches_are_in_flight():
    log, in_flight, peak = [], [0], [0]
    lock = threading.Lock()

    class Counting(_SlowStage):
        def infer(self, inputs):
            if self.k == 0:
                with lock:
                    in_flight[0] += 1
                    peak[0] = max(peak[0], in_flight[0])
            return super().infer(inputs)

    def slow_consume(result):
        time.sleep(0.03)  # the caller is the bottleneck: stage 0 would run ahead
        with lock:
            in_flight[0] -= 1

    stages = [Counting(0, 0.001, log), Counting(1, 0.001, log)]
    forward_pipeline.run_forward(stages, [tf.constant(0.0)] * 12, _identity_split,
                                 slow_consume, window=3)
    assert 2 <= peak[0] <= 4  # the window, plus the one being consumed


@pytest.mark.parametrize("fail_stage", [0, 1, 2])
def test_a_failing_stage_stops_the_pipeline_at_once_and_is_named(fail_stage):
    log = []
    stages = [_SlowStage(k, 0.01, log, fail_at=3 if k == fail_stage else None) for k in range(3)]
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=f"boom in stage {fail_stage}") as info:
        forward_pipeline.run_forward(stages, [tf.constant(0.0)] * 1000, _identity_split,
                                     lambda r: None)
    assert time.perf_counter() - started < 5.0
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert f"stage {fail_stage} on /CPU:{fail_stage}" in notes and "batch 3" in notes
    assert stages[0].calls < 100  # stopped at once, not after the data ran out


def test_a_failure_while_consuming_stops_the_stages():
    stages = [_SlowStage(k, 0.005, []) for k in range(2)]

    def consume(result):
        if result.index == 2:
            raise KeyError("bad consumer")

    with pytest.raises(KeyError, match="bad consumer") as info:
        forward_pipeline.run_forward(stages, [tf.constant(0.0)] * 1000, _identity_split, consume)
    assert "caller" in " ".join(getattr(info.value, "__notes__", []))
    assert stages[0].calls < 100


def test_a_failure_reading_the_data_is_raised_with_the_batch_named():
    def data():
        yield tf.constant(0.0)
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone") as info:
        forward_pipeline.run_forward([_SlowStage(k, 0.0, []) for k in range(2)], data(),
                                     _identity_split, lambda r: None)
    assert "batch 1" in " ".join(getattr(info.value, "__notes__", []))


def test_a_real_stage_error_names_the_stage_in_evaluate(monkeypatch):
    pipe, _ = _pipe(mode="sync")

    def broken(inputs):
        raise tf.errors.InvalidArgumentError(None, None, "stage two broke")

    monkeypatch.setattr(pipe.runners[2], "infer", broken)
    with pytest.raises(tf.errors.InvalidArgumentError, match="stage two broke") as info:
        pipe.evaluate(X, Y, batch_size=4, verbose=0)
    assert "stage 2 on /CPU:2" in " ".join(getattr(info.value, "__notes__", []))
