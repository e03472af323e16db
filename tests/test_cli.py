"""train.py: every bad input fails fast with a clear message; short runs end to end."""

import os
import re
import subprocess
import sys
import time

import pytest

from tf_spectrain.app import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path, monkeypatch):
    """parse_args creates the default output dirs (runs/...): keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


def parse_error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "vgg61"],
         r"--model must be one of .*Received: --model vgg61; did you mean 'vgg16'"),
        (["--dataset", "cifar"], r"--dataset must be one of .*Received: --dataset cifar"),
        (["--mode", "pipe"],
         r"--mode must be one of \['sync', 'vanilla', 'stash', 'spectrain', 'nesterov', '2bw', "
         r"'single', 'dp'\]"),
        (["--mode", "spectran"], r"Received: --mode spectran; did you mean 'spectrain'"),
        (["--spectrain-target", "papr"],
         r"--spectrain-target must be one of \['paper', 'consistent'\]"),
        (["--micro-batches", "0"], r"--micro-batches must be an integer >= 1"),
        (["--mode", "dp", "--micro-batches", "2"], r"--micro-batches > 1 splits the "
         r"mini-batches of a pipeline; --mode dp is no pipeline"),
        (["--schedule", "1f1b"], r"--schedule 1f1b orders the micro-batches of --mode sync"),
        (["--recompute", "never"], r"--recompute must be one of \['auto', 'always'\]"),
        (["--mode", "sync", "--micro-batches", "3"], r"--micro-batches must divide --batch-size"),
        (["--mode", "dp", "--cuts", "block2_pool"], r"--cuts splits a pipeline"),
        (["--cuts", "a,,b"], r"argument --cuts: expected comma-separated layer names"),
        (["--gpus", "0"], r"--gpus must be an integer >= 1. Received: --gpus 0"),
        (["--epochs", "-1"], r"--epochs must be an integer >= 1. Received: --epochs -1"),
        (["--batch-size", "0"], r"--batch-size must be an integer >= 1"),
        (["--lr", "-0.1"], r"--lr must be a finite number > 0. Received: --lr -0.1"),
        (["--lr", "nan"], r"--lr must be a finite number > 0"),
        (["--momentum", "1.5"], r"--momentum must be in \[0, 1\)"),
        (["--momentum", "1"],
         r"--momentum must be in \[0, 1\) \(0 <= momentum < 1\). Received: --momentum 1.0"),
        (["--weight-decay", "-1"], r"--weight-decay must be a finite number >= 0"),
        (["--seed", "-3"], r"--seed must be >= 0"),
        (["--limit", "0"], r"--limit must be an integer >= 1"),
        (["--gpus", "two"], r"argument --gpus: invalid int value: 'two'"),
        (["--data-dir", "/no/such/dir"], r"--data-dir /no/such/dir does not exist"),
        (["--log-every", "0"], r"--log-every must be 'auto' or an integer >= 1"),
        (["--log-every", "often"], r"argument --log-every: expected 'auto' or an integer"),
        (["--prediction-every", "-1"], r"--prediction-every must be an integer >= 0"),
        (["--keep-checkpoints", "-2"], r"--keep-checkpoints must be an integer >= 0"),
        (["--keep-checkpoints", "0", "--resume", "--logdir", "x"],
         r"--resume needs checkpoints: it cannot be used with --keep-checkpoints 0"),
        (["--resume"], r"--resume needs to know where the checkpoints are"),
        (["--on-nan", "ignore"], r"--on-nan must be one of \['stop', 'skip'\]"),
        (["--on-nan", "skip", "--mode", "single"],
         r"--on-nan skip is only available for the pipeline modes"),
        (["--export", "model.h5"], r"--export must be a file name ending in .keras"),
        (["--logdir", ""], r"--logdir must be a path. Received: --logdir ''"),
        (["--epochs", "2", "--epochs", "3"], r"--epochs was given more than once"),
        (["--epoch", "2"], r"unrecognized arguments: --epoch"),
        (["--seed", "4294967296"], r"--seed must be >= 0 and < 2\*\*32"),
        (["--gpus", "65"], r"--gpus must be at most 64"),
        (["--gpus", "3", "--cuts", "a,b,c"],
         r"--cuts names 3 layers, which makes 4 stages, but --gpus is 3"),
    ],
)
def test_bad_flag_exits_2_with_message(capsys, argv, message):
    err = parse_error(capsys, argv)
    assert re.search(message, err), err


def test_several_bad_flags_are_all_reported(capsys):
    err = parse_error(capsys, ["--gpus", "0", "--epochs", "0"])
    assert "--gpus" in err and "--epochs" in err


def test_unprepared_tfds_dataset_fails_at_once(capsys, tmp_path):
    start = time.perf_counter()
    err = parse_error(capsys, ["--dataset", "cifar10", "--data-dir", str(tmp_path)])
    assert time.perf_counter() - start < 10
    assert "cifar10" in err and str(tmp_path) in err and "--download" in err


def test_defaults_are_the_documented_main_job():
    args = cli.parse_args([])
    assert (args.model, args.gpus, args.dataset) == ("vgg16", 4, "digits")
    assert args.mode == "spectrain" and args.cuts == "auto" and args.micro_batches == 1
    assert args.logdir.startswith(os.path.join("runs", "vgg16-spectrain-"))


@pytest.mark.parametrize(
    "cuts, message",
    [
        ("pool1,fc", r"`cuts` must name layers of the model.*did you mean 'fc1'"),
        ("fc1,pool1", r"order"),
        ("pool1", r"--cuts names 1 layers, which makes 2 stages, but --gpus is 3"),
    ],
)
def test_bad_cuts_fail_before_training(capsys, cuts, message):
    argv = ["--model", "small_cnn", "--gpus", "3", "--cuts", cuts, "--epochs", "1",
            "--limit", "32"]
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert time.perf_counter() - start < 30


def test_bad_input_exits_within_seconds_as_a_process():
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "train.py", "--model", "nope", "--gpus", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2
    assert "--model must be one of" in out.stderr and "--gpus must be" in out.stderr
    assert "Traceback" not in out.stderr
    assert time.perf_counter() - start < 60  # mostly Python + TensorFlow import time


def test_cli_end_to_end_single(tmp_path):
    logdir = tmp_path / "logs"
    out = subprocess.run(
        [sys.executable, "train.py", "--model", "small_cnn", "--gpus", "2", "--mode", "single",
         "--epochs", "1", "--batch-size", "32", "--limit", "96", "--logdir", str(logdir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "small_cnn on digits (96 training images): single on /CPU:0" in out.stdout
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("test accuracy ") and "images/s" in last and "wall time" in last
    acc = float(last.split()[2])
    assert 0.0 <= acc <= 1.0
    events = [f for _, _, fs in os.walk(logdir) for f in fs if f.startswith("events.out")]
    assert events, "TensorBoard wrote no event files"


def test_last_mini_batch_too_small_for_micro_batches_fails_before_training(capsys):
    argv = ["--model", "mlp", "--gpus", "2", "--mode", "sync", "--micro-batches", "4",
            "--batch-size", "32", "--limit", "66", "--epochs", "1"]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "last mini-batch of an epoch has 2 examples" in err and "--micro-batches 4" in err


@pytest.mark.parametrize("flag", ["--logdir", "--checkpoint-dir", "--export"])
def test_unwritable_output_paths_fail_before_training(flag, capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    value = str(blocker / ("model.keras" if flag == "--export" else "sub"))
    base = [] if flag == "--logdir" else ["--logdir", str(tmp_path / "logs")]
    err = parse_error(capsys, base + [flag, value])
    assert "a_file" in err and flag in err
    assert "Not a directory" in err or "is an existing file" in err
