"""Checkpoints of whole training runs through train.py: exact resume, refusals, stopping by
signal. This is the cross-cutting resume suite (CLI, training, checkpoint package together).

The reference for "resumes exactly" is the same run without interruption: final weights
must be identical. The parts are tested alone elsewhere: the storage layer (atomic writes,
checksums, a writer killed with SIGKILL) in test_checkpoint_store.py and
test_checkpoint_format.py, saving and restoring a pipeline's state in
test_checkpoint_state.py, the Keras callback in test_checkpoint_callback.py; here a real
train.py process is interrupted with SIGINT and SIGKILL, and `cli.main` (train.py's main,
in this process) with SIGTERM.
"""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from tf_spectrain import checkpoint as checkpoint_store
from tf_spectrain.app import cli
from tf_spectrain.checkpoint import store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CLI = ["--model", "mlp", "--gpus", "2", "--limit", "64", "--batch-size", "16"]
# The same with given cuts, for the runs whose checks do not involve planning (a plan
# profiles the model first; test_cli_resume_equals_uninterrupted resumes a planned run).
CUT = CLI + ["--cuts", "dense1"]


def run_cli(argv, capsys):
    code = cli.main(argv)
    return code, capsys.readouterr()


def test_cli_resume_equals_uninterrupted(tmp_path, capsys, monkeypatch):
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    assert run_cli(CLI + ["--epochs", "2", "--logdir", split], capsys)[0] == 0
    saved = store.load_checkpoint(store.latest_checkpoint(os.path.join(split, "checkpoints")))
    cuts = saved[1]["metadata"]["cuts"]  # planned (--cuts auto); timings may plan others
    assert run_cli(CLI + ["--epochs", "3", "--logdir", whole, "--cuts", ",".join(cuts)],
                   capsys)[0] == 0

    # The resumed run must train at the checkpoint's cuts, never at a fresh plan.
    from tf_spectrain.costmodel import autoplan

    def no_planning(*args, **kwargs):
        raise AssertionError("--resume planned new cuts")

    monkeypatch.setattr(autoplan, "auto_partition", no_planning)
    code, out = run_cli(CLI + ["--epochs", "3", "--logdir", split, "--resume"], capsys)
    assert code == 0
    assert "resuming" in out.out and "ckpt-e0002-b000000" in out.out
    assert f"using the checkpoint's cuts {', '.join(cuts)}" in out.out
    a = keras.models.load_model(os.path.join(whole, "model.keras"), compile=False)
    b = keras.models.load_model(os.path.join(split, "model.keras"), compile=False)
    for x, y in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(x, y)


def test_cli_refuses_to_overwrite_and_to_resume_another_run(tmp_path, capsys, monkeypatch):
    logdir = str(tmp_path / "run")
    assert run_cli(CUT + ["--epochs", "1", "--logdir", logdir], capsys)[0] == 0
    with pytest.raises(SystemExit) as exit_info:
        run_cli(CUT + ["--epochs", "2", "--logdir", logdir], capsys)
    assert exit_info.value.code == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        run_cli(CUT + ["--epochs", "2", "--logdir", logdir, "--resume", "--mode", "stash"], capsys)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "mode: the checkpoint has 'spectrain', this run has 'stash'" in err
    with pytest.raises(SystemExit):
        run_cli(CUT + ["--epochs", "2", "--logdir", logdir, "--resume", "--seed", "3"], capsys)
    assert "extra.seed: the checkpoint has 0, this run has 3" in capsys.readouterr().err
    # refused before cuts are planned for another number of stages (profiling takes long)
    from tf_spectrain.costmodel import autoplan

    def no_planning(*args, **kwargs):
        raise AssertionError("planned cuts before refusing the checkpoint")

    monkeypatch.setattr(autoplan, "auto_partition", no_planning)
    other = ["--model", "mlp", "--gpus", "3", "--limit", "64", "--batch-size", "16"]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(other + ["--epochs", "2", "--logdir", logdir, "--resume", "--mode", "stash"],
                capsys)
    assert exit_info.value.code == 2
    assert "mode: the checkpoint has 'spectrain', this run has 'stash'" in capsys.readouterr().err


