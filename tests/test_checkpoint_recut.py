"""Checkpoints restored into pipelines cut elsewhere: other cuts, more or fewer stages,
replicas, and checkpoints of the layout by stage (format version 1) written before.

The reference is the uninterrupted run: in sync mode a run resumed on another number of
stages must end with its weights and optimizer state within float tolerance (the stages
compute the same sums in other graphs). Slots are compared through the wrapped model's
optimizer, whose variables `share_state` pairs with the stages' by weight, independently
of the checkpoint's layout.
"""

import keras
import numpy as np
import pytest
import spectrain_reference as ref
from checkpoint_helpers import EPOCHS, assert_same_state, pipeline, state, train

from tf_spectrain import checkpoint as checkpoint_store
from tf_spectrain.callbacks import PipelineCheckpoint, restore_checkpoint
from tf_spectrain.checkpoint import layout, store
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

FOUR, TWO, THREE = ("dense0", "bn", "dense1"), ("bn",), ("dense0", "bn")
RTOL, ATOL = 1e-5, 1e-6  # float32 sums in other graphs


def _adamw():
    return keras.optimizers.AdamW(3e-3, weight_decay=1e-2)


def model_state(pipe):
    """The wrapped model's weights, then its optimizer's variables (the stages' slots, by
    weight), then the stages' random-generator states in model order (dropout's)."""
    seeds = [v for stage in pipe.stages for v in stage.variables if "seed" in v.path]
    return (pipe.model.get_weights() + [np.array(v.numpy()) for v in seeds]
            + [np.array(v.numpy()) for v in pipe.model.optimizer.variables])


def assert_close(a, b):
    """Within float tolerance; returns the largest absolute difference seen."""
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)
        if np.size(x):
            worst = max(worst, float(np.max(np.abs(np.asarray(x, float) - np.asarray(y, float)))))
    return worst


@pytest.mark.parametrize("saved_cuts, resumed_cuts", [(FOUR, TWO), (TWO, FOUR)],
                         ids=["4->2", "2->4"])
def test_sync_resumed_on_another_number_of_stages_equals_uninterrupted(
        saved_cuts, resumed_cuts, tmp_path):
    whole = pipeline("sync", cuts=saved_cuts)
    train(whole, 0, EPOCHS, callbacks=[PipelineCheckpoint(tmp_path, keep=None)])
    first = checkpoint_store.list_checkpoints(tmp_path)[0]
    resumed = pipeline("sync", cuts=resumed_cuts)
    info = restore_checkpoint(resumed, first)
    assert resumed.num_stages == len(resumed_cuts) + 1
    assert info["metadata"]["cuts"] == list(saved_cuts)
    train(resumed, info["epoch"], EPOCHS)
    worst = assert_close(model_state(whole), model_state(resumed))
    print(f"largest difference {worst:.3g}")


@pytest.mark.parametrize("optimizer", [None, _adamw], ids=["momentum", "adamw"])
def test_slots_land_on_their_weights_after_a_re_cut(optimizer, tmp_path):
    saved = pipeline("spectrain", cuts=THREE, optimizer=optimizer)
    train(saved, 0, 1, callbacks=[PipelineCheckpoint(tmp_path)])
    path = checkpoint_store.latest_checkpoint(tmp_path)
    for cuts in (TWO, FOUR):
        resumed = pipeline("spectrain", cuts=cuts, optimizer=optimizer)
        restore_checkpoint(resumed, path)
        assert_same_state(model_state(saved), model_state(resumed))
        counts = {int(o.iterations.numpy()) for o in resumed.stage_optimizers}
        assert counts == {3}  # every stage: the 3 updates of the saved epoch


def test_four_to_two_to_four_stages_gives_back_every_variable(tmp_path):
    """Save 4 stages, restore into 2, save, restore into 4: the stages' whole state again."""
    saved = pipeline("spectrain", cuts=FOUR, optimizer=_adamw)
    train(saved, 0, 1, callbacks=[PipelineCheckpoint(tmp_path / "a")])
    two = pipeline("spectrain", cuts=TWO, optimizer=_adamw)
    restore_checkpoint(two, checkpoint_store.latest_checkpoint(tmp_path / "a"))
    checkpoint_store.save(two, tmp_path / "b", epoch=1)
    four = pipeline("spectrain", cuts=FOUR, optimizer=_adamw)
    restore_checkpoint(four, checkpoint_store.latest_checkpoint(tmp_path / "b"))
    assert_same_state(state(saved), state(four))


