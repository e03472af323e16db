"""Tests for tf_spectrain.checkpoint.state: what a pipeline's (or a Keras model's) state is,
and `restore_checkpoint` bringing it back exactly or refusing a different run.

The reference for "resumes exactly" is the same run without interruption: final weights
and optimizer state must be identical. The checkpoints are written by PipelineCheckpoint
(its own tests are in test_checkpoint_callback.py).
"""

import os
import re

import keras
import numpy as np
import pytest
from checkpoint_helpers import (
    BATCH,
    EPOCHS,
    LIMIT,
    assert_same_state,
    epochs_data,
    pipeline,
    state,
    tiny_model,
    train,
)

from tf_spectrain import checkpoint as checkpoint_store
from tf_spectrain import data
from tf_spectrain.callbacks import PipelineCheckpoint, restore_checkpoint
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.workflow import batching

_UNINTERRUPTED = {}


def uninterrupted(mode, tmp_path_factory, optimizer=None):
    """`pipeline(mode)` trained EPOCHS epochs with a checkpoint at every epoch end (kept):
    (the pipeline, the checkpoint paths). Once per mode: the spectrain run is the
    reference of three tests (each run costs its tracing and 3 epochs). Read only."""
    key = (mode, optimizer)
    if key not in _UNINTERRUPTED:
        directory = tmp_path_factory.mktemp(f"whole_{mode}")
        whole = pipeline(mode, optimizer=optimizer)
        train(whole, 0, EPOCHS, callbacks=[PipelineCheckpoint(directory, keep=None)])
        _UNINTERRUPTED[key] = (whole, checkpoint_store.list_checkpoints(directory))
    return _UNINTERRUPTED[key]


def _adamw():
    return keras.optimizers.AdamW(3e-3, weight_decay=1e-2)


def _rmsprop():  # SpecTrain keeps its last update in a slot of its own
    return keras.optimizers.RMSprop(1e-3)


@pytest.mark.parametrize(
    "mode, optimizer",
    [("spectrain", None), ("stash", None), ("vanilla", None), ("spectrain", _adamw),
     ("spectrain", _rmsprop)],
)
def test_resumed_after_epoch_e_equals_uninterrupted(mode, optimizer, tmp_path_factory):
    whole, paths = uninterrupted(mode, tmp_path_factory, optimizer)
    assert [os.path.basename(p) for p in paths] == [
        f"ckpt-e{e:04d}-b000000" for e in range(1, EPOCHS + 1)
    ]
    resumed = pipeline(mode, optimizer=optimizer)  # a fresh one, initialised the same way
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
        (lambda: pipeline(width=10), {"seed": 7}, ["architecture"]),
        (lambda: pipeline(), {"seed": 8}, ["extra.seed: the checkpoint has 7, this run has 8"]),
    ],
    ids=["mode", "model", "run"],
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


def test_a_planned_pipeline_restores_at_the_checkpoints_cuts(tmp_path_factory):
    # Timings vary between runs, so a fresh plan may cut elsewhere than the run that saved
    # the checkpoint; the restore re-cuts the planned pipeline at the saved cuts.
    whole, paths = uninterrupted("spectrain", tmp_path_factory)  # cuts dense0, bn
    first = paths[0]
    resumed = PipelineModel(tiny_model(), num_stages=3, mode="spectrain")
    assert resumed.planned_cuts and resumed.partition_plan.cuts == resumed.cuts
    resumed.use_cuts(["pool", "dense1"])  # stands in for a plan that came out differently
    resumed.compile(
        SpecTrainSGD(0.05, momentum=0.9, weight_decay=1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ["accuracy"],
    )
    info = restore_checkpoint(resumed, first)
    assert resumed.cuts == ["dense0", "bn"]
    train(resumed, info["epoch"], EPOCHS)
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_given_cuts_are_kept_and_the_checkpoint_is_re_cut_into_them(tmp_path_factory):
    _, paths = uninterrupted("spectrain", tmp_path_factory)  # its epoch-1 checkpoint
    arrays, _ = checkpoint_store.load_checkpoint(paths[0])
    other = pipeline("spectrain", cuts=("pool", "dense1"))
    restore_checkpoint(other, paths[0])
    assert other.cuts == ["pool", "dense1"]
    weights = {id(w) for w in other.model.weights}  # (the stages keep the random states)
    for i, v in enumerate(other.model.variables):
        if id(v) in weights:
            np.testing.assert_array_equal(arrays[f"model/variables/{i}"], v.numpy())
