"""Keras' built-in callbacks on a pipeline, each against the same callback on plain Keras.

A sync pipeline is sequential SGD, so with the same model, initial weights, data order
(`shuffle=False`) and callback it must give Keras' History and the callback's effect (the
files it writes, the learning rates it sets, the epoch it stops or resumes at) within float
tolerance. The learning-rate callbacks in the other modes (against the NumPy reference) are
test_runtime_edges.py's; a rate set at every batch begin is test_keras_knobs.py's. Tiny
models (three Dense layers, 3 stages on /CPU:0..2), 48 examples in 6 mini-batches.
"""

import csv
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_model_api import assert_weights_close, compile_args, make_mlp, sync_pipe, twin

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime.bookkeeping import NonFiniteLossError

BATCH = 8
RTOL = 1e-5


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, n).astype("int32")


X, Y = make_data(48, 1)
VALIDATION = make_data(16, 2)


def fit_both(make_callbacks, epochs, compiled=lambda: compile_args("sgd"), **kwargs):
    """The same fit on plain Keras and on a sync pipeline; `make_callbacks(tag)` gives each
    its own callbacks, `compiled()` the compile arguments. Returns `(pipe, keras_model,
    pipe_history, keras_history)`."""
    kwargs = dict(dict(batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                       validation_data=VALIDATION), **kwargs)
    model = make_mlp()
    reference = twin(model)
    reference.compile(**compiled())
    expected = reference.fit(X, Y, callbacks=make_callbacks("keras"), **kwargs)
    pipe = PipelineModel(model, cuts=["a", "b"], mode="sync")
    pipe.compile(**compiled())
    got = pipe.fit(X, Y, callbacks=make_callbacks("pipe"), **kwargs)
    return pipe, reference, got, expected