def test_spectrain_resumes_on_fewer_stages_and_trains_on(tmp_path):
    """The documented continuation: the new pipeline starts the next epoch from the drained
    state, as a pipeline of its own stage count does after any epoch end."""
    whole = pipeline("spectrain", cuts=FOUR)
    train(whole, 0, 1, callbacks=[PipelineCheckpoint(tmp_path)])
    path = checkpoint_store.latest_checkpoint(tmp_path)
    resumed = pipeline("spectrain", cuts=TWO)
    restore_checkpoint(resumed, path)
    twin = pipeline("spectrain", cuts=TWO)  # the same state, restored at the same cuts
    restore_checkpoint(twin, path)
    train(resumed, 1, EPOCHS)
    train(twin, 1, EPOCHS)
    assert_same_state(state(twin), state(resumed))
    assert all(np.isfinite(w).all() for w in resumed.model.get_weights())
    assert not all(np.array_equal(a, b) for a, b in zip(whole.model.get_weights(),
                                                         resumed.model.get_weights()))


def test_an_optimizer_variable_of_no_known_role_stays_at_its_cuts(tmp_path, monkeypatch):
    from tf_spectrain.checkpoint import pipeline_layout

    def no_roles(optimizer):
        return [None] * len(optimizer.variables)

    monkeypatch.setattr(pipeline_layout.optimizer_view, "variable_roles", no_roles)
    saved = pipeline("spectrain", cuts=THREE)
    path = checkpoint_store.save(saved, tmp_path, epoch=0)
    same = pipeline("spectrain", cuts=THREE)
    restore_checkpoint(same, path)
    assert_same_state(state(saved), state(same))
    other = pipeline("spectrain", cuts=TWO)
    before = state(other)
    with pytest.raises(checkpoint_store.CheckpointError, match="has no known role"):
        restore_checkpoint(other, path)
    assert_same_state(before, state(other))  # nothing was assigned


# --- the asynchronous modes against the NumPy reference of SPECTRAIN.md, re-cut -----------

LAYERS, LR, MOMENTUM, NUM_BATCHES, BATCH = [6, 10, 10, 10, 4], 0.2, 0.9, 5, 8
REF_ATOL = 2e-5  # float32 against float64, as tests/test_pipeline_modes.py


def mlp_pipeline(params, stage_sizes, mode, target):
    inputs = keras.Input((LAYERS[0],))
    h = inputs
    for n, (w, _) in enumerate(params):
        last = n == len(params) - 1
        h = keras.layers.Dense(w.shape[1], activation=None if last else "relu",
                               name=f"dense{n}")(h)
    model = keras.Model(inputs, h)
    model.set_weights([a.astype("float32") for pair in params for a in pair])
    cuts = [f"dense{e}" for e in np.cumsum(stage_sizes)[:-1] - 1]
    pipe = PipelineModel(model, cuts=cuts, mode=mode, spectrain_target=target)
    pipe.compile(SpecTrainSGD(learning_rate=LR, momentum=MOMENTUM),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return pipe


@pytest.mark.parametrize("mode, target, first, then", [
    ("spectrain", "paper", [1, 1, 1, 1], [2, 2]),
    ("spectrain", "paper", [2, 2], [1, 1, 1, 1]),
    ("spectrain", "consistent", [1, 2, 1], [2, 2]),
    ("stash", "paper", [1, 1, 1, 1], [1, 3]),
], ids=["spectrain 4->2", "spectrain 2->4", "consistent 3->2", "stash 4->2"])
def test_async_continuation_on_other_stages_is_the_documented_one(mode, target, first, then,
                                                                  tmp_path):
    """SPECTRAIN.md 6d: after the drain, an N'-stage pipeline from the restored state,
    computed independently by the NumPy reference (re-cut between epochs 1 and 2)."""
    params, batches = ref.make_problem(7, LAYERS, NUM_BATCHES, BATCH)
    x = np.concatenate([b[0] for b in batches]).astype("float32")
    y = np.concatenate([b[1] for b in batches])
    saved = mlp_pipeline(params, first, mode, target)
    saved.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[PipelineCheckpoint(tmp_path)])
    resumed = mlp_pipeline(params, then, mode, target)
    restore_checkpoint(resumed, checkpoint_store.latest_checkpoint(tmp_path))
    resumed.fit(x, y, batch_size=BATCH, epochs=3, initial_epoch=1, shuffle=False, verbose=0)
    got = resumed.model.get_weights()

    def reference(**recut):
        final, _ = ref.train_reference(params, first, batches, mode=mode, lr=LR,
                                       momentum=MOMENTUM, epochs=3, target=target, **recut)
        return [a for pair in final for a in pair]

    def max_diff(a, b):
        return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a, b))

    assert max_diff(got, reference(recut=(1, then))) < REF_ATOL
    # ... which is neither uninterrupted run (the tolerance tells them apart)
    assert max_diff(got, reference()) > 10 * REF_ATOL
    assert max_diff(got, reference(recut=(0, then))) > 10 * REF_ATOL


