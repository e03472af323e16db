"""The wrapped model's weights and the stages' copies move only where one side needs them
(tf_spectrain.partition.mirror): no weight crosses to or from the stages at an epoch's
boundaries unless a callback may read the model, a write into the model (by a callback, by
the user) reaches the stages and wins over the training before it, and `fit` still ends
with the model holding the trained weights. Sync pipelines against plain Keras (sequential
SGD: equal within float tolerance); the mirror itself on a two-stage MLP on /CPU:0..1.
"""

import copy

import keras
import numpy as np
import pytest
from test_keras_callbacks import BATCH, VALIDATION, X, Y, assert_same_history
from test_model_api import assert_weights_close, compile_args, make_mlp, twin

from tf_spectrain import partition
from tf_spectrain.partition.mirror import WeightMirror
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.workflow import keras_fit


def _mirror():
    model = make_mlp()
    sources = partition.split_model(model, ["a"])
    stages = partition.place_stages(sources, ["/CPU:0", "/CPU:1"])
    return model, sources, stages, WeightMirror(sources, [stages])


def _stage_values(stages):
    return [v.numpy() for m in stages for v in m.weights]


def test_the_mirror_copies_everything_once_then_only_what_was_written():
    model, _, stages, mirror = _mirror()
    for v in (w for m in stages for w in m.weights):
        v.assign(np.zeros(v.shape, v.dtype))
    assert mirror.to_stages() == len(model.weights)
    assert_weights_close(_stage_values(stages), [v.numpy() for v in model.weights], rtol=0)
    assert mirror.to_stages() == 0 and mirror.to_model() == 0  # nothing changed
    kernel = model.get_layer("a").kernel
    kernel.assign(kernel.numpy() + 1.0)
    assert mirror.to_stages() == 1
    np.testing.assert_array_equal(stages[0].get_layer("a").kernel.numpy(), kernel.numpy())


def test_the_models_writes_after_training_win_and_reach_the_stages():
    model, sources, stages, mirror = _mirror()
    mirror.to_stages()
    trained = [v.numpy() + 0.5 for m in stages for v in m.weights]  # "training"
    for v, value in zip((w for m in stages for w in m.weights), trained):
        v.assign(value)
    mirror.moved_on()
    bias = model.get_layer("b").bias
    bias.assign(np.full(bias.shape, 7.0, "float32"))  # a write into the model, behind
    assert mirror.to_model() == len(model.weights) - 1
    mine = stages[1].get_layer("b").bias.numpy()
    np.testing.assert_array_equal(mine, 7.0)  # the write went to the stage
    expected = [7.0 * np.ones_like(t) if v.path == bias.path else t
                for v, t in zip((w for m in stages for w in m.weights), trained)]
    assert_weights_close([v.numpy() for m in sources for v in m.weights], expected, rtol=0)
    # A restore: the stages win over any write into the model.
    bias.assign(np.full(bias.shape, -3.0, "float32"))
    mirror.moved_on(overriding=True)
    mirror.to_model()
    np.testing.assert_array_equal(bias.numpy(), 7.0)


def test_a_copy_of_a_watched_variable_is_watched_by_nobody():
    # Stages of custom layers are deep copies (partition.layer_copy): the copy's writes
    # (its optimizer's, every step) must neither reach the model nor count as its writes.
    model, _, stages, mirror = _mirror()
    mirror.to_stages()
    kernel = model.get_layer("a").kernel
    twin_kernel = copy.deepcopy(kernel)
    twin_kernel.assign(np.full(kernel.shape, 5.0, "float32"))
    twin_kernel.assign_add(np.ones(kernel.shape, "float32"))
    assert mirror.to_stages() == 0
    assert not np.any(kernel.numpy() == 6.0)
    np.testing.assert_array_equal(twin_kernel.numpy(), 6.0)
    kernel.assign_sub(np.ones(kernel.shape, "float32"))  # the model's own: seen
    assert mirror.to_stages() == 1


