"""`PipelineModel`: the Keras-style front (compile / fit / evaluate / predict) and its contract.

Every check compares the pipeline with an independent computation: plain Keras training of
the unsplit model (`sync` mode and one-stage pipelines are sequential SGD, so they must equal
`model.fit`), Keras' own `evaluate` / `predict` on the wrapped model, files written by Keras
callbacks read back with Keras or TensorFlow, or the schedule's closed-form bounds of
SPECTRAIN.md. Numerical equality of the staleness modes with the NumPy reference lives in
test_pipeline_modes.py and is not repeated here.

Models and data are tiny (6x6 images, a few mini-batches) so the whole file runs in well
under a minute; conftest.py has split the CPU into /CPU:0 .. /CPU:3.
"""

import csv
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_spectrain
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.runtime.stage import StageRunner

LR, MOMENTUM = 0.1, 0.9
BATCH = 8
NUM_EXAMPLES = 36  # 4 full mini-batches and a smaller last one of 4
NUM_BATCHES = 5
ATOL = 1e-5


# --- models, data and the plain Keras reference ---------------------------------------------


def make_cnn(batch_norm=True, seed=0):
    """conv1 [bn1] relu1 conv2 [bn2] relu2 flatten logits, on 6x6x2 images, 3 classes."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 2), name="image")
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv1")(inputs)
    if batch_norm:
        # A low momentum moves the moving statistics visibly in a few steps.
        h = keras.layers.BatchNormalization(momentum=0.5, name="bn1")(h)
    h = keras.layers.ReLU(name="relu1")(h)
    h = keras.layers.Conv2D(4, 3, name="conv2")(h)
    if batch_norm:
        h = keras.layers.BatchNormalization(momentum=0.5, name="bn2")(h)
    h = keras.layers.ReLU(name="relu2")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    outputs = keras.layers.Dense(3, name="logits")(h)
    return keras.Model(inputs, outputs, name="cnn")


def make_mlp(seed=0):
    """Four Dense layers dense0..dense3 (cut after each for up to 4 stages)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,), name="features")
    h = inputs
    for n, width in enumerate([8, 8, 8, 3]):
        h = keras.layers.Dense(width, activation=None if n == 3 else "tanh", name=f"dense{n}")(h)
    return keras.Model(inputs, h, name="mlp")


def make_data(n=NUM_EXAMPLES, shape=(6, 6, 2), seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *shape)).astype("float32")
    y = rng.integers(0, 3, size=n).astype("int32")
    return x, y


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def copy_of(model):
    """An independent Keras model with the same architecture and current weights."""
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    return clone


def keras_reference(model, optimizer=None, **fit_kwargs):
    """Trains a copy of `model` with plain `model.fit`; returns (copy, history)."""
    ref = copy_of(model)
    ref.compile(
        optimizer=optimizer or keras.optimizers.SGD(LR, momentum=MOMENTUM),
        loss=loss_fn(),
        metrics=["accuracy"],
    )
    fit_kwargs.setdefault("verbose", 0)
    history = ref.fit(**fit_kwargs)
    return ref, history


_SHARED = {}


def shared_reference(key, model, **fit_kwargs):
    """`keras_reference` for cases that train the same model from the same weights on the
    same mini-batches: Keras trains once per `key`; returns (weights, history dict).

    The cached run must have started from `model`'s current weights (checked)."""
    if key not in _SHARED:
        ref, history = keras_reference(model, **fit_kwargs)
        _SHARED[key] = (model.get_weights(), ref.get_weights(), history.history)
    initial, weights, history = _SHARED[key]
    assert_weights_close(model.get_weights(), initial, atol=0)
    return weights, history


def evaluator(model):
    """A compiled copy of `model` used only to evaluate given weights with Keras."""
    ref = copy_of(model)
    ref.compile(loss=loss_fn(), metrics=["accuracy"])
    return ref


def assert_weights_close(got, expected, atol=ATOL):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)


def max_change(a, b):
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


def compiled_pipe(model, cuts, mode="spectrain", optimizer=None, **kwargs):
    pipe = PipelineModel(model, cuts=cuts, mode=mode, **kwargs)
    pipe.compile(
        optimizer=optimizer or SpecTrainSGD(learning_rate=LR, momentum=MOMENTUM),
        loss=loss_fn(),
        metrics=["accuracy"],
    )
    return pipe


