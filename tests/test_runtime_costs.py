"""Tests for tf_spectrain.costmodel.runtime_costs: the runtime's fixed host cost per
mini-batch, and how the predictions charge it. Expected values are worked out by hand from
the four-layer CHAIN profile (costmodel_helpers.py) and the formula in the module."""

import math

import pytest
from costmodel_helpers import CHAIN, hw

from tf_spectrain import costmodel
from tf_spectrain.costmodel import runtime_costs
from tf_spectrain.costmodel.runtime_costs import RuntimeCosts, fit_line

COSTS = RuntimeCosts(batch_seconds=1.0, stage_seconds=0.5, remote_stage_seconds=2.0)


@pytest.mark.parametrize("stages, remote, floor", [
    (1, 0, 1.5), (2, 0, 2.0), (4, 0, 3.0), (4, 1, 5.0), (4, 4, 11.0),
])
def test_floor_is_a_line_in_the_stages(stages, remote, floor):
    assert COSTS.floor(stages, remote) == floor


def test_floor_grows_with_the_layers():
    costs = RuntimeCosts(batch_seconds=1.0, stage_seconds=0.5, layer_seconds=0.25)
    assert costs.floor(2, layers=8) == 1.0 + 1.0 + 2.0


@pytest.mark.parametrize("field, value, error", [
    ("batch_seconds", -1.0, ValueError), ("stage_seconds", "fast", TypeError),
    ("remote_stage_seconds", math.nan, ValueError), ("layer_seconds", -0.5, ValueError),
])
def test_costs_must_be_numbers_at_least_zero(field, value, error):
    with pytest.raises(error, match=f"`{field}`"):
        RuntimeCosts(**{field: value})


def test_more_remote_stages_than_stages_is_refused():
    with pytest.raises(ValueError, match="`remote_stages`"):
        COSTS.floor(2, 3)


@pytest.mark.parametrize("points, line", [
    ([(1, 3.0), (2, 5.0), (4, 9.0)], (1.0, 2.0)),  # exactly on s = 1 + 2 N
    ([(1, 2.0), (3, 2.0)], (2.0, 0.0)),  # flat
    ([(1, 4.0), (2, 1.0)], (2.5, 0.0)),  # falling: slope clipped to 0, the mean stays
])
def test_fit_line(points, line):
    assert fit_line(points) == pytest.approx(line)


def test_fit_line_needs_two_stage_counts():
    with pytest.raises(ValueError, match="two distinct N"):
        fit_line([(4, 1.0), (4, 2.0)])


def test_measured_runtimes_are_lines_that_grow_with_the_stages():
    for costs in (costmodel.PASS_BY_PASS, costmodel.WINDOWS):
        assert costs.stage_seconds > 0 and costs.floor(8) > costs.floor(1)
    # Windows are what issue 17 is for: a lower floor at every depth.
    assert all(costmodel.WINDOWS.floor(n) < costmodel.PASS_BY_PASS.floor(n) / 4
               for n in (1, 2, 4, 8))


def test_the_floor_bounds_a_pipeline_from_below():
    # CHAIN cut after l1: stage 0 F = 2, B = 3; stage 1 F = 3, B = 5; sends 20 B / 10 B/s
    # = 2 s each way. Without overlap the busiest stage is stage 1: 3 + 5 + 2 = 10 s.
    hardware = hw(2)
    plain = costmodel.predict_pipeline(CHAIN, hardware, 1, ["l1"])
    assert plain.seconds_per_batch == pytest.approx(10.0)
    cheap = costmodel.predict_pipeline(CHAIN, hardware, 1, ["l1"], runtime=COSTS)
    assert cheap.seconds_per_batch == pytest.approx(10.0)  # floor 2 s: compute bounds
    dear = RuntimeCosts(batch_seconds=20.0, stage_seconds=1.0)
    bound = costmodel.predict_pipeline(CHAIN, hardware, 1, ["l1"], runtime=dear)
    assert bound.seconds_per_batch == pytest.approx(22.0)  # 20 + 2 x 1
    epoch = costmodel.predict_pipeline(CHAIN, hardware, 1, ["l1"], num_batches=5,
                                       runtime=dear)
    assert epoch.epoch_seconds == pytest.approx(5 * 22.0)


def test_stages_on_other_hosts_pay_the_remote_cost():
    # Two hosts of one device each: stage 1 is on host 1, remote to the trainer.
    two_hosts = hw(2).replace(num_hosts=2, inter_host_bandwidth=10.0, inter_host_latency=0.0)
    dear = RuntimeCosts(batch_seconds=20.0, stage_seconds=1.0, remote_stage_seconds=4.0)
    estimate = costmodel.predict_pipeline(CHAIN, two_hosts, 1, ["l1"], runtime=dear)
    assert estimate.seconds_per_batch == pytest.approx(26.0)
    assert runtime_costs.runtime_floor(dear, two_hosts, [0, 1]) == 26.0
    assert runtime_costs.runtime_floor(None, two_hosts, [0, 1]) == 0.0


def test_sync_and_hybrid_take_the_floor_too():
    dear = RuntimeCosts(batch_seconds=100.0, stage_seconds=10.0)
    sync = costmodel.predict_sync(CHAIN, hw(2), 1, ["l1"], runtime=dear)
    assert sync.seconds_per_batch == pytest.approx(120.0)
    hybrid = costmodel.predict_hybrid(CHAIN, hw(4), 2, ["l1"], replicas=2, runtime=dear)
    assert hybrid.seconds_per_batch == pytest.approx(140.0)  # 4 stages in all


def test_calibrate_stages_scales_each_stage_to_its_measured_times():
    # CHAIN cut after l1: stage 0 = l0, l1 (F 2, B 3), stage 1 = l2, l3 (F 3, B 5).
    measured = [(4.0, 10.0), (3.0, 4.0)]  # stage 0: F x2, B 6/3 = x2; stage 1: F x1, B x0.2
    calibrated = costmodel.calibrate_stages(CHAIN, ["l1"], measured)
    times = [t for layer in calibrated.layers for t in (layer.forward_time, layer.backward_time)]
    assert times == pytest.approx([2, 4, 2, 2, 2, 0.4, 1, 0.6])
    assert [layer.output_bytes for layer in calibrated.layers] == [10, 20, 5, 0]
    stages = calibrated.stage_costs(["l1"])
    assert [t for s in stages for t in (s.forward_time, s.forward_time + s.backward_time)] == \
        pytest.approx([t for pair in measured for t in pair])
    with pytest.raises(ValueError, match="one \\(forward, forward \\+ backward\\) pair"):
        costmodel.calibrate_stages(CHAIN, ["l1"], measured[:1])
