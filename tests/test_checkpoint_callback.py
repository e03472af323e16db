"""Tests for tf_spectrain.checkpoint.callback: PipelineCheckpoint's arguments, retention,
and a failed write stopping training with CheckpointWriteError."""

import os

import pytest
from checkpoint_helpers import EPOCHS, pipeline, train

from tf_spectrain import checkpoint as checkpoint_store
from tf_spectrain.callbacks import PipelineCheckpoint
from tf_spectrain.checkpoint import store


def test_keep_retains_the_newest(tmp_path):
    pipe = pipeline()
    train(pipe, 0, EPOCHS, callbacks=[PipelineCheckpoint(tmp_path, keep=2)])
    names = [os.path.basename(p) for p in checkpoint_store.list_checkpoints(tmp_path)]
    assert names == ["ckpt-e0002-b000000", "ckpt-e0003-b000000"]


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