class Recorder(keras.callbacks.Callback):
    """Records the callback calls, the logs and the wrapped model's weights at epoch ends."""

    def __init__(self, evaluate_on=None):
        super().__init__()
        self.evaluate_on = evaluate_on  # (evaluator model, x_val, y_val) or None
        self.batch_ends = {}  # epoch -> list of (batch index, logs)
        self.epochs_begun = []
        self.epoch_logs = []
        self.epoch_weights = []
        self.keras_val = []
        self._epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self.epochs_begun.append(epoch)
        self.batch_ends[epoch] = []

    def on_train_batch_end(self, batch, logs=None):
        self.batch_ends[self._epoch].append((batch, dict(logs or {})))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))
        self.epoch_weights.append(self.model.get_weights())
        if self.evaluate_on is not None:
            ref, xv, yv = self.evaluate_on
            ref.set_weights(self.model.get_weights())
            self.keras_val.append(
                ref.evaluate(xv, yv, batch_size=BATCH, verbose=0, return_dict=True)
            )


# --- 1-3: pipelines that are sequential SGD equal plain model.fit ---------------------------


@pytest.mark.parametrize(
    "mode, optimizer",
    [
        ("spectrain", lambda: SpecTrainSGD(learning_rate=LR, momentum=MOMENTUM)),
        ("sync", lambda: keras.optimizers.SGD(LR, momentum=MOMENTUM)),
    ],
)
def test_one_stage_pipeline_equals_model_fit(mode, optimizer):
    x, y = make_data()
    model = make_cnn()
    initial = model.get_weights()
    ref, ref_history = keras_reference(
        model, optimizer=optimizer(), x=x, y=y, batch_size=BATCH, epochs=3, shuffle=False
    )
    pipe = compiled_pipe(model, cuts=[], mode=mode, optimizer=optimizer())
    history = pipe.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    assert pipe.num_stages == 1
    assert max_change(model.get_weights(), initial) > 1e-2
    # model.get_weights() includes the BatchNorm moving means and variances.
    assert_weights_close(model.get_weights(), ref.get_weights())
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        history.history["accuracy"], ref_history.history["accuracy"], rtol=1e-5
    )


@pytest.mark.parametrize("cuts", [["relu1"], ["bn1", "relu2"]], ids=["N2", "N3"])
def test_sync_with_batch_norm_equals_keras_sgd(cuts):
    x, y = make_data()
    model = make_cnn()
    ref_weights, ref_history = shared_reference(
        "cnn, 2 epochs", model, x=x, y=y, batch_size=BATCH, epochs=2, shuffle=False)
    pipe = compiled_pipe(model, cuts=cuts, mode="sync")
    history = pipe.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert pipe.num_stages == len(cuts) + 1
    bn = model.get_layer("bn2")
    assert max_change(bn.get_weights()[2:], [np.zeros(4), np.ones(4)]) > 1e-2  # stats moved
    assert_weights_close(model.get_weights(), ref_weights)
    np.testing.assert_allclose(history.history["loss"], ref_history["loss"], rtol=1e-5)


@pytest.mark.parametrize("micro_batches, as_dataset", [(2, False), (4, False), (3, True)])
def test_sync_micro_batches_equal_full_batch_keras_sgd(micro_batches, as_dataset):
    # Arrays must split evenly (fit checks it); a dataset's batches of 8 split into 3 are
    # uneven (3, 3, 2): their losses must be weighted by size to give the full-batch mean.
    x, y = make_data()
    model = make_cnn(batch_norm=False)
    ref_weights, ref_history = shared_reference(
        "cnn without BatchNorm, 2 epochs", model, x=x, y=y, batch_size=BATCH, epochs=2,
        shuffle=False)
    pipe = compiled_pipe(model, cuts=["relu1", "relu2"], mode="sync", micro_batches=micro_batches)
    data = dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)) if as_dataset else dict(
        x=x, y=y, batch_size=BATCH, shuffle=False)
    history = pipe.fit(**data, epochs=2, verbose=0)
    assert_weights_close(model.get_weights(), ref_weights)
    np.testing.assert_allclose(history.history["loss"], ref_history["loss"], rtol=1e-5)


# --- 4: datasets, steps_per_epoch, initial_epoch, validation -------------------------------


def test_fit_on_finite_dataset_equals_keras():
    x, y = make_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    model = make_cnn()
    # Keras' fit of the same mini-batches, in the same order (the arrays unshuffled, in
    # batches of BATCH): shared with test_sync_with_batch_norm_equals_keras_sgd.
    ref_weights, ref_history = shared_reference(
        "cnn, 2 epochs", model, x=x, y=y, batch_size=BATCH, epochs=2, shuffle=False)
    pipe = compiled_pipe(model, cuts=["relu1"], mode="sync")
    history = pipe.fit(ds, epochs=2, verbose=0)
    assert_weights_close(model.get_weights(), ref_weights)
    np.testing.assert_allclose(history.history["loss"], ref_history["loss"], rtol=1e-5)


