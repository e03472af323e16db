"""`runtime.loop`: which forwards keep their tape, learning rates across stages, stops."""

import keras
import numpy as np
import pytest

from tf_spectrain import schedule
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime.loop import keep_rules, learning_rate_reader
from tf_spectrain.schedule import modes, op_lists


def _gap(ops, i):
    """Updates applied between the forward and the backward of mini-batch i (recounted)."""
    updates, at = 0, {}
    for op in ops:
        if op.kind == schedule.UPDATE:
            updates += 1
        elif op.micro == 0 and op.kind in (schedule.FORWARD, schedule.BACKWARD):
            at[(op.kind, op.batch)] = updates
    return at[(schedule.BACKWARD, i)] - at[(schedule.FORWARD, i)]


@pytest.mark.parametrize(
    "mode, target",
    [("vanilla", "paper"), ("stash", "paper"), ("spectrain", "paper"), ("sync", "paper"),
     ("spectrain", "consistent")],
)
@pytest.mark.parametrize("num_stages", [2, 4])
def test_keep_rules_keep_the_tape_exactly_when_the_backward_uses_the_forwards_weights(
    mode, target, num_stages
):
    lists = op_lists(mode, num_stages, 6)
    plans = [modes.pass_plan(mode, k, num_stages, target) for k in range(num_stages)]
    rules = keep_rules(plans, lists)
    always = keep_rules(plans, lists, recompute="always")
    reuse = mode in ("stash", "sync") or target == "consistent"
    for k, rule in enumerate(rules):
        for i in range(6):
            gap = _gap(lists[k], i)
            if reuse:  # the backward uses the forward's weights
                expected = True
            else:  # recomputes unless no update came between and the gaps are equal
                s_f, s_b = (0, 0) if mode == "vanilla" else schedule.version_gaps(k, num_stages)
                expected = gap == 0 and s_f == s_b
            assert rule((i, 0)) == ("activations" if expected else "inputs"), (mode, k, i, gap)
            # recompute="always": never the tape; a copy of the forward's weights where the
            # backward reuses them across updates (stash, consistent: not the last stage).
            assert always[k]((i, 0)) == ("weights" if reuse and gap else "inputs")
    if mode == "vanilla":  # stage 0 of a deep pipeline recomputes most backwards
        assert not all(rules[0]((i, 0)) == "activations" for i in range(6))
    if reuse and mode != "sync":
        assert always[0]((1, 0)) == "weights"  # stage 0 of stash / consistent: updates between


@pytest.mark.parametrize("order", ["gpipe", "1f1b"])
def test_keep_rules_with_micro_batches(order):
    # Sync: no update between any F(i, j) and B(i, j), in either order: the tape (auto),
    # recompute at the same weights (always).
    plans = [modes.pass_plan("sync", k, 3) for k in range(3)]
    lists = op_lists("sync", 3, 4, 3, order)
    for recompute, expected in (("auto", "activations"), ("always", "inputs")):
        for rule in keep_rules(plans, lists, recompute):
            assert {rule((i, j)) for i in range(4) for j in range(3)} == {expected}
    # Stash with micro-batches: stage 0 keeps a weight copy for every micro-batch of the
    # mini-batches that see an update between their F and B (all but mini-batch 0).
    plans = [modes.pass_plan("stash", k, 2) for k in range(2)]
    rules = keep_rules(plans, op_lists("stash", 2, 4, 2), "always")
    assert [rules[0]((i, j)) for i in range(4) for j in range(2)] == ["inputs"] * 2 + [
        "weights"] * 6
    assert [rules[1]((i, j)) for i in range(4) for j in range(2)] == ["inputs"] * 8


def test_learning_rate_reader_reads_the_current_rate():
    optimizer = keras.optimizers.SGD(0.1)
    read = learning_rate_reader(optimizer)
    optimizer.learning_rate = 0.025
    assert read() == pytest.approx(0.025)


def test_learning_rate_reader_leaves_schedules_to_the_stages():
    schedule_ = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    assert learning_rate_reader(keras.optimizers.SGD(schedule_))() is None


def test_request_stop_from_a_batch_callback_ends_the_epoch_after_the_drain():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    h = keras.layers.Dense(4, name="d0")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="d1")(h))
    pipe = PipelineModel(model, cuts=["d0"], devices=["/CPU:0", "/CPU:1"], mode="stash")
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")

    class StopAfter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                pipe.request_stop()

    x, y = np.ones((40, 3), "float32"), np.zeros((40, 2), "float32")
    history = pipe.fit(x, y, batch_size=4, epochs=3, verbose=False, callbacks=[StopAfter()])
    assert len(history.history["loss"]) == 1  # one (shortened) epoch
    epoch, done, total = pipe.state.epoch_progress
    assert (epoch, total) == (0, 10) and 3 <= done < total  # the ones in flight finished
    assert [r.updates for r in pipe.runners] == [done, done]
    assert all(r.in_flight == 0 for r in pipe.runners)
    assert pipe.epochs_trained == 1
