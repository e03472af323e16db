"""Tests for tf_spectrain.app.training: a run prepared, described and trained in process, and
the model exported atomically.

The command line around it (`cli.main`, train.py) is tested in test_cli.py and
test_checkpointing.py.
"""

import argparse
import dataclasses

import keras
import numpy as np
import pytest
from checkpoint_helpers import tiny_model

from tf_spectrain import data
from tf_spectrain.app import cli, preparation, training
from tf_spectrain.app.config import ConfigError, RunConfig


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path, monkeypatch):
    """parse_args creates the default output dirs (runs/...): keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("mode", ["single", "dp", "spectrain", "sync"])
def test_run_in_process_reports_true_test_accuracy(mode, tmp_path):
    args = dataclasses.replace(cli.parse_args(
        ["--model", "small_cnn", "--gpus", "2", "--mode", mode, "--epochs", "2",
         "--batch-size", "32", "--limit", "128", "--lr", "0.05", "--logdir", str(tmp_path)]
    ), verbose=0)
    run = preparation.prepare(args)
    description = preparation.describe(run)
    result = training.train(run)
    if mode in ("spectrain", "sync"):
        assert f"{mode} pipeline of 2 stages on /CPU:0, /CPU:1, cut after " in description
    else:
        assert f": {mode} on /CPU:0" in description
    x, y = data.load_arrays("digits", "test", limit=128)
    logits = result["model"].predict(x, verbose=0)
    expected = float(np.mean(np.argmax(logits, axis=1) == y))
    assert result["test_accuracy"] == pytest.approx(expected, abs=1e-6)
    assert result["images_per_second"] > 0
    assert len(result["history"]["loss"]) == 2
    if mode == "dp":
        assert result["devices"] == ["/CPU:0", "/CPU:1"]
        kernel = result["model"].trainable_variables[0].value
        replicas = getattr(kernel, "values", ())
        assert sorted(v.device.split("/")[-1] for v in replicas) == ["device:CPU:0", "device:CPU:1"]
    if mode in ("spectrain", "sync"):
        assert len(result["cuts"]) == 1  # default cuts: 2 stages on --gpus 2


def test_prepare_checks_a_namespace_as_a_run_config_before_any_work():
    namespace = argparse.Namespace(**dict(dataclasses.asdict(RunConfig(logdir="x")), gpus=0))
    with pytest.raises(ConfigError, match=r"--gpus must be an integer >= 1"):
        preparation.prepare(namespace)


def test_export_is_atomic(tmp_path, monkeypatch):
    from tf_spectrain.app import training

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
