"""Modes nesterov and 2bw from train.py and in checkpoints (SPECTRAIN.md 6d, 6e).

train.py trains both modes end to end; `--accumulate` (2bw's mini-batches per update) and
nesterov's optimizers are refused with exit code 2 before any work; a checkpoint records
the mode (and 2bw's `accumulate`) and resumes exactly: the state after 1 epoch + save +
restore + 1 epoch equals that of 2 uninterrupted epochs, bit for bit, through the Python
API (nesterov with SGD and with AdamW, whose stages run NAdam with a per-stage `beta_1` and
`_u_product`; 2bw with SGD and AdamW) and through `train.py --resume`.
"""

import os
import re
import shutil

import keras
import numpy as np
import pytest
from checkpoint_helpers import BATCH, LIMIT, assert_same_state, state, tiny_model, train
from test_checkpointing import CLI, run_cli
from test_cli import _in_a_temporary_directory, parse_error  # noqa: F401 - the fixture

from tf_spectrain import checkpoint as checkpoint_store
from tf_spectrain import data
from tf_spectrain.app import cli, config_checks, flags
from tf_spectrain.callbacks import PipelineCheckpoint, restore_checkpoint
from tf_spectrain.checkpoint import layout, pipeline_layout, store
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import Nadam, SpecTrainSGD
from tf_spectrain.schedule import modes

CUTS = ("dense0", "bn")  # 3 stages of checkpoint_helpers.tiny_model
EPOCHS = 2
PER_EPOCH = data.steps_per_epoch("digits", BATCH, LIMIT)  # 3 mini-batches


def _sgd():
    return SpecTrainSGD(0.05, momentum=0.9, weight_decay=1e-3)  # train.py's, in pipelines


def _adamw():
    return keras.optimizers.AdamW(3e-3, weight_decay=1e-2)


def pipeline(mode, optimizer, cuts=CUTS, accumulate=None):
    pipe = PipelineModel(tiny_model(), cuts=list(cuts), mode=mode, accumulate=accumulate)
    pipe.compile(optimizer(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 ["accuracy"])
    return pipe


# --- train.py end to end ---------------------------------------------------------------


def test_the_help_and_the_readme_list_every_mode():
    assert all(mode in flags.MODE_HELP for mode in modes.ALL_MODES)
    text = flags.build_parser().format_help()
    assert "--accumulate ACCUMULATE" in text and "--mode 2bw: mini-batches per update" in text


@pytest.mark.parametrize(
    "mode, extra, note, accumulate",
    [
        ("nesterov", ["--optimizer", "adamw"], "; NAdam per stage, beta_1 0.945, 0.9", None),
        ("2bw", ["--accumulate", "3", "--micro-batches", "2"],
         "; one update per 3 mini-batches", 3),
    ],
    ids=["nesterov-adamw", "2bw-accumulate-micro-batches"],
)
def test_train_py_trains_the_new_modes(mode, extra, note, accumulate, capsys):
    # Cuts planned from measured time (the default), 1 epoch of 4 mini-batches.
    code, out = run_cli(CLI + ["--mode", mode, "--epochs", "1", "--logdir", "run"] + extra,
                        capsys)
    assert code == 0, out.err
    line = next(x for x in out.out.splitlines() if x.startswith("mlp on digits"))
    assert f": {mode} pipeline of 2 stages on /CPU:0, /CPU:1, cut after " in line
    assert line.endswith(note), line
    assert out.out.strip().splitlines()[-1].startswith("test accuracy ")
    saved = store.load_checkpoint(store.latest_checkpoint(os.path.join("run", "checkpoints")))
    metadata = saved[1]["metadata"]
    assert metadata["mode"] == mode
    assert metadata.get("accumulate") == accumulate


@pytest.mark.parametrize("mode", ["nesterov", "2bw"])
def test_default_logdir_names_the_mode(mode):
    config = cli.parse_args(["--model", "mlp", "--mode", mode])
    assert config.logdir.startswith(os.path.join("runs", f"mlp-{mode}-"))


@pytest.mark.parametrize("mode, extra", [("nesterov", ["--optimizer", "adamw"]),
                                         ("2bw", ["--accumulate", "3"])])
def test_plan_prices_the_new_modes(mode, extra, capsys):
    code = cli.main(CLI + ["--mode", mode, "--cuts", "dense1", "--plan"] + extra)
    out = capsys.readouterr().out
    assert code == 0
    assert f"--plan: mlp, {mode} pipeline of 2 stages on /CPU:0, /CPU:1, batch 16" in out
    assert f"mode '{mode}'" in out and "To train with these cuts: --cuts dense1" in out


# --- bad flags: exit code 2 before any work ----------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mode", "2bw", "--accumulate", "0"],
         r"--accumulate must be an integer >= 1 \(mini-batches per update\). Received: "
         r"--accumulate 0"),
        (["--mode", "2bw", "--accumulate", "two"],
         r"argument --accumulate: invalid int value: 'two'"),
        (["--mode", "stash", "--accumulate", "4"],
         r"--accumulate is for --mode 2bw. Received: --accumulate 4 with --mode stash"),
        (["--accumulate", "4"],
         r"--accumulate is for --mode 2bw. Received: --accumulate 4 with --mode spectrain"),
        (["--mode", "2bw", "--gpus", "4", "--accumulate", "3"],
         r"--accumulate must be at least the number of stages \(4: --gpus 4\) in --mode 2bw"
         r".*Received: --accumulate 3; leave it out for 4"),
        (["--mode", "2bw", "--gpus", "4", "--replicas", "2", "--accumulate", "1"],
         r"at least the number of stages \(2: --gpus 4 over --replicas 2\)"),
        (["--mode", "nesterov", "--optimizer", "rmsprop"],
         r"--optimizer must be one of \['sgd', 'adamw'\]. Received: --optimizer rmsprop"),
    ],
    ids=["zero", "not-an-int", "stash", "default-mode", "below-stages", "below-stages-replicas",
         "nesterov-unknown-optimizer"],
)
def test_bad_accumulate_or_optimizer_exits_2(argv, message, capsys):
    err = parse_error(capsys, argv)
    assert re.search(message, err), err


