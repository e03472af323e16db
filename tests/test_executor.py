"""Tests for tf_spectrain.runtime.executor: the stages of a pipeline run in threads that
overlap in time, a failure anywhere stops everything promptly, and a mini-batch splits into
micro-batches."""

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from runtimes import EAGER, compile_quietly

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.runtime import feed


def wide_mlp(width=512, depth=4, inputs=256, classes=10, name="wide"):
    x = inp = keras.Input((inputs,))
    for n in range(depth):
        last = n == depth - 1
        x = keras.layers.Dense(classes if last else width, activation=None if last else "relu",
                               name=f"dense{n}")(x)
    return keras.Model(inp, x, name=name)


def compiled_pipe(model, cuts, mode="stash"):
    pipe = PipelineModel(model, cuts=cuts, mode=mode)
    # The stage threads of runtime.executor run pass by pass: run_eagerly=True.
    compile_quietly(pipe, SpecTrainSGD(0.01, momentum=0.9),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=EAGER)
    return pipe


def busy_intervals(pipe):
    return [[(start, end) for kind, _, start, end in r.timeline if kind != "update"]
            for r in pipe.runners]


def overlap_seconds(a, b):
    total = 0.0
    for s1, e1 in a:
        for s2, e2 in b:
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def test_passes_of_different_stages_overlap_in_time():
    keras.utils.set_random_seed(1)
    model = wide_mlp(width=1024, inputs=1024)
    pipe = compiled_pipe(model, ["dense0", "dense1", "dense2"])
    x = np.random.rand(512, 1024).astype("float32")
    y = np.random.randint(0, 10, 512)
    pipe.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    intervals = busy_intervals(pipe)
    busy = sum(e - s for s, e in intervals[0])
    overlaps = [overlap_seconds(intervals[a], intervals[b])
                for a in range(4) for b in range(a + 1, 4)]
    # Neighbouring stages work on different mini-batches at the same time.
    print("overlap per stage pair (s):", overlaps, "stage 0 busy (s):", busy)
    assert max(overlaps) > 0.05 * busy, (overlaps, busy)
    # Every stage also ran on its own device.
    for runner, device in zip(pipe.runners, pipe.devices):
        assert all(v.value.device.endswith(device[1:]) for v in runner.trainable)


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("fail_stage, kind", [(0, "forward"), (1, "backward"), (3, "forward")])
def test_a_failing_stage_stops_fit_promptly_with_its_error(monkeypatch, fail_stage, kind):
    keras.utils.set_random_seed(2)
    model = wide_mlp(width=32, inputs=16)
    pipe = compiled_pipe(model, ["dense0", "dense1", "dense2"], mode="spectrain")
    runner = pipe.runners[fail_stage]
    original = getattr(runner, kind)

    def failing(key, *args, **kwargs):
        if key[0] == 5:
            raise Boom(f"injected failure at stage {fail_stage}")
        return original(key, *args, **kwargs)

    monkeypatch.setattr(runner, kind, failing)
    x = np.random.rand(40 * 8, 16).astype("float32")
    y = np.random.randint(0, 10, 40 * 8)
    start = time.perf_counter()
    with pytest.raises(Boom, match=f"injected failure at stage {fail_stage}") as info:
        pipe.fit(x, y, batch_size=8, epochs=3, verbose=0)
    assert time.perf_counter() - start < 30
    assert any(f"stage {fail_stage}" in note for note in getattr(info.value, "__notes__", []))
    assert "failing" in [entry.name for entry in info.traceback]  # the original traceback
    assert not [t for t in threading.enumerate() if t.name.startswith("stage-")]


def test_failure_in_a_callback_stops_the_stages():
    keras.utils.set_random_seed(4)
    pipe = compiled_pipe(wide_mlp(width=16, inputs=8), ["dense1"])

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise Boom("callback failed")

    x = np.random.rand(200, 8).astype("float32")
    y = np.random.randint(0, 10, 200)
    with pytest.raises(Boom, match="callback failed"):
        pipe.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Stop()])
    assert not [t for t in threading.enumerate() if t.name.startswith("stage-")]


def test_too_short_data_with_steps_per_epoch_says_what_to_do():
    pipe = compiled_pipe(wide_mlp(width=8, inputs=4), ["dense1"])
    # A dataset of unknown length, so that fit cannot tell in advance (it checks known ones).
    ds = tf.data.Dataset.from_tensor_slices(
        (np.zeros((16, 4), "float32"), np.zeros(16, "int32"))).batch(4).filter(
        lambda x, y: True)
    with pytest.raises(ValueError, match=r"ran out after \d+ mini-batches.*repeat"):
        pipe.fit(ds, epochs=2, steps_per_epoch=3, verbose=0)


@pytest.mark.parametrize("n, parts, sizes", [(8, 2, [4, 4]), (7, 3, [3, 2, 2]), (5, 5, [1] * 5)])
def test_split_batch_sizes_and_content(n, parts, sizes):
    x = tf.reshape(tf.range(n * 2), (n, 2))
    pieces = feed.split_batch(x, parts)
    assert [size for _, size in pieces] == sizes
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p, _ in pieces]), x.numpy())


def test_split_batch_refuses_more_parts_than_examples():
    with pytest.raises(ValueError, match="cannot be split into 4 micro-batches"):
        feed.split_batch(tf.zeros((3, 2)), 4)
