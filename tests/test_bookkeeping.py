"""`runtime.bookkeeping`: the running loss and metrics of `fit`, and non-finite losses."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain.runtime.bookkeeping import NonFiniteLossError, TrainLogs, metric_logs
from tf_spectrain.runtime.state import Progress


class _Runner:
    """What TrainLogs reads of a stage: penalties, its recent passes, the optimizer.

    `first`: `(end, kind, key)` of its one non-finite pass, after a finite one."""

    def __init__(self, k, penalties=None, first=None, lr=0.1):
        self.k, self.device = k, f"/CPU:{k}"
        self.penalties = dict(penalties or {})
        self.events = [(0.5, "forward", (0, 0), tf.constant(True))]
        if first is not None:
            self.events.append((*first, tf.constant(False)))
        self.optimizer = keras.optimizers.SGD(lr)


def _part(loss, logits, labels):
    return tf.constant(loss), tf.constant(logits), tf.constant(labels)


def test_record_adds_losses_penalties_and_metrics_weighted_by_size():
    runners = [_Runner(0, {0: [0.5], 1: [0.25]}), _Runner(1, {0: [0.1]})]
    metric = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    logs = TrainLogs(runners, [metric], Progress())
    # mini-batch 0: two micro-batches (losses already scaled by their share), 3 examples
    parts = [_part(1.0, [[0.0, 1.0], [1.0, 0.0]], [1, 1]), _part(2.0, [[1.0, 0.0]], [0])]
    logs.record(0, 0, parts, "stop")
    logs.record(0, 1, [_part(4.0, [[0.0, 1.0]], [1])], "stop")
    loss0, loss1 = 1.0 + 2.0 + 0.5 + 0.1, 4.0 + 0.25
    result = logs.result()
    assert result["loss"] == pytest.approx((3 * loss0 + 1 * loss1) / 4)
    assert result["accuracy"] == pytest.approx(3 / 4)  # [1, 0, 1] right of [1, 1, 0], then 1
    assert logs.progress.images_seen == 4
    assert runners[0].penalties == {} and runners[1].penalties == {}


def test_reset_starts_a_new_epoch():
    metric = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    logs = TrainLogs([_Runner(0)], [metric], Progress())
    logs.record(0, 0, [_part(3.0, [[1.0, 0.0]], [0])], "stop")
    logs.reset()
    logs.record(1, 0, [_part(5.0, [[1.0, 0.0]], [1])], "stop")
    assert logs.result() == {"loss": pytest.approx(5.0), "accuracy": pytest.approx(0.0)}


def test_skip_leaves_a_non_finite_batch_out_and_counts_it():
    progress = Progress()
    logs = TrainLogs([_Runner(0)], [], progress)
    logs.record(0, 0, [_part(2.0, [[1.0]], [0])], "skip")
    logs.record(0, 1, [_part(float("nan"), [[1.0]], [0])], "skip")
    assert logs.result()["loss"] == pytest.approx(2.0)
    assert (progress.batches_skipped, progress.images_seen) == (1, 2)


def test_stop_names_the_first_stage_that_went_non_finite():
    runners = [_Runner(0, first=(5.0, "backward", (3, 0)), lr=0.5),
               _Runner(1, first=(2.0, "forward", (2, 0)), lr=0.25)]
    progress = Progress(epoch_progress=(1, 2, 10))
    logs = TrainLogs(runners, [], progress)
    with pytest.raises(NonFiniteLossError) as info:
        logs.record(1, 2, [_part(float("inf"), [[1.0]], [0])], "stop")
    text = str(info.value)
    assert "step 12 (mini-batch 2 of epoch 1)" in text
    assert "stage 1 (on /CPU:1), in the forward pass of mini-batch 2" in text
    assert "learning rate is 0.25" in text


def test_stop_without_a_located_pass_gives_the_last_stages_learning_rate():
    logs = TrainLogs([_Runner(0, lr=0.5), _Runner(1, lr=0.125)], [], Progress())
    with pytest.raises(NonFiniteLossError, match="; learning rate 0.125. Training stopped"):
        logs.record(0, 0, [_part(float("nan"), [[1.0]], [0])], "stop")


def test_metric_logs_spread_dict_results():
    class Pair(keras.metrics.Metric):
        def update_state(self, *args, **kwargs):
            pass

        def result(self):
            return {"a": np.float32(1.5), "b": np.float32(2.0)}

    tracker = keras.metrics.Mean()
    tracker.update_state(3.0)
    assert metric_logs(tracker, [Pair()]) == {"loss": 3.0, "a": 1.5, "b": 2.0}