def _start(argv, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train.py"), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )


def _wait_for_checkpoint(directory, process, after=None, timeout=120):
    """Waits for a checkpoint in `directory` other than `after` (a newer one); returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newest = checkpoint_store.latest_checkpoint(directory)
        if newest is not None and newest != after:
            return newest
        if process.poll() is not None:
            raise AssertionError(f"train.py ended early: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


# 100 mini-batches per epoch (several seconds): long enough to be interrupted in the middle
# of an epoch, 0.5 s (a signal) or 1 s (SIGKILL) after the checkpoint of the epoch before.
# Pass by pass (--run-eagerly), so that an epoch lasts long enough to be interrupted in the
# middle (windows run these 100 mini-batches in a fraction of a second).
LONG = ["--model", "mlp", "--gpus", "3", "--limit", "400", "--batch-size", "4",
        "--epochs", "3", "--prediction-every", "0", "--run-eagerly"]


STOPPED = (r"Stopped by (\w+) at epoch (\d+), after (\d+) of its (\d+) mini-batches. "
           r"Saved checkpoint (\S+)\.\nTo resume: (.*)")


def test_sigint_drains_saves_and_says_how_to_resume(tmp_path, keras_only):
    """A real train.py process, SIGINT from outside at an arbitrary moment of epoch 2."""
    logdir = tmp_path / "run"
    process = _start(LONG + ["--logdir", str(logdir)], tmp_path)
    _wait_for_checkpoint(logdir / "checkpoints", process)
    time.sleep(0.5)  # into epoch 2
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    path, command = _assert_stopped_and_saved(out, err, "SIGINT", logdir, 100)
    _sigkill_then_finish(command.split()[2:], path, logdir, tmp_path)
    # The exported model loads, and predicts, in a process without tf_spectrain.
    out = keras_only.predict(logdir / "model.keras", np.zeros((2, 32, 32, 3), "float32"))
    assert out.shape == (2, 10), out.shape


def test_sigterm_drains_saves_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    """The same handler takes SIGTERM (`_StopOnSignal.install` handles both signals).

    In process (a separate train.py costs ~14 s of CPU, mostly imports): `cli.main` installs
    the handler, and the kernel delivers a SIGTERM this process sends itself from a callback
    in the middle of epoch 2 (epoch index 1); the handler runs in the main thread as it
    would in train.py. SIGINT is sent from outside, at an arbitrary moment, in
    test_sigint_drains_saves_and_says_how_to_resume."""
    from tf_spectrain.app import training
    from tf_spectrain.callbacks import Telemetry

    class TermMidEpoch(Telemetry):
        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            if self.epoch == 1 and batch == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(training, "Telemetry", TermMidEpoch)
    unhandled = []  # SIGTERMs that reached the handler main replaces (not pytest's death)

    def fallback(signum, frame):
        unhandled.append(signum)

    previous = signal.signal(signal.SIGTERM, fallback)
    logdir = tmp_path / "run"
    argv = ["--model", "mlp", "--gpus", "3", "--cuts", "dense1,dense2", "--limit", "128",
            "--batch-size", "4", "--epochs", "2", "--prediction-every", "0",
            "--logdir", str(logdir)]
    try:
        code, captured = run_cli(argv, capsys)
        restored = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 0, captured.err[-3000:]
    assert not unhandled and restored is fallback  # main handled it, then restored ours
    _assert_stopped_and_saved(captured.out, captured.err, "SIGTERM", logdir, 32)


def _assert_stopped_and_saved(out, err, name, logdir, per_epoch):
    """Checks the drain message of a stop by `name` in epoch 1; returns (checkpoint, command)."""
    assert "Traceback" not in err
    assert f"{name} received" in err
    match = re.search(STOPPED, out)
    assert match, out
    epoch, batch = int(match.group(2)), int(match.group(3))
    path, command = match.group(5), match.group(6)
    assert match.group(1) == name and epoch == 1 and 0 < batch < per_epoch
    assert int(match.group(4)) == per_epoch
    assert checkpoint_store.latest_checkpoint(logdir / "checkpoints") == path
    assert os.path.basename(path) == f"ckpt-e{epoch:04d}-b{batch:06d}"
    assert "--resume" in command
    return path, command


def _sigkill_then_finish(argv, stopped_at, logdir, tmp_path):
    """The printed command resumes the run; killed (SIGKILL) 1 s after its next epoch-end
    checkpoint, it leaves a resumable run: the same command resumes it from that
    checkpoint, finishes and exports the model (which the caller loads without tf_spectrain).

    (One chain of runs for both checks: each train.py costs seconds of imports.)"""
    directory = logdir / "checkpoints"
    resumed = _start(argv, tmp_path)
    _wait_for_checkpoint(directory, resumed, after=stopped_at)  # epoch 2's end
    time.sleep(1.0)  # into epoch 3
    resumed.kill()
    out, _ = resumed.communicate(timeout=60)
    assert f"resuming {stopped_at}" in out  # train.py flushes that line
    newest = checkpoint_store.latest_checkpoint(directory)
    assert newest != stopped_at  # written by the killed run, after it resumed
    checkpoint_store.load_checkpoint(newest)  # complete and intact
    finish = _start(argv, tmp_path)
    out, err = finish.communicate(timeout=300)
    assert finish.returncode == 0, err[-3000:]
    assert f"resuming {newest}" in out and "test accuracy" in out
    names = [os.path.basename(p) for p in checkpoint_store.list_checkpoints(directory)]
    assert names[-1] == "ckpt-e0003-b000000"


def _tensor_scalars(logdir, tag):
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    # In the order written: the accumulator reads the event files in name order, and the
    # names of two writers of one process need not sort by time.
    events = sorted(acc.Tensors(tag), key=lambda e: e.wall_time)
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events]


def test_cli_resume_takes_the_new_lr_and_continues_the_step_numbers(tmp_path, capsys):
    logdir = str(tmp_path / "run")
    argv = CUT + ["--logdir", logdir, "--log-every", "1", "--prediction-every", "0",
                  "--steps-per-execution", "1"]  # a log per mini-batch
    assert run_cli(argv + ["--epochs", "1", "--lr", "0.01"], capsys)[0] == 0
    code, out = run_cli(argv + ["--epochs", "2", "--lr", "0.002", "--resume"], capsys)
    assert code == 0
    assert "--resume: learning rate 0.01 in the checkpoint, 0.002 from now on" in out.out
    rates = _tensor_scalars(logdir, "batch/learning_rate")
    steps = [s for s, _ in rates]
    assert steps == list(range(8))  # 4 mini-batches per epoch, numbered across both runs
    np.testing.assert_allclose([v for _, v in rates], [0.01] * 4 + [0.002] * 4, rtol=1e-6)


@pytest.mark.parametrize("steps_per_execution", ["1", "2"])
def test_cli_resume_from_the_middle_of_an_epoch_is_exact_in_sync_mode(
    tmp_path, capsys, monkeypatch, steps_per_execution
):
    """Stopped after a few mini-batches of epoch 0, resumed: two fit segments, the same
    weights as an uninterrupted run (sequential SGD), step numbers without a gap (with
    windows of 2, a log at the end of each window)."""
    from tf_spectrain.app import preparation, training
    from tf_spectrain.callbacks import Telemetry

    whole, split = tmp_path / "whole", tmp_path / "split"
    argv = CUT + ["--epochs", "2", "--mode", "sync", "--log-every", "1",
                  "--steps-per-execution", steps_per_execution]
    assert run_cli(argv + ["--logdir", str(whole)], capsys)[0] == 0
    args = dataclasses.replace(cli.parse_args(argv + ["--logdir", str(split)]), verbose=0)
    run = preparation.prepare(args)

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
    if steps_per_execution == "1":
        assert steps == list(range(8))
    else:  # windows [0] (stopped), [1, 2], [3]; then [4, 5], [6, 7]
        assert steps == [0, 2, 3, 5, 7]


def test_cli_reports_a_failed_checkpoint_write(tmp_path, capsys, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_checkpoint", full_disk)
    code, out = run_cli(CUT + ["--epochs", "1", "--logdir", str(tmp_path / "run")], capsys)
    assert code == 1
    assert "Could not write the checkpoint of epoch 1, mini-batch 0" in out.err
    assert "No space left on device" in out.err and "Traceback" not in out.err


# --- resuming on another number of stages or replicas (issue 32) -------------------------

# mlp: planning its cuts is quick (its 4 layers are profiled in a moment, also on a busy
# machine); its first stage of 4 holds only `flatten`, no weights.
MLP = ["--model", "mlp", "--limit", "64", "--batch-size", "16", "--mode", "sync"]
MLP4 = ["--gpus", "4", "--cuts", "flatten,dense1,dense2"]
CNN = ["--model", "small_cnn", "--limit", "64", "--batch-size", "16", "--mode", "sync"]


def _weights(logdir):
    return keras.models.load_model(os.path.join(logdir, "model.keras"), compile=False).get_weights()


def _assert_close(a, b, rtol=1e-5, atol=1e-6):
    """Within float tolerance (other graphs sum in other orders); the largest difference."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def test_cli_sync_resumes_4_then_2_then_4_stages_as_the_uninterrupted_run(tmp_path, capsys):
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    assert run_cli(MLP + MLP4 + ["--epochs", "3", "--logdir", whole], capsys)[0] == 0
    assert run_cli(MLP + MLP4 + ["--epochs", "1", "--logdir", split], capsys)[0] == 0
    # 2 devices, --cuts auto: planned anew for 2 stages, then re-cut
    code, out = run_cli(MLP + ["--gpus", "2", "--epochs", "2", "--logdir", split, "--resume"],
                        capsys)
    assert code == 0, out.err
    assert ("the checkpoint holds 4 stages (cut after flatten, dense1, dense2) and this run "
            "has devices for 2 stages (2 devices): planning 2 stages") in out.out
    assert re.search(r"the checkpoint holds 4 stages \(cut after flatten, dense1, dense2\); "
                     r"re-cut into 2 stages \(cut after \w+\), planned for this run's devices",
                     out.out)
    # back to 4 stages, at given cuts
    code, out = run_cli(MLP + MLP4 + ["--epochs", "3", "--logdir", split, "--resume"], capsys)
    assert code == 0, out.err
    assert "re-cut into 4 stages (cut after flatten, dense1, dense2), as --cuts says" in out.out
    assert "ckpt-e0002-b000000" in out.out
    worst = _assert_close(_weights(whole), _weights(split))
    print(f"4 -> 2 -> 4 stages, sync: largest difference {worst:.3g}")


def test_cli_resumes_across_replicas_and_micro_batches_as_the_uninterrupted_run(tmp_path, capsys):
    sync = ["--model", "mlp", "--limit", "64", "--batch-size", "16", "--cuts", "dense1",
            "--mode", "sync"]
    one, two = ["--gpus", "2"], ["--gpus", "4", "--replicas", "2", "--micro-batches", "2"]
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    assert run_cli(sync + one + ["--epochs", "3", "--logdir", whole], capsys)[0] == 0
    assert run_cli(sync + one + ["--epochs", "1", "--logdir", split], capsys)[0] == 0
    code, out = run_cli(sync + two + ["--epochs", "2", "--logdir", split, "--resume"], capsys)
    assert code == 0, out.err
    assert "trained by 1 replica of the pipeline, this run has 2" in out.out
    assert "trained with 1 micro-batch per mini-batch, this run uses 2" in out.out
    code, out = run_cli(sync + one + ["--epochs", "3", "--logdir", split, "--resume"], capsys)
    assert code == 0, out.err
    assert "trained by 2 replicas of the pipeline, this run has 1" in out.out
    worst = _assert_close(_weights(whole), _weights(split))
    print(f"1 -> 2 (2 micro-batches) -> 1 replicas, sync: largest difference {worst:.3g}")


def test_cli_spectrain_resumes_on_fewer_stages_and_refuses_bad_cuts_first(tmp_path, capsys):
    logdir = str(tmp_path / "run")
    spectrain = [a if a != "sync" else "spectrain" for a in CNN]
    assert run_cli(spectrain + ["--gpus", "3", "--cuts", "pool1,pool2", "--epochs", "1",
                                "--logdir", logdir], capsys)[0] == 0
    directory = os.path.join(logdir, "checkpoints")
    before = checkpoint_store.list_checkpoints(directory)
    with pytest.raises(SystemExit) as exc:  # a bad cut: refused before any training
        cli.main(spectrain + ["--gpus", "2", "--cuts", "pool9", "--epochs", "2", "--logdir",
                              logdir, "--resume"])
    assert exc.value.code == 2
    assert "pool9" in capsys.readouterr().err
    assert checkpoint_store.list_checkpoints(directory) == before  # nothing lost or added
    code, out = run_cli(spectrain + ["--gpus", "2", "--cuts", "pool2", "--epochs", "2",
                                     "--logdir", logdir, "--resume"], capsys)
    assert code == 0, out.err
    assert "holds 3 stages (cut after pool1, pool2); re-cut into 2 stages (cut after pool2)" in (
        out.out)
    assert os.path.basename(checkpoint_store.latest_checkpoint(directory)).startswith("ckpt-e0002")
    assert all(np.isfinite(w).all() for w in _weights(logdir))