def test_accumulate_with_enough_stages_is_taken():
    config = cli.parse_args(["--mode", "2bw", "--gpus", "4", "--replicas", "2",
                             "--accumulate", "2"])
    assert (config.accumulate, config.num_stages) == (2, 2)


def test_nesterov_refuses_an_optimizer_without_a_nesterov_form(capsys, monkeypatch):
    # Every optimizer --optimizer offers today has a form (sgd, adamw); one added without
    # one is refused in mode nesterov, naming those that have one.
    monkeypatch.setattr(config_checks, "OPTIMIZERS", ("sgd", "adamw", "rmsprop"))
    argv = ["--optimizer", "rmsprop", "--lr", "0.01", "--weight-decay", "0"]
    cli.parse_args(argv + ["--mode", "stash"])  # other modes take it
    err = parse_error(capsys, argv + ["--mode", "nesterov"])
    assert ("--mode nesterov runs each stage's optimizer in its Nesterov form, which only sgd "
            "and adamw have here (docs/SPECTRAIN.md section 6e). Received: --optimizer "
            "rmsprop with --mode nesterov; use --optimizer sgd or adamw, or another mode") in err


# --- checkpoints: exact resume through the Python API ----------------------------------

_WHOLE = {}


def uninterrupted(mode, optimizer, accumulate, tmp_path_factory):
    """`pipeline(...)` trained EPOCHS epochs, a checkpoint kept at every epoch end."""
    key = (mode, optimizer, accumulate)
    if key not in _WHOLE:
        directory = tmp_path_factory.mktemp(f"whole_{mode}")
        whole = pipeline(mode, optimizer, accumulate=accumulate)
        train(whole, 0, EPOCHS, callbacks=[PipelineCheckpoint(directory, keep=None)])
        _WHOLE[key] = (whole, checkpoint_store.list_checkpoints(directory))
    return _WHOLE[key]


@pytest.mark.parametrize(
    "mode, optimizer, accumulate, stage_optimizer",
    [
        ("nesterov", _sgd, None, keras.optimizers.SGD),
        ("nesterov", _adamw, None, Nadam),
        ("2bw", _sgd, None, SpecTrainSGD),  # A = N = 3 = the epoch's mini-batches
        ("2bw", _adamw, 4, keras.optimizers.AdamW),  # one update per epoch, at its end
    ],
    ids=["nesterov-sgd", "nesterov-adamw", "2bw-sgd", "2bw-adamw-accumulate-4"],
)
def test_resumed_after_an_epoch_equals_uninterrupted(mode, optimizer, accumulate,
                                                     stage_optimizer, tmp_path_factory):
    whole, paths = uninterrupted(mode, optimizer, accumulate, tmp_path_factory)
    assert all(type(o) is stage_optimizer for o in whole.stage_optimizers)
    arrays, info = store.load_checkpoint(paths[0])
    assert info["metadata"]["mode"] == mode
    assert info["metadata"].get("accumulate") == (
        (accumulate or len(CUTS) + 1) if mode == "2bw" else None)
    resumed = pipeline(mode, optimizer, accumulate=accumulate)  # initialised the same way
    restored = restore_checkpoint(resumed, paths[0])
    assert (restored["epoch"], restored["batch"]) == (1, 0)
    train(resumed, 1, EPOCHS)
    assert_same_state(state(whole), state(resumed))  # every variable and optimizer variable
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_nesterov_adamw_checkpoints_each_stages_u_product(tmp_path_factory):
    whole, paths = uninterrupted("nesterov", _adamw, None, tmp_path_factory)
    betas = [float(o.beta_1) for o in whole.stage_optimizers]
    assert betas == pytest.approx([0.96, 0.93, 0.9])  # raised by each stage's delay
    arrays, _ = store.load_checkpoint(paths[0])
    products = [arrays[layout.scalar_key(k, "_u_product")] for k in range(3)]
    assert len(set(map(float, products))) == 3
    for k, optimizer in enumerate(whole.stage_optimizers):
        count = arrays[layout.scalar_key(k, "_iterations")]
        assert int(count) == PER_EPOCH
        # The closed form the re-cut uses gives back the product the stage ran up.
        np.testing.assert_allclose(
            pipeline_layout.nadam_u_product(optimizer, count, products[k]), products[k],
            rtol=1e-6)


