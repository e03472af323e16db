"""Checkpoints of whole training runs: exact resume, refusals, and stopping by signal.

The reference for "resumes exactly" is the same run without interruption: final weights
and optimizer state must be identical. The storage layer (atomic writes, checksums, a
writer killed with SIGKILL) is tested in test_checkpoint_store.py; here a real train.py
process is interrupted with SIGINT, SIGTERM and SIGKILL.
"""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

from tf_spectrain import batching, checkpoint_store, cli, data
from tf_spectrain.callbacks import PipelineCheckpoint, restore_checkpoint
from tf_spectrain.checkpoint import store
from tf_spectrain.optimizer import SpecTrainSGD
from tf_spectrain.pipeline_model import PipelineModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT, BATCH, EPOCHS = 48, 16, 3  # 3 mini-batches per epoch


def tiny_model(seed=0, width=12):
    """Dropout (random state) and BatchNorm (moving statistics): state beyond the weights."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.AveragePooling2D(4, name="pool")(inputs)
    h = keras.layers.Flatten(name="flatten")(h)
    h = keras.layers.Dense(width, activation="relu", name="dense0")(h)
    h = keras.layers.Dropout(0.3, name="drop")(h)
    h = keras.layers.BatchNormalization(momentum=0.5, name="bn")(h)
    h = keras.layers.Dense(width, activation="relu", name="dense1")(h)
    outputs = keras.layers.Dense(10, name="logits")(h)
    return keras.Model(inputs, outputs, name="tiny")


def pipeline(mode="spectrain", cuts=("dense0", "bn"), width=12):
    pipe = PipelineModel(tiny_model(width=width), cuts=list(cuts), mode=mode)
    pipe.compile(
        SpecTrainSGD(0.05, momentum=0.9, weight_decay=1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ["accuracy"],
    )
    return pipe


def epochs_data(start, stop, skip=0):
    return data.load_epochs(
        "digits", BATCH, epochs=stop, start_epoch=start, skip_batches=skip, seed=7, limit=LIMIT
    )


def train(pipe, start, stop, skip=0, callbacks=None):
    steps = data.steps_per_epoch("digits", BATCH, LIMIT) - skip
    pipe.fit(epochs_data(start, stop, skip), epochs=stop, initial_epoch=start,
             steps_per_epoch=steps, verbose=0, callbacks=callbacks)


def state(pipe):
    """Every stage's variables and optimizer variables, as arrays."""
    out = []
    for stage, optimizer in zip(pipe.stages, pipe.stage_optimizers):
        out += [np.array(v.numpy()) for v in stage.variables]
        out += [np.array(v.numpy()) for v in optimizer.variables]
    return out