def assert_same_history(got, expected):
    assert got.epoch == expected.epoch
    assert sorted(got.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(got.history[key], values, rtol=RTOL, err_msg=key)


def hot_sgd():
    """A learning rate so high that the validation loss goes up and down."""
    return dict(compile_args("sgd"), optimizer=keras.optimizers.SGD(0.8, momentum=0.9))


def test_model_checkpoint_keeps_the_best_epoch_in_files_that_reload_compiled(tmp_path):
    def callbacks(tag):
        return [keras.callbacks.ModelCheckpoint(tmp_path / f"{tag}.keras", save_best_only=True),
                keras.callbacks.ModelCheckpoint(tmp_path / f"{tag}.weights.h5",
                                                save_best_only=True, save_weights_only=True)]

    pipe, _, got, expected = fit_both(callbacks, epochs=5, compiled=hot_sgd)
    assert_same_history(got, expected)
    assert np.argmin(expected.history["val_loss"]) < 4  # "best only" kept an earlier epoch
    best = keras.models.load_model(tmp_path / "keras.keras")
    saved = keras.models.load_model(tmp_path / "pipe.keras")
    assert saved.compiled
    configs = [m.get_compile_config() for m in (saved, best)]
    for config in configs:
        config["optimizer"]["config"].pop("name")  # sgd_<n>: numbered by creation
    assert configs[0] == configs[1]
    assert int(saved.optimizer.iterations) == int(best.optimizer.iterations)
    assert_weights_close(saved.get_weights(), best.get_weights())
    assert_weights_close([v.numpy() for v in saved.optimizer.variables],
                         [v.numpy() for v in best.optimizer.variables])
    expected_logs = best.evaluate(*VALIDATION, verbose=0, return_dict=True)
    assert saved.evaluate(*VALIDATION, verbose=0, return_dict=True) == pytest.approx(
        expected_logs, rel=RTOL)
    assert min(got.history["val_loss"]) == pytest.approx(expected_logs["loss"], rel=RTOL)
    # The weights file: into the pipeline, whose evaluate then gives the best epoch's.
    pipe.load_weights(tmp_path / "pipe.weights.h5")
    assert pipe.evaluate(*VALIDATION, verbose=0, return_dict=True) == pytest.approx(
        expected_logs, rel=RTOL)


def test_early_stopping_stops_at_keras_epoch_and_restores_its_best_weights():
    def callbacks(tag):
        return [keras.callbacks.EarlyStopping(patience=1, restore_best_weights=True)]

    stoppers = {}
    pipe, reference, got, expected = fit_both(
        lambda tag: [stoppers.setdefault(tag, callbacks(tag)[0])], epochs=10, compiled=hot_sgd)
    stopper, pipe_stopper = stoppers["keras"], stoppers["pipe"]
    assert_same_history(got, expected)
    assert 0 < pipe_stopper.stopped_epoch == stopper.stopped_epoch < 9
    assert pipe_stopper.best_epoch == stopper.best_epoch < stopper.stopped_epoch
    assert_weights_close(pipe.get_weights(), reference.get_weights())
    np.testing.assert_allclose(pipe.predict(X, verbose=0), reference.predict(X, verbose=0),
                               rtol=RTOL, atol=1e-6)


def test_callbacks_monitoring_a_metric_find_its_direction_as_in_keras(tmp_path):
    # mode="auto" on "val_accuracy": Keras reads the direction from the compiled metric.
    def callbacks(tag):
        return [keras.callbacks.EarlyStopping(monitor="val_accuracy", patience=1),
                keras.callbacks.ModelCheckpoint(str(tmp_path / f"{tag}.keras"),
                                                monitor="val_accuracy", save_best_only=True)]

    made = {}
    _, _, got, expected = fit_both(lambda tag: made.setdefault(tag, callbacks(tag)), epochs=6,
                                   compiled=hot_sgd)
    assert_same_history(got, expected)
    for ours, theirs in zip(made["pipe"], made["keras"]):
        assert ours.monitor_op == theirs.monitor_op and ours.best == theirs.best
    assert made["pipe"][0].stopped_epoch == made["keras"][0].stopped_epoch


@pytest.mark.parametrize("kind", ["plateau", "scheduler"])
def test_learning_rate_callbacks_set_every_stages_rate_as_keras_sets_it(kind):
    def callbacks(tag):
        if kind == "plateau":  # never improves by 1e9: halves the rate after every epoch
            return [keras.callbacks.ReduceLROnPlateau(factor=0.5, patience=0, min_delta=1e9)]
        return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (1 + epoch))]

    pipe, reference, got, expected = fit_both(callbacks, epochs=3)
    assert_same_history(got, expected)
    assert len(set(expected.history["learning_rate"])) > 1
    assert_weights_close(pipe.get_weights(), reference.get_weights())
    rate = float(reference.optimizer.learning_rate)
    assert float(pipe.optimizer.learning_rate) == pytest.approx(rate)
    assert float(pipe.stage_optimizers[-1].learning_rate) == pytest.approx(rate)