@pytest.mark.parametrize("callback, reads", [
    (keras.callbacks.History(), False),
    (keras.callbacks.CSVLogger("x.csv"), False),
    (keras.callbacks.EarlyStopping(), False),
    (keras.callbacks.EarlyStopping(restore_best_weights=True), True),
    (keras.callbacks.TensorBoard("logs"), False),
    (keras.callbacks.TensorBoard("logs", histogram_freq=1), True),
    (keras.callbacks.ModelCheckpoint("m.keras"), True),
    (keras.callbacks.LambdaCallback(), True),
    (keras.callbacks.Callback(), True),
])
def test_callbacks_that_may_read_the_weights(callback, reads):
    assert keras_fit.may_read_weights(callback) is reads


class _Counting:
    """Counts the weights `WeightMirror` copies each way during a fit."""

    def __init__(self, monkeypatch):
        self.to_model, self.to_stages = [], []
        to_model, to_stages = WeightMirror.to_model, WeightMirror.to_stages
        monkeypatch.setattr(WeightMirror, "to_model",
                            lambda m: self.to_model.append(to_model(m)) or self.to_model[-1])
        monkeypatch.setattr(WeightMirror, "to_stages",
                            lambda m: self.to_stages.append(to_stages(m)) or self.to_stages[-1])


class _ZeroBiasEachEpoch(keras.callbacks.Callback):
    """Writes one weight at each epoch's start and declares that it reads none."""

    reads_model_weights = False

    def on_epoch_begin(self, epoch, logs=None):
        bias = self.model.get_layer("b").bias
        bias.assign(np.zeros(bias.shape, bias.dtype))


def _fit_both(callbacks, epochs=3):
    model = make_mlp()
    reference = twin(model)
    reference.compile(**compile_args("sgd"))
    kwargs = dict(batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                  validation_data=VALIDATION)
    expected = reference.fit(X, Y, callbacks=callbacks(), **kwargs)
    pipe = PipelineModel(model, cuts=["a", "b"], mode="sync")
    pipe.compile(**compile_args("sgd"))
    return pipe, reference, expected, lambda: pipe.fit(X, Y, callbacks=callbacks(), **kwargs)


def test_an_epoch_moves_no_weight_unless_a_callback_may_read_them(monkeypatch):
    pipe, reference, expected, fit = _fit_both(lambda: [keras.callbacks.CSVLogger(
        "/dev/null"), keras.callbacks.EarlyStopping(patience=5)])
    count = _Counting(monkeypatch)
    got = fit()
    n = len(pipe.model.weights)
    assert count.to_stages == [n, 0, 0, 0]  # fit's start (first time: all), each epoch's
    assert [c for c in count.to_model if c] == [n]  # once, at the end of fit
    assert_same_history(got, expected)
    assert_weights_close(pipe.model.get_weights(), reference.get_weights())
    count.to_stages.clear()
    pipe.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0)
    assert count.to_stages == [0, 0]  # a second fit: nothing written meanwhile


def test_a_callback_that_may_read_gets_each_epochs_weights(monkeypatch):
    seen = {"keras": [], "pipe": []}

    def callbacks(tag):
        return lambda: [keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: seen[tag].append(
                [w.copy() for w in (reference if tag == "keras" else pipe.model).get_weights()]))]

    model = make_mlp()
    reference = twin(model)
    reference.compile(**compile_args("sgd"))
    kwargs = dict(batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    reference.fit(X, Y, callbacks=callbacks("keras")(), **kwargs)
    pipe = PipelineModel(model, cuts=["a", "b"], mode="sync")
    pipe.compile(**compile_args("sgd"))
    count = _Counting(monkeypatch)
    pipe.fit(X, Y, callbacks=callbacks("pipe")(), **kwargs)
    assert [c for c in count.to_model if c] == [len(model.weights)] * 3
    for got, expected in zip(seen["pipe"], seen["keras"], strict=True):
        assert_weights_close(got, expected)


def test_a_write_into_a_model_behind_the_stages_wins_as_in_keras(monkeypatch):
    pipe, reference, expected, fit = _fit_both(lambda: [_ZeroBiasEachEpoch()])
    count = _Counting(monkeypatch)
    got = fit()
    assert count.to_stages[1:] == [1, 1, 1]  # each epoch: only the written bias
    assert [c for c in count.to_model if c] == [len(pipe.model.weights)]  # at the end
    assert_same_history(got, expected)
    assert_weights_close(pipe.model.get_weights(), reference.get_weights())