def assert_same_state(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("mode", ["spectrain", "stash", "vanilla"])
def test_resumed_after_epoch_e_equals_uninterrupted(mode, tmp_path):
    whole = pipeline(mode)
    train(whole, 0, EPOCHS, callbacks=[PipelineCheckpoint(tmp_path, keep=None)])
    paths = checkpoint_store.list_checkpoints(tmp_path)
    assert [os.path.basename(p) for p in paths] == [
        f"ckpt-e{e:04d}-b000000" for e in range(1, EPOCHS + 1)
    ]
    resumed = pipeline(mode)  # a fresh pipeline, initialised the same way
    info = restore_checkpoint(resumed, paths[0])
    assert (info["epoch"], info["batch"]) == (1, 0)
    train(resumed, info["epoch"], EPOCHS)
    assert_same_state(state(whole), state(resumed))
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_sync_mode_resumes_exactly_even_from_the_middle_of_an_epoch(tmp_path):
    """Sequential SGD has no pipeline state, so a mid-epoch stop and resume changes nothing."""

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.params and batch == 0:
                self.model.stop_training = True

    whole = pipeline("sync")
    train(whole, 0, EPOCHS)
    interrupted = pipeline("sync")
    checkpoint = PipelineCheckpoint(tmp_path)
    train(interrupted, 0, EPOCHS, callbacks=[StopAt(), checkpoint])
    epoch, batch = checkpoint.last_position
    assert epoch == 0 and 0 < batch < 3
    assert os.path.basename(checkpoint.last_path) == f"ckpt-e0000-b{batch:06d}"
    resumed = pipeline("sync")
    info = restore_checkpoint(resumed, checkpoint_store.latest_checkpoint(tmp_path))
    train(resumed, info["epoch"], info["epoch"] + 1, skip=info["batch"])
    train(resumed, info["epoch"] + 1, EPOCHS)
    assert_same_state(state(whole), state(resumed))


def test_keep_retains_the_newest(tmp_path):
    pipe = pipeline()
    train(pipe, 0, EPOCHS, callbacks=[PipelineCheckpoint(tmp_path, keep=2)])
    names = [os.path.basename(p) for p in checkpoint_store.list_checkpoints(tmp_path)]
    assert names == ["ckpt-e0002-b000000", "ckpt-e0003-b000000"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("saved")
    pipe = pipeline("spectrain")
    train(pipe, 0, 1, callbacks=[PipelineCheckpoint(directory, metadata={"seed": 7})])
    return checkpoint_store.latest_checkpoint(directory)


@pytest.mark.parametrize(
    "build, metadata, differences",
    [
        (
            lambda: pipeline("stash"),
            {"seed": 7},
            ["mode: the checkpoint has 'spectrain', this run has 'stash'"],
        ),
        (lambda: pipeline(cuts=("dense0",)), {"seed": 7}, ["num_stages", "cuts"]),
        (lambda: pipeline(width=10), {"seed": 7}, ["architecture"]),
        (lambda: pipeline(), {"seed": 8}, ["extra.seed: the checkpoint has 7, this run has 8"]),
    ],
    ids=["mode", "cuts", "model", "run"],
)
def test_a_different_run_is_refused_with_what_differs(saved, build, metadata, differences):
    pipe = build()
    before = state(pipe)
    with pytest.raises(checkpoint_store.CheckpointError) as info:
        restore_checkpoint(pipe, saved, metadata=metadata)
    message = str(info.value)
    assert saved in message
    for difference in differences:
        assert difference in message
    assert_same_state(before, state(pipe))  # nothing was assigned


def test_a_plain_keras_model_cannot_load_a_pipeline_checkpoint(saved):
    model = tiny_model()
    model.compile(optimizer=SpecTrainSGD(0.05, momentum=0.9), loss="mse")
    kind = "kind: the checkpoint has 'pipeline'"
    with pytest.raises(checkpoint_store.CheckpointError, match=kind):
        restore_checkpoint(model, saved)


def test_a_corrupt_checkpoint_names_the_file(saved, tmp_path):
    import shutil

    copy = tmp_path / os.path.basename(saved)
    shutil.copytree(saved, copy)
    npz = copy / "arrays.npz"
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    npz.write_bytes(bytes(raw))
    pipe = pipeline()
    before = state(pipe)
    with pytest.raises(checkpoint_store.CheckpointError, match=re.escape(str(npz))):
        restore_checkpoint(pipe, str(copy), metadata={"seed": 7})
    assert_same_state(before, state(pipe))


def test_plain_keras_model_round_trip(tmp_path):
    model = tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(epochs_data(0, 1), epochs=1, verbose=0,
              callbacks=[PipelineCheckpoint(tmp_path)])
    other = tiny_model(seed=5)
    other.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    restore_checkpoint(other, checkpoint_store.latest_checkpoint(tmp_path))
    for a, b in zip(model.variables + model.optimizer.variables,
                    other.variables + other.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# --- train.py -------------------------------------------------------------------------------

CLI = ["--model", "mlp", "--gpus", "2", "--limit", "64", "--batch-size", "16"]


def run_cli(argv, capsys):
    code = cli.main(argv)
    return code, capsys.readouterr()


def test_cli_resume_equals_uninterrupted(tmp_path, capsys):
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    assert run_cli(CLI + ["--epochs", "3", "--logdir", whole], capsys)[0] == 0
    assert run_cli(CLI + ["--epochs", "2", "--logdir", split], capsys)[0] == 0
    code, out = run_cli(CLI + ["--epochs", "3", "--logdir", split, "--resume"], capsys)
    assert code == 0
    assert "resuming" in out.out and "ckpt-e0002-b000000" in out.out
    a = keras.models.load_model(os.path.join(whole, "model.keras"), compile=False)
    b = keras.models.load_model(os.path.join(split, "model.keras"), compile=False)
    for x, y in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(x, y)


def test_cli_refuses_to_overwrite_and_to_resume_another_run(tmp_path, capsys):
    logdir = str(tmp_path / "run")
    assert run_cli(CLI + ["--epochs", "1", "--logdir", logdir], capsys)[0] == 0
    with pytest.raises(SystemExit) as exit_info:
        run_cli(CLI + ["--epochs", "2", "--logdir", logdir], capsys)
    assert exit_info.value.code == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        run_cli(CLI + ["--epochs", "2", "--logdir", logdir, "--resume", "--mode", "stash"], capsys)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "mode: the checkpoint has 'spectrain', this run has 'stash'" in err
    with pytest.raises(SystemExit):
        run_cli(CLI + ["--epochs", "2", "--logdir", logdir, "--resume", "--seed", "3"], capsys)
    assert "extra.seed: the checkpoint has 0, this run has 3" in capsys.readouterr().err


def _start(argv, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train.py"), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )


def _wait_for_checkpoint(directory, process, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if checkpoint_store.latest_checkpoint(directory):
            return
        if process.poll() is not None:
            raise AssertionError(f"train.py ended early: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


# 150 mini-batches per epoch: long enough to be interrupted in the middle of epoch 1.
LONG = ["--model", "mlp", "--gpus", "3", "--limit", "600", "--batch-size", "4",
        "--epochs", "2", "--prediction-every", "0"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_drains_saves_and_says_how_to_resume(signum, tmp_path):
    logdir = tmp_path / "run"
    process = _start(LONG + ["--logdir", str(logdir)], tmp_path)
    _wait_for_checkpoint(logdir / "checkpoints", process)
    time.sleep(0.5)  # into epoch 2
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    name = signal.Signals(signum).name
    assert f"{name} received" in err
    match = re.search(r"Stopped by (\w+) at epoch (\d+), after (\d+) of its (\d+) mini-batches. "
                      r"Saved checkpoint (\S+)\.\nTo resume: (.*)", out)
    assert match, out
    epoch, batch = int(match.group(2)), int(match.group(3))
    path, command = match.group(5), match.group(6)
    assert match.group(1) == name and epoch == 1 and 0 < batch < 150
    assert checkpoint_store.latest_checkpoint(logdir / "checkpoints") == path
    assert os.path.basename(path) == f"ckpt-e{epoch:04d}-b{batch:06d}"
    assert "--resume" in command
    if signum == signal.SIGINT:
        # Resuming with the printed command finishes the run and exports the model.
        argv = command.split()[2:]
        finish = _start(argv, tmp_path)
        out, err = finish.communicate(timeout=300)
        assert finish.returncode == 0, err[-3000:]
        assert f"resuming {path}" in out and "test accuracy" in out
        paths = checkpoint_store.list_checkpoints(logdir / "checkpoints")
        names = [os.path.basename(p) for p in paths]
        assert names[-1] == "ckpt-e0002-b000000"
        _assert_loads_without_tf_spectrain(logdir / "model.keras", tmp_path)


def _assert_loads_without_tf_spectrain(path, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        import keras, numpy as np
        model = keras.models.load_model({str(path)!r})
        out = model.predict(np.zeros((2, 32, 32, 3), "float32"), verbose=0)
        assert out.shape == (2, 10), out.shape
        assert not any(m.startswith("tf_spectrain") for m in sys.modules), "imported"
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_sigkill_leaves_a_resumable_run(tmp_path):
    logdir = tmp_path / "run"
    process = _start(LONG + ["--logdir", str(logdir)], tmp_path)
    _wait_for_checkpoint(logdir / "checkpoints", process)
    time.sleep(1.0)
    process.kill()
    process.communicate(timeout=60)
    newest = checkpoint_store.latest_checkpoint(logdir / "checkpoints")
    checkpoint_store.load_checkpoint(newest)  # complete and intact
    finish = _start(LONG + ["--logdir", str(logdir), "--resume"], tmp_path)
    out, err = finish.communicate(timeout=300)
    assert finish.returncode == 0, err[-3000:]
    assert f"resuming {newest}" in out


def test_shuffled_arrays_resume_exactly_through_the_python_api(tmp_path):
    """fit(x, y, shuffle=True): each epoch's order depends on the seed saved in the checkpoint."""
    x, y = data.load_arrays("digits", "train", limit=LIMIT)
    whole = pipeline("spectrain")
    whole.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0,
              callbacks=[PipelineCheckpoint(tmp_path, keep=None)])
    resumed = pipeline("spectrain")
    resumed.shuffle_seed += 1  # as if drawn in another process with another global seed
    info = restore_checkpoint(resumed, checkpoint_store.list_checkpoints(tmp_path)[0])
    assert resumed.shuffle_seed == whole.shuffle_seed
    resumed.fit(x, y, batch_size=BATCH, epochs=EPOCHS, initial_epoch=info["epoch"], verbose=0)
    assert_same_state(state(whole), state(resumed))
    # and the shuffling really changes the order from epoch to epoch, and between fit calls
    orders = []
    for _ in range(3):
        orders.append(next(iter(batching.epoch_batches(
            whole.model, x, y, BATCH, whole.shuffle_seed, whole.epochs_trained
        )))[1].numpy())
        whole.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"keep": 0}, ValueError, r"`keep` must be an integer >= 1 or None. Received: keep=0"),
        ({"keep": "3"}, TypeError, r"`keep` must be an integer >= 1 or None"),  # issue 10, step 3
        ({"metadata": {"when": object()}}, TypeError, r"`metadata` must be a dict of JSON values"),
        ({"metadata": {"lr": float("nan")}}, TypeError, r"`metadata` must be a dict of JSON"),
    ],
)
def test_checkpoint_callback_arguments(kwargs, error, pattern, tmp_path):
    with pytest.raises(error, match=pattern):
        PipelineCheckpoint(tmp_path, **kwargs)


def test_checkpoint_callback_refuses_a_file_as_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="is an existing file"):
        PipelineCheckpoint(blocker)


def _tensor_scalars(logdir, tag):
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


def test_cli_resume_takes_the_new_lr_and_continues_the_step_numbers(tmp_path, capsys):
    logdir = str(tmp_path / "run")
    argv = CLI + ["--logdir", logdir, "--log-every", "1", "--prediction-every", "0"]
    assert run_cli(argv + ["--epochs", "1", "--lr", "0.01"], capsys)[0] == 0
    code, out = run_cli(argv + ["--epochs", "2", "--lr", "0.002", "--resume"], capsys)
    assert code == 0
    assert "--resume: learning rate 0.01 in the checkpoint, 0.002 from now on" in out.out
    rates = _tensor_scalars(logdir, "batch/learning_rate")
    steps = [s for s, _ in rates]
    assert steps == list(range(8))  # 4 mini-batches per epoch, numbered across both runs
    np.testing.assert_allclose([v for _, v in rates], [0.01] * 4 + [0.002] * 4, rtol=1e-6)


def test_a_failed_checkpoint_write_stops_training_and_keeps_the_earlier_ones(tmp_path, monkeypatch):
    pipe = pipeline()
    checkpoint = PipelineCheckpoint(tmp_path)
    calls = []
    original = store.save_checkpoint

    def failing_second_save(*args, **kwargs):
        calls.append(kwargs["epoch"])
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(store, "save_checkpoint", failing_second_save)
    from tf_spectrain.callbacks import CheckpointWriteError

    with pytest.raises(CheckpointWriteError, match=r"epoch 2, mini-batch 0.*No space left.*"
                       r"newest complete checkpoint is .*ckpt-e0001-b000000"):
        train(pipe, 0, EPOCHS, callbacks=[checkpoint])
    assert calls == [1, 2]
    checkpoint_store.load_checkpoint(checkpoint_store.latest_checkpoint(tmp_path))


def test_cli_resume_from_the_middle_of_an_epoch_is_exact_in_sync_mode(
    tmp_path, capsys, monkeypatch
):
    """Stopped after a few mini-batches of epoch 0, resumed: two fit segments, the same
    weights as an uninterrupted run (sequential SGD), step numbers without a gap."""
    from tf_spectrain import training
    from tf_spectrain.callbacks import Telemetry

    whole, split = tmp_path / "whole", tmp_path / "split"
    argv = CLI + ["--epochs", "2", "--mode", "sync", "--log-every", "1"]
    assert run_cli(argv + ["--logdir", str(whole)], capsys)[0] == 0
    args = dataclasses.replace(cli.parse_args(argv + ["--logdir", str(split)]), verbose=0)
    run = training.prepare(args)

    class StopSoon(Telemetry):
        # Asked before the epoch begins, the pipeline feeds exactly one mini-batch.
        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            training.request_stop(run)

    monkeypatch.setattr(training, "Telemetry", StopSoon)
    result = training.train(run)
    monkeypatch.undo()
    epoch, done, total = result["stopped_at"]
    assert result["interrupted"] and (epoch, done, total) == (0, 1, 4)
    code, out = run_cli(argv + ["--logdir", str(split), "--resume"], capsys)
    assert code == 0, out.err
    assert f"at epoch 0, mini-batch {done} of 4" in out.out
    assert "learning rate" not in out.out  # the same --lr: no note
    a = keras.models.load_model(whole / "model.keras", compile=False)
    b = keras.models.load_model(split / "model.keras", compile=False)
    for x, y in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(x, y)
    steps = sorted({s for s, _ in _tensor_scalars(split, "batch/loss")})
    assert steps == list(range(8))


def test_export_is_atomic(tmp_path, monkeypatch):
    from tf_spectrain import training

    model = tiny_model()
    path = tmp_path / "model.keras"
    training.export_model(model, str(path))
    good = path.read_bytes()

    def broken_save(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"half a model")
        raise OSError("disk full")

    monkeypatch.setattr(keras.Model, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        training.export_model(model, str(path))
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]


def test_cli_reports_a_failed_checkpoint_write(tmp_path, capsys, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_checkpoint", full_disk)
    code, out = run_cli(CLI + ["--epochs", "1", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 1
    assert "Could not write the checkpoint of epoch 1, mini-batch 0" in out.err
    assert "No space left on device" in out.err and "Traceback" not in out.err