def test_steps_per_epoch_continues_the_repeated_dataset():
    # 2 epochs of 3 steps on a repeated 5-batch dataset consume batches 0-4 then 0 again,
    # in one sequence: the same as Keras fitting those 6 batches as one epoch.
    x, y = make_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    model = make_cnn()
    ref, _ = keras_reference(model, x=ds.repeat().take(6), epochs=1)
    pipe = compiled_pipe(model, cuts=["relu1"], mode="sync")
    recorder = Recorder()
    history = pipe.fit(ds.repeat(), epochs=2, steps_per_epoch=3, verbose=0, callbacks=[recorder])
    assert len(history.history["loss"]) == 2
    assert [len(recorder.batch_ends[e]) for e in (0, 1)] == [3, 3]
    assert_weights_close(model.get_weights(), ref.get_weights())


def test_initial_epoch_runs_the_remaining_epochs():
    x, y = make_data()
    model = make_cnn()
    ref, ref_history = keras_reference(
        model, x=x, y=y, batch_size=BATCH, epochs=3, initial_epoch=1, shuffle=False
    )
    pipe = compiled_pipe(model, cuts=["relu1"], mode="sync")
    recorder = Recorder()
    history = pipe.fit(
        x, y, batch_size=BATCH, epochs=3, initial_epoch=1, shuffle=False, verbose=0,
        callbacks=[recorder],
    )
    assert len(history.history["loss"]) == 3 - 1
    assert history.epoch == ref_history.epoch == [1, 2]
    assert recorder.epochs_begun == [1, 2]
    assert_weights_close(model.get_weights(), ref.get_weights())


@pytest.mark.parametrize("as_dataset", [False, True], ids=["tuple", "dataset"])
def test_validation_logs_equal_keras_evaluate(as_dataset):
    x, y = make_data()
    xv, yv = make_data(n=20, seed=5)  # 2 full validation batches and one of 4
    validation = (xv, yv)
    if as_dataset:
        validation = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(BATCH)
    model = make_cnn()
    recorder = Recorder(evaluate_on=(evaluator(model), xv, yv))
    pipe = compiled_pipe(model, cuts=["relu1"], mode="spectrain")
    history = pipe.fit(
        x, y, batch_size=BATCH, epochs=2, validation_data=validation, verbose=0,
        callbacks=[recorder],
    )
    for epoch, expected in enumerate(recorder.keras_val):
        assert history.history["val_loss"][epoch] == pytest.approx(expected["loss"], rel=1e-5)
        assert history.history["val_accuracy"][epoch] == pytest.approx(
            expected["accuracy"], abs=1e-6
        )
    assert len(recorder.keras_val) == 2


# --- a trained 3-stage pipeline with every callback, shared by the tests below --------------


