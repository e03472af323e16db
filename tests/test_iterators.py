"""Tests for tf_spectrain.workflow.iterators: finished tf.data iterators are deleted on a
background thread, datasets built from arrays have no autotuner, and fit, evaluate and
predict hand every iterator they open to `retire`."""

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime import inference
from tf_spectrain.workflow import batching, iterators


class Tracked:
    """Records the thread that deletes it."""

    def __init__(self, log):
        self.log = log

    def __del__(self):
        self.log.append((threading.current_thread().name, time.monotonic()))


# Each reaper test has a reaper of its own: the process' one may still hold iterators that
# earlier tests retired (one can wait for its autotuner for up to a minute).


def test_retire_deletes_on_the_reaper_thread():
    log, reaper = [], iterators.Reaper()
    reaper.retire(Tracked(log))
    assert reaper.wait(10)
    assert [name for name, _ in log] == ["tf_spectrain-iterator-reaper"]


def test_retire_waits_until_the_caller_lets_go():
    log, reaper = [], iterators.Reaper()
    obj = Tracked(log)
    reaper.retire(obj)
    time.sleep(0.3)
    assert log == []  # the caller still holds it
    released = time.monotonic()
    del obj
    assert reaper.wait(10)
    assert log[0][0] == "tf_spectrain-iterator-reaper"
    assert log[0][1] >= released


def test_retire_ignores_none_and_wait_times_out_while_held(monkeypatch):
    queued = []
    monkeypatch.setattr(iterators.Reaper, "retire", lambda self, obj: queued.append(obj))
    iterators.retire(None)
    iterators.retire("an iterator")
    assert queued == ["an iterator"]  # None never reaches the process' reaper
    monkeypatch.undo()
    reaper = iterators.Reaper()
    obj = Tracked([])
    reaper.retire(obj)
    assert not reaper.wait(0.2)
    del obj
    assert reaper.wait(10)


def test_iterate_yields_everything_then_retires(monkeypatch):
    retired = []
    monkeypatch.setattr(iterators, "retire", retired.append)
    ds = tf.data.Dataset.range(5)
    assert [int(v) for v in iterators.iterate(ds)] == [0, 1, 2, 3, 4]
    assert len(retired) == 1
    gen = iterators.iterate(ds)
    next(gen)
    gen.close()  # stopped early: retired all the same
    assert len(retired) == 2


def test_without_autotune_turns_only_autotuning_off():
    ds = tf.data.Dataset.range(6).batch(4).prefetch(2)
    fixed = iterators.without_autotune(ds)
    assert fixed.options().autotune.enabled is False
    assert ds.options().autotune.enabled is not False
    assert [list(b.numpy()) for b in fixed] == [[0, 1, 2, 3], [4, 5]]


def small_pipe():
    keras.utils.set_random_seed(0)
    inp = keras.Input((4,))
    h = keras.layers.Dense(8, activation="relu", name="d0")(inp)
    out = keras.layers.Dense(3, name="d1")(h)
    pipe = PipelineModel(keras.Model(inp, out), cuts=["d0"], mode="stash")
    pipe.compile(keras.optimizers.SGD(0.01),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return pipe


@pytest.fixture
def retired(monkeypatch):
    seen = []

    def spy(obj):
        if obj is not None:
            seen.append(obj)

    monkeypatch.setattr(batching, "retire", spy)
    monkeypatch.setattr(iterators, "retire", spy)
    return seen


def test_array_datasets_have_no_autotuner():
    pipe = small_pipe()
    x, y = np.zeros((8, 4), "float32"), np.zeros(8, "int64")
    for shuffle in (True, False):
        ds = batching.dataset(pipe.model, pipe.loss, x, y, 4, shuffle)
        assert ds.options().autotune.enabled is False
    ds = batching.epoch_batches(pipe.model, x, y, 4, seed=0, epoch=1)
    assert ds.options().autotune.enabled is False
    ds, _ = inference.predict_dataset(pipe.model, x, 4)
    assert ds.options().autotune.enabled is False


def test_fit_retires_each_epochs_iterator(retired):
    pipe = small_pipe()
    x, y = np.random.rand(16, 4).astype("float32"), np.random.randint(0, 3, 16)
    pipe.fit(x, y, batch_size=4, epochs=3, verbose=0)
    assert len(retired) == 3
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    retired.clear()
    pipe.fit(ds, epochs=2, verbose=0)
    assert len(retired) == 2
    retired.clear()
    pipe.fit(ds.repeat(), epochs=2, steps_per_epoch=3, verbose=0)
    assert len(retired) == 1  # one iterator continued across the epochs


def test_fit_retires_its_iterator_when_a_callback_fails(retired):
    pipe = small_pipe()

    class Fail(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("callback failed")

    x, y = np.random.rand(16, 4).astype("float32"), np.random.randint(0, 3, 16)
    with pytest.raises(RuntimeError, match="callback failed"):
        pipe.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[Fail()])
    assert len(retired) == 1


def test_evaluate_and_predict_retire_their_iterators(retired):
    pipe = small_pipe()
    x, y = np.random.rand(10, 4).astype("float32"), np.random.randint(0, 3, 10)
    pipe.evaluate(x, y, batch_size=4, verbose=0)
    assert len(retired) == 1
    pipe.predict(tf.data.Dataset.from_tensor_slices(x).batch(4), verbose=0)
    assert len(retired) == 2
