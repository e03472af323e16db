"""tf_spectrain.app.config: RunConfig's defaults, checks (all at once) and resolved paths.

The command line's messages are checked through `cli.parse_args` in tests/test_cli.py and
tests/test_fuzz.py; here the dataclass itself, as Python code builds it.
"""

import argparse
import dataclasses
import os
import pathlib

import pytest

from tf_spectrain.app import cli, flags
from tf_spectrain.app.config import ConfigError, ConfigTypeError, RunConfig, as_run_config


def test_the_parser_takes_its_defaults_from_the_fields():
    parsed = vars(flags.build_parser().parse_args([]))
    fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert set(parsed) == set(fields) - {"verbose"}  # verbose is no flag
    assert parsed == {name: fields[name] for name in parsed}
    assert (fields["model"], fields["gpus"], fields["mode"]) == ("vgg16", None, "spectrain")
    assert RunConfig().gpus == 4  # without --cluster
    assert RunConfig().num_devices == 4


CLUSTER = "127.0.0.1:2222,127.0.0.1:2223"


@pytest.mark.parametrize(
    "settings, stages",
    [
        (dict(cluster=CLUSTER), 2),
        (dict(cluster=CLUSTER, mode="dp", gpus_per_host=2), 4),
        (dict(cluster=CLUSTER, gpus_per_host=3), 6),
        (dict(cluster=CLUSTER, gpus_per_host=2, cuts=("a", "b", "c")), 4),
    ],
)
def test_a_cluster_run_has_workers_times_gpus_per_host_stages(settings, stages):
    config = RunConfig(**dict(dict(model="mlp", mode="sync"), **settings))
    assert config.gpus is None and config.num_devices == stages
    assert config.trainer_cluster.workers == ("127.0.0.1:2222", "127.0.0.1:2223")


def test_the_cluster_can_come_from_tf_config(monkeypatch):
    tf_config = '{"cluster": {"worker": ["10.0.0.1:2222"], "chief": ["10.0.0.9:2222"]}, ' \
        '"task": {"type": "chief", "index": 0}}'
    monkeypatch.setenv("TF_CONFIG", tf_config)
    config = RunConfig(model="mlp", mode="stash", cluster="TF_CONFIG", gpus_per_host=2)
    assert config.num_devices == 2 and config.trainer_cluster.chief == "10.0.0.9:2222"


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(cluster=CLUSTER, gpus=2), "--gpus cannot go with --cluster"),
        (dict(gpus_per_host=2), "without --cluster use --gpus"),
        (dict(cluster=CLUSTER, mode="single"), "needs --mode dp or one of the modes"),
        (dict(cluster=CLUSTER, mode="dp", batch_size=33), "split evenly across the 2 devices"),
        (dict(cluster=CLUSTER, gpus_per_host=0), "--gpus-per-host"),
        (dict(trainer_address="127.0.0.1"), "--trainer-address is where --cluster workers"),
        (dict(cluster=CLUSTER, trainer_address=5), "--trainer-address.*'host' or 'host:port'"),
        (dict(cluster="127.0.0.1"), "host:port"),
        (dict(cluster=CLUSTER, cuts=("a", "b")), "gives 2 devices: give 1 cut layers"),
    ],
)
def test_bad_cluster_settings_are_refused_before_anything_starts(settings, message):
    settings = dict(dict(model="mlp", mode="sync"), **settings)
    with pytest.raises((ValueError, TypeError), match=message):
        RunConfig(**settings)


def test_default_paths_are_resolved():
    config = RunConfig(model="mlp", mode="sync")
    assert config.logdir.startswith(os.path.join("runs", "mlp-sync-"))
    assert config.checkpoint_dir == os.path.join(config.logdir, "checkpoints")
    assert config.export == os.path.join(config.logdir, "model.keras")
    given = RunConfig(logdir="here", export="none")
    assert (given.logdir, given.checkpoint_dir, given.export) == (
        "here", os.path.join("here", "checkpoints"), "none")


def test_resume_from_a_checkpoint_dir_logs_next_to_it(tmp_path):
    config = RunConfig(resume=True, checkpoint_dir=str(tmp_path / "run" / "checkpoints"))
    assert config.logdir == str(tmp_path / "run")


def test_fields_are_frozen_and_normalised(tmp_path):
    config = RunConfig(gpus=2, cuts=["fc1"], logdir=pathlib.Path(tmp_path))
    assert config.cuts == ("fc1",) and config.logdir == str(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gpus = 3
    assert dataclasses.replace(config, verbose=0).verbose == 0


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        RunConfig(gpus=0, epochs=0, momentum=1.0, mode="pipe")
    assert info.value.errors == [
        "--mode must be one of ['sync', 'vanilla', 'stash', 'spectrain', 'nesterov', '2bw', "
        "'single', 'dp']. "
        "Received: --mode pipe",
        "--gpus must be an integer >= 1. Received: --gpus 0",
        "--epochs must be an integer >= 1. Received: --epochs 0",
        "--momentum must be in [0, 1) (0 <= momentum < 1). Received: --momentum 1.0",
    ]
    assert str(info.value) == "\n  ".join(info.value.errors)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gpus="4"), "--gpus must be an integer >= 1. Received: --gpus 4 of type str"),
        (dict(lr="0.1"), "--lr must be a finite number > 0"),
        (dict(graph=1), "--graph must be True or False"),
        (dict(cuts="fc1,fc2", gpus=3), "--cuts must be 'auto' or a list of layer names"),
        (dict(logdir=3), "--logdir must be a path. Received: --logdir 3 of type int"),
        (dict(verbose="loud"), None),
    ],
)
def test_wrong_types_from_python(kwargs, message):
    if message is None:  # a string where "auto" is valid: out of range, not a wrong type
        with pytest.raises(ConfigError, match=r"`verbose` must be an integer in \[0, 2\]"):
            RunConfig(**kwargs)
        return
    with pytest.raises(ConfigTypeError) as info:
        RunConfig(**kwargs)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert message in str(info.value)