# --- checkpoints by stage (format version 1), as tf_spectrain wrote them before ----------


def save_by_stage(pipe, directory, epoch):
    """A checkpoint as tf_spectrain wrote them before issue 32: by stage, no `layout`."""
    arrays = {}
    for k, (stage, optimizer) in enumerate(zip(pipe.stages, pipe.stage_optimizers)):
        for j, v in enumerate(stage.variables):
            arrays[f"stage{k}/variables/{j}"] = np.asarray(v.numpy())
        for j, v in enumerate(optimizer.variables):
            arrays[f"stage{k}/optimizer/{j}"] = np.asarray(v.numpy())
    meta = dict(checkpoint_store.describe_run(pipe), extra={},
                shuffle_seed=pipe.shuffle_seed, epochs_trained=pipe.epochs_trained)
    return store.save_checkpoint(directory, arrays, meta, epoch=epoch, batch=0, keep=None)


@pytest.mark.parametrize("cuts", [THREE, TWO, FOUR], ids=["same cuts", "2 stages", "4 stages"])
def test_a_checkpoint_by_stage_restores_into_any_cuts(cuts, tmp_path):
    saved = pipeline("spectrain", cuts=THREE, optimizer=_adamw)
    train(saved, 0, 1)
    path = save_by_stage(saved, tmp_path, 1)
    assert "layout" not in store.load_checkpoint(path)[1]["metadata"]
    resumed = pipeline("spectrain", cuts=cuts, optimizer=_adamw)
    restore_checkpoint(resumed, path)
    assert_same_state(model_state(saved), model_state(resumed))
    if cuts == THREE:
        assert_same_state(state(saved), state(resumed))


def test_a_checkpoint_by_stage_of_another_model_is_refused(tmp_path):
    saved = pipeline("spectrain", cuts=THREE)
    path = save_by_stage(saved, tmp_path, 1)
    other = pipeline("spectrain", cuts=TWO, width=10)
    with pytest.raises(checkpoint_store.CheckpointError, match="architecture"):
        restore_checkpoint(other, path)


def test_layout_keys_and_sources():
    roles = [("scalar", "_iterations"), ("slot", "momentums", 4), None]
    assert layout.optimizer_keys(2, roles) == [
        "stage2/optimizer/_iterations", "model/slots/momentums/4", "stage2/optimizer_other/2"]
    assert layout.stage_source(1, 4, 4) == 1 and layout.stage_source(1, 4, 2) == 3
    assert layout.loss_scale_source(0, 3, 2, [8.0, 2.0, 4.0]) == 1
    assert layout.loss_scale_source(0, 3, 3, [8.0, 2.0, 4.0]) == 0
    assert layout.describe_cuts(["a", "b"]) == "3 stages (cut after a, b)"
    assert layout.describe_cuts([]) == "1 stage (uncut)"


def test_converting_a_stage_that_holds_other_variables_is_refused():
    arrays = {"stage0/variables/0": np.zeros(2), "stage0/optimizer/0": np.zeros(())}
    with pytest.raises(checkpoint_store.CheckpointError, match="holds 1 variables for stage 0"):
        layout.from_stage_layout(arrays, [(["model/variables/0", "model/variables/1"],
                                           ["stage0/optimizer/_iterations"])], "ckpt")