EPOCHS = 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A BatchNorm CNN trained 3 epochs as a 3-stage SpecTrain pipeline with callbacks."""
    tmp = tmp_path_factory.mktemp("trained")
    x, y = make_data()
    xv, yv = make_data(n=20, seed=5)
    model = make_cnn()
    initial = model.get_weights()
    recorder = Recorder()
    callbacks = [
        keras.callbacks.CSVLogger(str(tmp / "log.csv")),
        keras.callbacks.ModelCheckpoint(str(tmp / "ckpt_{epoch:02d}.keras")),
        keras.callbacks.TensorBoard(str(tmp / "tb")),
        recorder,
    ]
    pipe = compiled_pipe(model, cuts=["bn1", "relu2"], mode="spectrain")
    history = pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    return dict(pipe=pipe, model=model, initial=initial, history=history, recorder=recorder,
                tmp=tmp, x=x, y=y, xv=xv, yv=yv)


# --- 5: evaluate / predict ------------------------------------------------------------------


def test_predict_equals_wrapped_model_predict(trained):
    pipe, model, xv, yv = trained["pipe"], trained["model"], trained["xv"], trained["yv"]
    expected = model.predict(xv, verbose=0)
    np.testing.assert_allclose(pipe.predict(xv), expected, rtol=0, atol=ATOL)
    ds = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(6)
    np.testing.assert_allclose(pipe.predict(ds), expected, rtol=0, atol=ATOL)


def test_evaluate_equals_keras_evaluate(trained):
    pipe, model, xv, yv = trained["pipe"], trained["model"], trained["xv"], trained["yv"]
    expected = evaluator(model).evaluate(xv, yv, batch_size=BATCH, verbose=0, return_dict=True)
    got = pipe.evaluate(xv, yv, batch_size=BATCH, verbose=0, return_dict=True)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    loss, accuracy = pipe.evaluate(xv, yv, verbose=0)
    assert loss == pytest.approx(expected["loss"], rel=1e-5)
    assert accuracy == pytest.approx(expected["accuracy"], abs=1e-6)
    ds = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(7)
    got_ds = pipe.evaluate(ds, verbose=0, return_dict=True)
    assert got_ds["loss"] == pytest.approx(expected["loss"], rel=1e-5)


# --- 6: callbacks ---------------------------------------------------------------------------


def test_history_has_loss_and_accuracy_per_epoch(trained):
    history, recorder = trained["history"], trained["recorder"]
    assert isinstance(history, keras.callbacks.History)
    assert history.epoch == list(range(EPOCHS))
    for key in ("loss", "accuracy"):
        assert len(history.history[key]) == EPOCHS
        assert history.history[key] == [logs[key] for logs in recorder.epoch_logs]
    assert all(0.0 <= a <= 1.0 for a in history.history["accuracy"])


def test_batch_callbacks_run_once_per_mini_batch(trained):
    recorder, history = trained["recorder"], trained["history"]
    for epoch in range(EPOCHS):
        ends = recorder.batch_ends[epoch]
        assert [i for i, _ in ends] == list(range(NUM_BATCHES))
        assert all("loss" in logs for _, logs in ends)
        # The last batch's running mean is the epoch's loss.
        assert ends[-1][1]["loss"] == pytest.approx(history.history["loss"][epoch], rel=1e-6)


def test_csv_logger_writes_one_row_per_epoch(trained):
    with open(trained["tmp"] / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    history = trained["history"].history
    assert [int(r["epoch"]) for r in rows] == list(range(EPOCHS))
    np.testing.assert_allclose([float(r["loss"]) for r in rows], history["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        [float(r["accuracy"]) for r in rows], history["accuracy"], rtol=1e-6
    )


def test_model_checkpoint_saves_the_true_weights_of_each_epoch(trained):
    recorder, tmp = trained["recorder"], trained["tmp"]
    for epoch in range(EPOCHS):
        path = tmp / f"ckpt_{epoch + 1:02d}.keras"
        assert path.exists(), sorted(os.listdir(tmp))
        loaded = keras.models.load_model(path)
        assert_weights_close(loaded.get_weights(), recorder.epoch_weights[epoch], atol=0)
    # Weights changed from epoch to epoch, so the comparison above can tell epochs apart.
    assert max_change(recorder.epoch_weights[0], recorder.epoch_weights[1]) > 1e-3


def _tensorboard_scalars(logdir, tag):
    values = {}
    for root, _, files in os.walk(logdir):
        for name in files:
            if not name.startswith("events.out.tfevents"):
                continue
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                for value in event.summary.value:
                    if value.tag == tag:
                        values[event.step] = float(tf.make_ndarray(value.tensor))
    return [values[step] for step in sorted(values)]


def test_tensorboard_writes_epoch_loss(trained):
    logged = _tensorboard_scalars(trained["tmp"] / "tb" / "train", "epoch_loss")
    np.testing.assert_allclose(logged, trained["history"].history["loss"], rtol=1e-6)


def test_early_stopping_stops_training():
    x, y = _mlp_data(NUM_BATCHES)
    pipe = compiled_pipe(make_mlp(), cuts=["dense1"], mode="stash")
    stopper = keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=0)
    history = pipe.fit(x, y, batch_size=BATCH, epochs=10, verbose=0, callbacks=[stopper])
    # Epoch 0 sets the baseline; epoch 1 cannot improve by 1e9, so training stops there.
    assert len(history.history["loss"]) == 2
    assert stopper.stopped_epoch == 1


def test_predict_follows_weights_restored_by_early_stopping():
    # restore_best_weights writes epoch 0's weights into the wrapped model after the
    # pipeline copied its epoch-1 weights back; predict/evaluate must use the model's.
    x, y = _mlp_data(NUM_BATCHES)
    model = make_mlp()
    recorder = Recorder()
    stopper = keras.callbacks.EarlyStopping(
        monitor="loss", min_delta=1e9, patience=0, restore_best_weights=True
    )
    pipe = compiled_pipe(model, cuts=["dense1"], mode="sync")
    pipe.fit(x, y, batch_size=BATCH, epochs=10, verbose=0, callbacks=[recorder, stopper])
    assert_weights_close(model.get_weights(), recorder.epoch_weights[0], atol=0)
    assert max_change(recorder.epoch_weights[0], recorder.epoch_weights[1]) > 1e-3
    np.testing.assert_allclose(pipe.predict(x), model.predict(x, verbose=0), rtol=0, atol=ATOL)
    expected = evaluator(model).evaluate(x, y, verbose=0, return_dict=True)
    got = pipe.evaluate(x, y, verbose=0, return_dict=True)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_verbose_controls_the_progress_bar_and_tensorboard_logs_the_learning_rate(
    capsys, tmp_path
):
    # One pipeline for both (each costs its tracing): the second fit logs to TensorBoard.
    x, y = _mlp_data(NUM_BATCHES)
    pipe = compiled_pipe(make_mlp(), cuts=["dense1"], mode="spectrain")
    capsys.readouterr()
    pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert capsys.readouterr().out == ""
    pipe.fit(x, y, batch_size=BATCH, epochs=2, verbose=1,
             callbacks=[keras.callbacks.TensorBoard(str(tmp_path))])
    out = capsys.readouterr().out
    assert "Epoch 1/2" in out and "Epoch 2/2" in out
    assert f"{NUM_BATCHES}/{NUM_BATCHES}" in out
    assert "loss:" in out and "accuracy:" in out
    logged = _tensorboard_scalars(tmp_path / "train", "epoch_learning_rate")
    np.testing.assert_allclose(logged, [LR, LR], rtol=1e-6)


# --- 7: the wrapped model holds the trained weights -----------------------------------------


def test_wrapped_model_equals_stage_copies_after_fit(trained):
    pipe, model = trained["pipe"], trained["model"]
    covered = set()
    for stage in pipe.stages:
        for layer in stage.layers:
            if not layer.weights:
                continue
            covered.add(layer.name)
            assert_weights_close(
                model.get_layer(layer.name).get_weights(), layer.get_weights(), atol=0
            )
    assert covered == {layer.name for layer in model.layers if layer.weights}
    assert max_change(model.get_weights(), trained["initial"]) > 1e-2
    # The last epoch end's weights are what fit leaves behind.
    assert_weights_close(model.get_weights(), trained["recorder"].epoch_weights[-1], atol=0)


def test_saved_model_loads_without_tf_spectrain(trained, tmp_path, keras_only):
    # keras_only: conftest's process that imports Keras, never tf_spectrain (shared with
    # test_checkpointing's check of train.py's export).
    model, xv = trained["model"], trained["xv"]
    model_path = tmp_path / "trained.keras"
    model.save(model_path)
    predicted = keras_only.predict(model_path, xv)
    np.testing.assert_allclose(predicted, model.predict(xv, verbose=0), atol=1e-6)


# --- 8: placement ---------------------------------------------------------------------------


def _device_suffix(name):
    spec = tf.DeviceSpec.from_string(name)
    return f"{spec.device_type}:{spec.device_index}"


def test_default_devices_are_the_first_n(trained):
    assert trained["pipe"].devices == ["/CPU:0", "/CPU:1", "/CPU:2"]


def test_stage_variables_and_optimizer_slots_live_on_their_device():
    devices = ["/CPU:2", "/CPU:0", "/CPU:3"]
    pipe = compiled_pipe(make_cnn(), cuts=["bn1", "relu2"], devices=devices)
    assert pipe.devices == devices
    for stage, optimizer, device in zip(pipe.stages, pipe.stage_optimizers, devices):
        suffix = _device_suffix(device)
        assert stage.variables, "every stage of this model has weights"
        for v in stage.variables:  # trainable and BatchNorm statistics
            assert v.value.device.endswith(suffix), (v.path, v.value.device, device)
        for v in stage.trainable_variables:
            slot = optimizer.momentum_of(v)
            assert slot.value.device.endswith(suffix), (v.path, slot.value.device, device)
        for v in optimizer.variables:  # iterations, learning rate, slots
            assert v.value.device.endswith(suffix), (v.path, v.value.device, device)


# --- 9: memory: what a stage keeps in flight ------------------------------------------------


@pytest.fixture
def forward_spy(monkeypatch):
    """Records (stage, key, keeps the tape, in_flight after the forward, keep) of every forward.

    It spies on the pass-by-pass runner, so pipelines run pass by pass (as with
    `run_eagerly=True`); test_windows.py checks that windows give the same weights.
    """
    monkeypatch.setattr(tf_spectrain.front.fitting, "window_size", lambda *args: None)
    calls = []
    original = StageRunner.forward

    def spy(self, key, inputs, keep, *args, **kwargs):
        result = original(self, key, inputs, keep, *args, **kwargs)
        calls.append((self.k, key, keep in (True, "activations"), self.in_flight, keep))
        return result

    monkeypatch.setattr(StageRunner, "forward", spy)
    return calls


def _mlp_data(num_batches):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(num_batches * BATCH, 5)).astype("float32")
    return x, rng.integers(0, 3, size=num_batches * BATCH).astype("int32")


@pytest.mark.parametrize("num_batches", [2, 6])
def test_stash_keeps_at_most_n_minus_k_mini_batches(forward_spy, num_batches):
    n = 4
    pipe = compiled_pipe(make_mlp(), cuts=["dense0", "dense1", "dense2"], mode="stash")
    pipe.fit(*_mlp_data(num_batches), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for k in range(n):
        mine = [c for c in forward_spy if c[0] == k]
        assert len(mine) == num_batches
        # Stage k runs min(N - k, T) warm-up forwards before its first backward.
        assert max(c[3] for c in mine) == min(n - k, num_batches)
        assert all(c[2] for c in mine)  # stashing reuses the forward's activations
    assert all(r.in_flight == 0 for r in pipe.runners)  # drained


def test_spectrain_paper_keeps_no_tape_where_weights_differ(forward_spy):
    # Stages 0..N-2 run B(i) with other weights than F(i) (updates in between or
    # s_f != s_b), so they keep no tape and recompute. The last stage runs F(i), B(i)
    # back to back with s_f = s_b: always the same weights, so it keeps the tape.
    n, num_batches = 4, 5
    pipe = compiled_pipe(make_mlp(), cuts=["dense0", "dense1", "dense2"], mode="spectrain")
    pipe.fit(*_mlp_data(num_batches), batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    for k in range(n):
        kept = [c[2] for c in forward_spy if c[0] == k]
        assert len(kept) == 2 * num_batches
        if k == n - 1:
            assert all(kept)
        else:
            assert kept == [False] * (2 * num_batches)
        assert max(c[3] for c in forward_spy if c[0] == k) <= n - k


# --- 10: bad input --------------------------------------------------------------------------


def test_public_api_is_exported():
    assert tf_spectrain.PipelineModel is PipelineModel
    assert tf_spectrain.SpecTrainSGD is SpecTrainSGD


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(mode="specrain"), ValueError, r"mode.*'specrain'.*did you mean 'spectrain'"),
        (dict(spectrain_target="papr"), ValueError, r"spectrain_target.*'papr'"),
        (dict(micro_batches=0), ValueError, r"micro_batches=0"),
        (dict(schedule="1f1b", mode="stash"), ValueError, r"schedule.*'1f1b'.*mode='stash'"),
        (dict(schedule="gpipe2"), ValueError, r"schedule.*'gpipe2'.*did you mean 'gpipe'"),
        (dict(recompute="sometimes"), ValueError, r"recompute.*\['auto', 'always'\]"),
        (dict(devices=["/CPU:0"]), ValueError, r"2 stages.*'/CPU:0'"),
        (dict(devices=["/CPU:0", "/CPU:9"]), ValueError, r"/CPU:9"),
        (dict(devices=["/CPU:0", "cpu-one"]), ValueError, r"cpu-one"),
        (dict(devices="/CPU:0"), TypeError, r"devices='/CPU:0'"),
        (dict(model="not a model"), TypeError, r"keras.Model.*not a model"),
        (dict(cuts=["dense_1"]), ValueError, r"'dense_1'.*did you mean 'dense1'"),
        (dict(cuts="dense1"), TypeError, r"cuts='dense1'"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, pattern):
    args = dict(model=make_mlp(), cuts=["dense1"])
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        PipelineModel(**args)


def test_spectrain_wraps_a_plain_keras_optimizer_and_trains_as_spectrain_sgd():
    # compile wraps Keras' SGD in SpecTrain; its momentum rule is SpecTrainSGD's, so the
    # two pipelines take the same steps (a different d, e.g. the last update, would not).
    x, y = _mlp_data(4)
    weights = []
    for optimizer in (keras.optimizers.SGD(LR, momentum=MOMENTUM),
                      SpecTrainSGD(LR, momentum=MOMENTUM)):
        pipe = compiled_pipe(make_mlp(), cuts=["dense1"], optimizer=optimizer)
        assert all(isinstance(r.optimizer, tf_spectrain.SpecTrain) for r in pipe.runners)
        pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        weights.append([np.array(w) for w in pipe.model.get_weights()])
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert pipe.runners[0].optimizer.rule == "momentum"


def test_fit_before_compile_is_an_error():
    x, y = _mlp_data(2)
    pipe = PipelineModel(make_mlp(), cuts=["dense1"], mode="sync")
    # As keras.Model.fit: a ValueError that says to call compile().
    with pytest.raises(ValueError, match=r"compile"):
        pipe.fit(x, y, epochs=1, verbose=0)


@pytest.fixture(scope="module")
def sync_pipe():
    return compiled_pipe(make_mlp(), cuts=["dense1"], mode="sync")


@pytest.mark.parametrize(
    "make_kwargs, pattern",
    [
        (lambda x, y: dict(x=x, y=y[:-1]), r"same number of examples.*16 and 15"),
        (lambda x, y: dict(x=x, y=y, epochs=0), r"epochs=0"),
        (lambda x, y: dict(x=x, y=y, batch_size=0), r"batch_size=0"),
        (
            lambda x, y: dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()),
            r"steps_per_epoch",
        ),
        (lambda x, y: dict(x=x, y=y, steps_per_epoch=0), r"steps_per_epoch=0"),
        (lambda x, y: dict(x=x, y=y, validation_data=(x, y, y, y)), r"validation_data.*4"),
    ],
    ids=["xy_length", "epochs0", "batch0", "infinite", "steps0", "val4"],
)
def test_fit_rejects_bad_arguments(sync_pipe, make_kwargs, pattern):
    x, y = _mlp_data(2)
    kwargs = dict(verbose=0)
    kwargs.update(make_kwargs(x, y))
    with pytest.raises(ValueError, match=pattern):
        sync_pipe.fit(**kwargs)


def test_learning_rate_callbacks_reach_every_stage():
    x, y = _mlp_data(NUM_BATCHES)
    pipe = compiled_pipe(make_mlp(), cuts=["dense0", "dense1", "dense2"], mode="stash")
    seen = []

    class Spy(keras.callbacks.Callback):
        # At the epoch end every stage has applied all of the epoch's mini-batches (the
        # rate each update used is checked against the NumPy reference in
        # test_keras_knobs.py).
        def on_epoch_end(self, epoch, logs=None):
            seen.append([float(o.learning_rate) for o in pipe.stage_optimizers])

    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (epoch + 1))
    pipe.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[schedule, Spy()])
    expected = [[0.1 / (e + 1)] * 4 for e in range(3)]
    np.testing.assert_allclose(seen, expected, rtol=1e-6)


# TensorBoard's learning rate: test_verbose_controls_the_progress_bar_and_tensorboard_logs_
# the_learning_rate.


def test_model_with_two_inputs_takes_a_list_of_arrays():
    keras.utils.set_random_seed(5)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Concatenate(name="join")([a, b])
    h = keras.layers.Dense(6, activation="relu", name="hidden")(h)
    out = keras.layers.Dense(3, name="out")(h)
    model = keras.Model([a, b], out)
    reference = copy_of(model)
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    y = rng.integers(0, 3, 16)
    pipe = compiled_pipe(model, cuts=["hidden"], mode="sync",
                         optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM))
    pipe.fit([xa, xb], y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    reference.compile(keras.optimizers.SGD(LR, momentum=MOMENTUM), loss_fn())
    reference.fit([xa, xb], y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), reference.get_weights())
    np.testing.assert_allclose(pipe.predict([xa, xb]), reference.predict([xa, xb], verbose=0),
                               atol=1e-5)


def test_devices_may_repeat_a_name():
    # Two stages on one device still follow the pipeline semantics (sync == Keras SGD).
    x, y = _mlp_data(NUM_BATCHES)
    model = make_mlp()
    reference = copy_of(model)
    pipe = compiled_pipe(model, cuts=["dense1"], mode="sync", devices=["/CPU:1", "/CPU:1"],
                         optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM))
    assert pipe.devices == ["/CPU:1", "/CPU:1"]
    pipe.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    reference.compile(keras.optimizers.SGD(LR, momentum=MOMENTUM), loss_fn())
    reference.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), reference.get_weights())
    assert all(v.value.device.endswith("CPU:1") for s in pipe.stages for v in s.weights)


@pytest.mark.parametrize("cuts", [[], ["dense0", "dense2"]])
def test_layer_losses_train_and_report_as_in_keras(cuts):
    # Weight and activity regularizers on several stages: sync equals model.fit, both in
    # the weights (the penalties enter each stage's gradient) and in the reported losses.
    keras.utils.set_random_seed(6)
    inputs = keras.Input((5,))
    h = inputs
    for n, width in enumerate([8, 8, 8, 3]):
        h = keras.layers.Dense(
            width, activation=None if n == 3 else "tanh", name=f"dense{n}",
            kernel_regularizer=keras.regularizers.L2(0.05),
            activity_regularizer=keras.regularizers.L1(0.01) if n == 1 else None,
        )(h)
    model = keras.Model(inputs, h)
    x, y = _mlp_data(NUM_BATCHES)
    # Keras' fit (once for both cut lists; the metric is not compared)
    ref_weights, expected = shared_reference(
        "regularized mlp, 2 epochs", model, x=x, y=y, batch_size=BATCH, epochs=2,
        shuffle=False, validation_data=(x, y))
    pipe = compiled_pipe(model, cuts=cuts, mode="sync",
                         optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM))
    history = pipe.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                       validation_data=(x, y))
    assert_weights_close(model.get_weights(), ref_weights)
    np.testing.assert_allclose(history.history["loss"], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["val_loss"], expected["val_loss"], rtol=1e-5)


def test_default_devices_too_few_says_how_to_get_more():
    # conftest made 4 logical devices; 6 stages need 6.
    model = keras.Sequential(
        [keras.Input((5,))] + [keras.layers.Dense(4, name=f"d{n}") for n in range(6)]
    )
    with pytest.raises(ValueError, match=r"needs 6 distinct devices, but only 4 exist.*"
                                         r"setup_devices\(6\)"):
        PipelineModel(model, cuts=[f"d{n}" for n in range(5)], mode="stash")


def _dropout_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(16, activation="relu", name="dense0")(inputs)
    h = keras.layers.Dropout(0.5, seed=seed, name="drop")(h)
    h = keras.layers.Dense(8, activation="relu", name="dense1")(h)
    out = keras.layers.Dense(3, name="dense2")(h)
    return keras.Model(inputs, out)


def _train_one_batch(model, mode, num_batches=1, **options):
    x, y = _mlp_data(num_batches)
    pipe = compiled_pipe(model, cuts=["drop"], mode=mode, **options)
    pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize("mode", ["stash", "vanilla", "sync"])
def test_recompute_always_keeps_inputs_only_with_the_forwards_masks(forward_spy, mode):
    # Dropout and BatchNorm before the cut: a recompute with another mask, or with batch
    # statistics that moved, gives other weights. Stash recomputes at a kept copy of the
    # forward's weights, vanilla at the backward's, sync at the unchanged ones.
    def model(seed):
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((5,))
        h = keras.layers.Dense(16, activation="relu", name="dense0")(inputs)
        h = keras.layers.BatchNormalization(name="bn")(h)
        h = keras.layers.Dropout(0.5, seed=seed, name="drop")(h)
        h = keras.layers.Dense(8, activation="relu", name="dense1")(h)
        return keras.Model(inputs, keras.layers.Dense(3, name="dense2")(h))

    auto = _train_one_batch(model(3), mode, 4, micro_batches=2)
    del forward_spy[:]
    always = _train_one_batch(model(3), mode, 4, micro_batches=2, recompute="always")
    assert not any(c[2] for c in forward_spy)  # no forward kept its activations
    kinds = {c[4] for c in forward_spy if c[0] == 0}
    assert kinds == ({"inputs", "weights"} if mode == "stash" else {"inputs"})
    assert_weights_close(always, auto, atol=1e-6)
    assert max_change(_train_one_batch(model(4), mode, 4, micro_batches=2), auto) > 1e-3


def test_recomputation_draws_the_forwards_dropout_mask(forward_spy):
    # One mini-batch: no update happens between F(0) and B(0), so paper SpecTrain's
    # recomputed backward (stage 0: s_f != s_b, recomputed) must equal stash's backward
    # through the kept activations, which holds only if the recomputation draws the same
    # dropout mask as the forward.
    stash = _train_one_batch(_dropout_model(3), "stash")
    paper = _train_one_batch(_dropout_model(3), "spectrain")
    paper_calls = forward_spy[2:]  # after stash's two forwards (stage 0, stage 1)
    assert [(c[0], c[2]) for c in paper_calls] == [(0, False), (1, True)]  # stage 0 recomputes
    assert_weights_close(paper, stash, atol=1e-6)
    # The comparison can fail: another mask gives other weights.
    other = _train_one_batch(_dropout_model(4), "stash")
    assert max_change(other, stash) > 1e-3


@pytest.mark.parametrize("mode", ["vanilla", "spectrain", "stash"])
def test_batch_norm_statistics_move_once_per_mini_batch(mode):
    # A BatchNorm on the raw input of stage 0: its moving mean depends only on the data,
    # so after T mini-batches it must be the T-step moving average computed in NumPy; a
    # recomputation that updated it too would make 2T steps.
    keras.utils.set_random_seed(7)
    inputs = keras.Input((5,))
    h = keras.layers.BatchNormalization(momentum=0.5, name="bn")(inputs)
    h = keras.layers.Dense(8, activation="relu", name="dense0")(h)
    out = keras.layers.Dense(3, name="dense1")(h)
    model = keras.Model(inputs, out)
    x, y = _mlp_data(NUM_BATCHES)
    x = x + 3.0  # away from the initial moving mean 0
    pipe = compiled_pipe(model, cuts=["dense0"], mode=mode)
    pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    expected = np.zeros(5)
    for i in range(0, len(x), BATCH):
        expected = 0.5 * expected + 0.5 * x[i:i + BATCH].mean(axis=0)
    np.testing.assert_allclose(model.get_layer("bn").moving_mean.numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("loss_name", ["sparse_categorical_crossentropy", "mse"])
def test_a_loss_given_by_name_averages_over_the_batch_as_in_keras(loss_name):
    """`loss="mse"` resolves to a per-example function; like Keras, the pipeline averages it."""
    model = make_mlp()
    x, y = make_data(n=32, shape=(5,))
    targets = y if loss_name.startswith("sparse") else np.eye(3, dtype="float32")[y]
    ref = copy_of(model)
    ref.compile(optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM), loss=loss_name)
    ref_history = ref.fit(x, targets, batch_size=8, epochs=2, shuffle=False, verbose=0)
    pipe = PipelineModel(model, cuts=["dense1"], mode="sync")
    pipe.compile(optimizer=SpecTrainSGD(LR, momentum=MOMENTUM), loss=loss_name)
    history = pipe.fit(x, targets, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights())
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-5)