def test_cross_field_rules():
    with pytest.raises(ConfigError) as info:
        RunConfig(mode="stash", micro_batches=3, batch_size=32, on_nan="skip", resume=True,
                  keep_checkpoints=0)
    assert info.value.errors == [
        "--micro-batches must divide --batch-size. Received: --batch-size 32 and "
        "--micro-batches 3",
        "--resume needs checkpoints: it cannot be used with --keep-checkpoints 0",
        "--resume needs to know where the checkpoints are: give --checkpoint-dir, or the "
        "--logdir of the run to continue (its checkpoints are in <logdir>/checkpoints)",
    ]
    RunConfig(mode="sync", micro_batches=4, on_nan="skip", logdir="x")  # all fine together


def test_micro_batch_schedule_and_recompute_rules():
    for mode in ("sync", "vanilla", "stash", "spectrain"):  # micro-batches in every mode
        RunConfig(mode=mode, micro_batches=4, recompute="always")
    RunConfig(mode="sync", micro_batches=8, schedule="1f1b", recompute="always")
    with pytest.raises(ConfigError) as info:
        RunConfig(mode="single", micro_batches=2, schedule="1f1b", recompute="always")
    assert info.value.errors == [
        "--micro-batches > 1 splits the mini-batches of a pipeline; --mode single is no "
        "pipeline. Received: --micro-batches 2 with --mode single; use one of --mode sync, "
        "vanilla, stash, spectrain, nesterov, 2bw",
        "--schedule 1f1b orders the micro-batches of --mode sync; --mode single has its own "
        "schedule. Received: --schedule 1f1b with --mode single; use --mode sync, or "
        "--schedule gpipe (the default)",
        "--recompute always is for the stages of a pipeline; --mode single is no pipeline. "
        "Received: --recompute always with --mode single",
    ]
    with pytest.raises(ConfigError, match="--schedule 1f1b orders the micro-batches of "
                       "--mode sync; --mode stash"):
        RunConfig(mode="stash", schedule="1f1b")
    with pytest.raises(ConfigError, match=r"--schedule must be one of \['gpipe', '1f1b'\]. "
                       r"Received: --schedule pipedream"):
        RunConfig(mode="sync", schedule="pipedream")
    with pytest.raises(ConfigError, match=r"--recompute must be one of \['auto', 'always'\]. "
                       r"Received: --recompute never"):
        RunConfig(recompute="never")


def test_as_run_config_takes_a_namespace_and_fills_the_defaults():
    config = as_run_config(argparse.Namespace(model="mlp", gpus=2, logdir="runs/x"))
    assert isinstance(config, RunConfig)
    assert (config.model, config.gpus, config.epochs) == ("mlp", 2, RunConfig.epochs)
    assert config.checkpoint_dir == os.path.join("runs/x", "checkpoints")
    assert as_run_config(config) is config
    with pytest.raises(ValueError, match="--gpus must be an integer >= 1"):
        as_run_config(argparse.Namespace(gpus=0))


def test_cli_check_args_lists_every_problem():
    args = flags.build_parser().parse_args(["--gpus", "0", "--lr", "-1"])
    errors = cli.check_args(args)
    assert len(errors) == 2 and errors[0].startswith("--gpus") and errors[1].startswith("--lr")
    assert cli.check_args(flags.build_parser().parse_args([])) == []


@pytest.mark.parametrize(
    "settings, expected",
    [
        (dict(), ("sgd", 0.01, 5e-4)),
        (dict(model="transformer_lm"), ("adamw", 0.001, 0.01)),
        (dict(model="transformer_classifier", dataset="imdb_reviews", download=True),
         ("adamw", 0.001, 0.01)),
        (dict(model="residual_lstm", dataset="imdb_reviews", download=True),
         ("adamw", 0.001, 0.01)),
        (dict(optimizer="adamw"), ("adamw", 0.001, 0.01)),
        (dict(model="transformer_lm", optimizer="sgd"), ("sgd", 0.01, 5e-4)),
        (dict(model="transformer_lm", lr=0.005, weight_decay=0.0), ("adamw", 0.005, 0.0)),
    ],
)
def test_the_optimizer_and_its_defaults_follow_the_model(settings, expected):
    config = RunConfig(**settings)
    assert (config.optimizer, config.lr, config.weight_decay) == expected  # the tables' own


def test_an_unknown_optimizer_is_the_only_problem_reported():
    with pytest.raises(ConfigError) as info:
        RunConfig(model="mlp", optimizer="adam")
    assert len(info.value.errors) == 1, info.value.errors
    assert "--optimizer must be one of" in info.value.errors[0]
    assert "Received: --optimizer adam" in info.value.errors[0]
    with pytest.raises(ConfigError) as info:  # a bad --lr given with it is still reported
        RunConfig(optimizer="adam", lr=-1.0)
    assert [e.split(" ")[0] for e in info.value.errors] == ["--optimizer", "--lr"]
