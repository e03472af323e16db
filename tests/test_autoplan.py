"""`costmodel.auto_partition` passes the pipeline's options to the planner: micro-batches in
any mode, the sync schedule, recomputation, and a mixed-precision model's 2-byte activations.

The expected bytes are worked out from the layers' shapes in the tests. Tiny Dense models,
profiled at batch 8 without calibration; conftest.py has split the CPU into /CPU:0 .. /CPU:3.
"""

import keras
import pytest

from tf_spectrain import costmodel
from tf_spectrain.costmodel import measure

CPUS = ["/CPU:0", "/CPU:1"]
BATCH = 8


def make_pair(policy=None):
    """d1 (4 -> 8) and d2 (8 -> 3), built under `policy` (None: the current one)."""
    previous = keras.mixed_precision.global_policy()
    if policy is not None:
        keras.mixed_precision.set_global_policy(policy)
    try:
        inputs = keras.Input((4,), name="x")
        h = keras.layers.Dense(8, name="d1")(inputs)
        outputs = keras.layers.Dense(3, name="d2")(h)
        return keras.Model(inputs, outputs, name="pair")
    finally:
        keras.mixed_precision.set_global_policy(previous)


@pytest.fixture(scope="module")
def pair():
    return make_pair()


def test_schedule_recompute_and_micro_batches_reach_the_plan(pair):
    # Two layers on two stages: the cut is after d1. Per example, float32: stage 0 keeps
    # its inputs 4 * 4 = 16 bytes and d1's outputs 32; stage 1 its inputs 32 and d2's 12.
    # sync, 1F1B-flush, M = 4: in flight 2 and 1 of the 4 micro-batches; recompute
    # "always": each keeps its inputs plus one micro-batch's outputs, and pays its forward
    # again: (2 * 16 + 32) / 4 * 8 = 128 and (1 * 32 + 12) / 4 * 8 = 88 bytes.
    plan = costmodel.auto_partition(
        pair, CPUS, batch_size=BATCH, mode="sync", micro_batches=4, schedule="1f1b",
        recompute="always", calibration_rounds=0,
    )
    assert plan.cuts == ["d1"]
    assert (plan.micro_batches, plan.schedule, plan.recompute) == (4, "1f1b", "always")
    assert [s.activation_bytes for s in plan.stages] == pytest.approx([128, 88])
    assert all(s.recompute == pytest.approx(s.forward) and s.recompute > 0 for s in plan.stages)
    # The default schedule and recompute: GPipe keeps all 4, reusing the forward:
    # (16 + 32) * 8 = 384 and (32 + 12) * 8 = 352.
    gpipe = costmodel.auto_partition(
        pair, CPUS, batch_size=BATCH, mode="sync", micro_batches=4, calibration_rounds=0
    )
    assert [s.activation_bytes for s in gpipe.stages] == pytest.approx([384, 352])
    assert [s.recompute for s in gpipe.stages] == [0.0, 0.0]
    # Micro-batches in an asynchronous mode: stash, stage 0 keeps 2 mini-batches.
    stash = costmodel.auto_partition(
        pair, CPUS, batch_size=BATCH, mode="stash", micro_batches=4, calibration_rounds=0
    )
    assert [s.activation_bytes for s in stash.stages] == pytest.approx([2 * 384, 352])


def test_a_mixed_precision_model_plans_with_two_byte_activations(pair):
    policy = "mixed_float16"  # test_measure.py checks mixed_bfloat16's profile too
    # d1's outputs (the hand-off) and d2's are 2 bytes per element; the inputs and weights
    # stay float32. sync, M = 1: stage 0 keeps 16 + 16, stage 1 16 + 6 bytes per example.
    full = costmodel.auto_partition(pair, CPUS, batch_size=BATCH, mode="sync",
                                    calibration_rounds=0)
    mixed = costmodel.auto_partition(make_pair(policy), CPUS, batch_size=BATCH, mode="sync",
                                     calibration_rounds=0)
    assert [s.activation_bytes for s in full.stages] == pytest.approx([48 * 8, 44 * 8])
    assert [s.activation_bytes for s in mixed.stages] == pytest.approx([32 * 8, 22 * 8])
    assert [s.sent_bytes for s in mixed.stages] == pytest.approx([16 * 8, 0])
    assert [s.sent_bytes for s in full.stages] == pytest.approx([32 * 8, 0])
    weights = [4 * (4 * 8 + 8), 4 * (8 * 3 + 3)]
    for plan in (full, mixed):
        assert [s.param_bytes for s in plan.stages] == weights
        assert [s.optimizer_bytes for s in plan.stages] == weights


def forbid_profiling(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the model was profiled")

    monkeypatch.setattr(measure, "profile_model", fail)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="stash", schedule="1f1b"),
         r"`schedule` must be 'gpipe' unless mode='sync'.*schedule='1f1b' with mode='stash'"),
        (dict(mode="sync", schedule="interleaved"), r"Received: schedule='interleaved'"),
        (dict(recompute="never"), r"`recompute` must be one of \['auto', 'always'\]"),
        (dict(micro_batches=0), r"micro_batches=0"),
        (dict(mode="async"), r"`mode` must be one of"),
    ],
)
def test_bad_options_are_refused_before_profiling(pair, monkeypatch, kwargs, match):
    forbid_profiling(monkeypatch)
    with pytest.raises(ValueError, match=match):
        costmodel.auto_partition(pair, CPUS, batch_size=BATCH, **kwargs)