def test_nesterov_re_cut_recomputes_u_product_for_each_stages_beta_1(tmp_path_factory):
    _, paths = uninterrupted("nesterov", _adamw, None, tmp_path_factory)
    two = pipeline("nesterov", _adamw, cuts=("dense0",))
    restore_checkpoint(two, paths[0])  # 3 stages -> 2
    assert [float(o.beta_1) for o in two.stage_optimizers] == pytest.approx([0.945, 0.9])
    arrays, _ = store.load_checkpoint(paths[0])
    for optimizer in two.stage_optimizers:  # each with the old last stage's update count
        assert int(optimizer.iterations.numpy()) == PER_EPOCH
        mu = optimizer.beta_1 * (1 - 0.5 * 0.96 ** (0.004 * np.arange(1, PER_EPOCH + 1)))
        np.testing.assert_allclose(float(optimizer._u_product.numpy()), np.prod(mu),
                                   rtol=1e-6)
    # The last stage keeps beta_1 = 0.9: its product is the saved last stage's.
    np.testing.assert_allclose(float(two.stage_optimizers[-1]._u_product.numpy()),
                               float(arrays[layout.scalar_key(2, "_u_product")]), rtol=1e-6)
    train(two, 1, EPOCHS)  # and it trains on


@pytest.mark.parametrize("saved_mode, mode", [("nesterov", "stash"), ("2bw", "nesterov")])
def test_a_checkpoint_of_another_mode_is_refused(saved_mode, mode, tmp_path_factory):
    _, paths = uninterrupted(saved_mode, _sgd, None, tmp_path_factory)
    with pytest.raises(checkpoint_store.IncompatibleCheckpoint,
                       match=f"mode: the checkpoint has '{saved_mode}', this run has '{mode}'"):
        restore_checkpoint(pipeline(mode, _sgd), paths[0])


# --- checkpoints: exact resume through train.py --resume --------------------------------


def _exported(logdir):
    return keras.models.load_model(os.path.join(logdir, "model.keras"),
                                   compile=False).get_weights()


@pytest.mark.parametrize("mode, extra", [("nesterov", ["--optimizer", "adamw"]),
                                         ("2bw", ["--accumulate", "3"])])
def test_cli_resume_equals_uninterrupted(mode, extra, tmp_path, capsys):
    # 4 mini-batches per epoch: 2bw with --accumulate 3 ends each epoch with a group of 1.
    base = CLI + ["--cuts", "dense1"]
    argv = base + ["--mode", mode] + extra
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    assert run_cli(argv + ["--epochs", "2", "--logdir", whole], capsys)[0] == 0
    assert run_cli(argv + ["--epochs", "1", "--logdir", split], capsys)[0] == 0
    other = str(tmp_path / "other")
    shutil.copytree(split, other)
    code, out = run_cli(argv + ["--epochs", "2", "--logdir", split, "--resume"], capsys)
    assert code == 0, out.err
    assert "; resuming " in out.out and "ckpt-e0001-b000000 at epoch 1" in out.out
    for a, b in zip(_exported(whole), _exported(split)):
        np.testing.assert_array_equal(a, b)
    if mode == "2bw":  # another --accumulate resumes too, and says so
        code, out = run_cli(base + ["--mode", mode, "--accumulate", "4", "--epochs", "2",
                                    "--logdir", other, "--resume"], capsys)
        assert code == 0, out.err
        assert ("--resume: the checkpoint was trained with one update per 3 mini-batches, "
                "this run makes one per 4 (--accumulate).") in out.out
    else:  # a nesterov checkpoint is not resumed as stash
        with pytest.raises(SystemExit) as exit_:
            cli.main(base + extra + ["--mode", "stash", "--epochs", "2", "--logdir", other,
                                     "--resume"])
        assert exit_.value.code == 2
        assert "mode: the checkpoint has 'nesterov', this run has 'stash'" in (
            capsys.readouterr().err)