class _Interrupt(keras.callbacks.Callback):
    """Fails at the beginning of epoch `at`, as a crash would."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("interrupted")


def test_backup_and_restore_resumes_an_interrupted_run_where_keras_resumes(tmp_path):
    # Adam: resuming exactly needs every stage's moments and update count back.
    epochs = 4
    kwargs = dict(batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    uninterrupted = make_mlp()
    uninterrupted.compile(**compile_args())
    uninterrupted.fit(X, Y, **kwargs)
    histories = {}
    for tag in ("keras", "pipe"):
        backup = keras.callbacks.BackupAndRestore(tmp_path / tag)
        for attempt in range(2):  # the first is interrupted, the second resumes
            model = make_mlp()
            if tag == "keras":
                trainer = model
                trainer.compile(**compile_args())
            else:
                trainer = sync_pipe(model)
            if attempt == 0:
                with pytest.raises(RuntimeError, match="interrupted"):
                    trainer.fit(X, Y, callbacks=[backup, _Interrupt(at=2)], **kwargs)
            else:
                histories[tag] = trainer.fit(X, Y, callbacks=[backup], **kwargs)
        assert_weights_close(model.get_weights(), uninterrupted.get_weights())
    assert histories["pipe"].epoch == [2, 3]
    assert_same_history(histories["pipe"], histories["keras"])


def _scalars(logdir):
    found = {}
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor)
                if number.dtype.kind == "f":  # scalars (not the model's config text)
                    key = (path.parent.name, value.tag)
                    found.setdefault(key, {})[event.step] = float(number)
    return found


def test_tensorboard_logs_what_keras_logs(tmp_path):
    def callbacks(tag):
        return [keras.callbacks.TensorBoard(tmp_path / tag),
                keras.callbacks.ReduceLROnPlateau(factor=0.5, patience=0, min_delta=1e9)]

    fit_both(callbacks, epochs=2)
    expected, got = _scalars(tmp_path / "keras"), _scalars(tmp_path / "pipe")
    assert ("train", "epoch_learning_rate") in expected
    assert ("validation", "evaluation_loss_vs_iterations") in expected
    assert sorted(got) == sorted(expected)
    for key, values in expected.items():
        assert sorted(got[key]) == sorted(values), key  # the steps (iterations for some)
        np.testing.assert_allclose([got[key][s] for s in sorted(values)],
                                   [values[s] for s in sorted(values)], rtol=RTOL, err_msg=key)


def test_csv_logger_writes_keras_rows(tmp_path):
    def callbacks(tag):
        return [keras.callbacks.CSVLogger(tmp_path / f"{tag}.csv")]

    fit_both(callbacks, epochs=2)
    rows = {}
    for tag in ("keras", "pipe"):
        with open(tmp_path / f"{tag}.csv", newline="") as f:
            rows[tag] = list(csv.DictReader(f))
    assert [list(r) for r in rows["pipe"]] == [list(r) for r in rows["keras"]]
    for got, expected in zip(rows["pipe"], rows["keras"]):
        np.testing.assert_allclose([float(v) for v in got.values()],
                                   [float(v) for v in expected.values()], rtol=RTOL)


def test_progbar_logger_prints_keras_epochs_and_values(capsys):
    def callbacks(tag):
        return [keras.callbacks.ProgbarLogger()]

    capsys.readouterr()
    pipe, reference, got, expected = fit_both(callbacks, epochs=2, verbose=1)
    out = capsys.readouterr().out
    keras_out, pipe_out = out.split("Epoch 1/2", 2)[1:]
    for text in (keras_out, pipe_out):
        assert "Epoch 2/2" in text and "6/6" in text

    def values(text):  # each epoch's last bar (the pipeline updates it once per window)
        ends = [line.split("\r")[-1] for line in text.split("\n") if "6/6" in line]
        return [dict(re.findall(r"(\w+): (-?[\d.]+(?:e[-+]?\d+)?)", line)) for line in ends]

    assert values(pipe_out) == values(keras_out)
    assert len(values(keras_out)) == 2 and "val_loss" in values(keras_out)[0]


def test_terminate_on_nan_stops_at_the_batch_keras_stops_at():
    x = X.copy()
    x[20] = np.nan  # mini-batch 2 (examples 16..23) of every epoch

    def callbacks(tag):
        return [keras.callbacks.TerminateOnNaN()]

    kwargs = dict(batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    model = make_mlp()
    reference = twin(model)
    reference.compile(**compile_args("sgd"))
    batches = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    expected = reference.fit(x, Y, callbacks=callbacks("keras") + [counter], **kwargs)
    pipe = sync_pipe(model, "sgd")
    pipe_batches = []
    pipe_counter = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: pipe_batches.append(b))
    got = pipe.fit(x, Y, callbacks=callbacks("pipe") + [pipe_counter], **kwargs)
    assert pipe_batches == batches == [0, 1, 2]
    assert got.epoch == expected.epoch == [0]
    assert np.isnan(got.history["loss"][0]) and np.isnan(expected.history["loss"][0])
    # Without a per-batch callback the pipeline trains in windows of mini-batches: the same.
    windowed = sync_pipe(make_mlp(), "sgd").fit(x, Y, callbacks=callbacks("pipe"), **kwargs)
    assert windowed.epoch == [0] and np.isnan(windowed.history["loss"][0])
    # Without TerminateOnNaN the pipeline's own stop (on_nan="stop") says where it came from.
    with pytest.raises(NonFiniteLossError, match="mini-batch 2 of epoch 0"):
        sync_pipe(make_mlp(), "sgd").fit(x, Y, **kwargs)
