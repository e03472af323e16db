"""Tests for tf_spectrain.checkpoint.resume: what train.py does with a checkpoint directory.

The whole-run behaviour (`--resume` through the command line) is in test_checkpointing.py;
here each helper alone, on a tiny compiled keras.Model.
"""

import keras
import numpy as np
import pytest

from tf_spectrain import checkpoint


def tiny_model(lr=0.1):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(inputs), name="tiny")
    model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9), loss="mse")
    return model


def test_restore_latest_says_when_there_is_nothing_to_resume(tmp_path, capsys):
    directory = str(tmp_path / "none")
    assert checkpoint.restore_latest(tiny_model(), directory, {"seed": 0}) is None
    out = capsys.readouterr().out
    assert out == f"--resume: no checkpoint in {directory} yet; starting from scratch.\n"


def test_restore_latest_restores_the_newest_for_the_same_facts(tmp_path):
    saved = tiny_model()
    checkpoint.save(saved, tmp_path, epoch=1, metadata={"seed": 0})
    saved.layers[-1].kernel.assign(np.ones((3, 2), np.float32))
    newest = checkpoint.save(saved, tmp_path, epoch=2, metadata={"seed": 0})
    other = tiny_model()
    info = checkpoint.restore_latest(other, str(tmp_path), {"seed": 0})
    assert (info["epoch"], info["path"]) == (2, newest)
    np.testing.assert_array_equal(other.layers[-1].kernel.numpy(), np.ones((3, 2)))
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as info:
        checkpoint.restore_latest(tiny_model(), str(tmp_path), {"seed": 1})
    assert isinstance(info.value, checkpoint.CheckpointError)
    assert "extra.seed: the checkpoint has 0" in str(info.value)
    assert str(info.value).endswith("(train.py: another --checkpoint-dir, or another --logdir)")


def test_restore_checkpoint_of_another_run_names_no_flag(tmp_path):
    checkpoint.save(tiny_model(), tmp_path, epoch=1, metadata={"seed": 0})
    path = checkpoint.latest_checkpoint(str(tmp_path))
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as info:
        checkpoint.restore_checkpoint(tiny_model(), path, metadata={"seed": 1})
    assert "--" not in str(info.value)  # the Python API: no train.py flag


def test_apply_learning_rate_sets_every_optimizer_and_says_so_when_it_changes(capsys):
    model = tiny_model(lr=0.01)
    checkpoint.apply_learning_rate(model, 0.01)
    assert capsys.readouterr().out == ""  # the same rate: no note
    checkpoint.apply_learning_rate(model, 0.002)
    assert capsys.readouterr().out == (
        "--resume: learning rate 0.01 in the checkpoint, 0.002 from now on (--lr).\n"
    )
    np.testing.assert_allclose(float(model.optimizer.learning_rate), 0.002, rtol=1e-6)


@pytest.mark.parametrize(
    "lr, error",
    [("0.1", TypeError), (True, TypeError), (0.0, ValueError), (float("nan"), ValueError)],
)
def test_apply_learning_rate_rejects_a_bad_rate(lr, error):
    with pytest.raises(error, match="`lr` must be a finite number > 0"):
        checkpoint.apply_learning_rate(tiny_model(), lr)


def test_refuse_existing_refuses_a_directory_with_checkpoints(tmp_path):
    checkpoint.refuse_existing(str(tmp_path))  # empty: fine
    newest = checkpoint.save(tiny_model(), tmp_path, epoch=1)
    with pytest.raises(ValueError) as error:
        checkpoint.refuse_existing(str(tmp_path))
    assert str(error.value) == (
        f"--checkpoint-dir {tmp_path} already holds checkpoints (the newest is {newest}). "
        "Add --resume to continue that run, or choose another --checkpoint-dir (or --logdir); "
        "nothing there is overwritten."
    )
