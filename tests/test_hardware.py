"""Tests for tf_spectrain.costmodel.hardware and links: the presets, the checks of a `Hardware`,
and its transfer and ring all-reduce times worked out by hand."""

import math

import pytest
from costmodel_helpers import hw

from tf_spectrain import costmodel
from tf_spectrain.costmodel import Hardware

# --- Hardware -----------------------------------------------------------------------------


def test_presets_follow_the_issue():
    assert costmodel.PCIE3_X16.bandwidth == pytest.approx(12e9, rel=0.1)
    assert costmodel.NVLINK.bandwidth == pytest.approx(150e9, rel=0.1)
    assert costmodel.PCIE3_X16.num_gpus == costmodel.NVLINK.num_gpus == 4


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_gpus=0), ValueError, r"num_gpus=0"),
        (dict(num_gpus=True), TypeError, r"num_gpus=True"),
        (dict(num_gpus=2.0), TypeError, r"`num_gpus` must be an int"),
        (dict(relative_speed=0), ValueError, r"number > 0 .*relative_speed=0$"),
        (dict(relative_speed=float("nan")), ValueError, r"relative_speed=nan"),
        (dict(relative_speed="fast"), TypeError, r"relative_speed='fast'"),
        (dict(bandwidth=0), ValueError, r"PCIe 3.0 x16 is about 12e9"),
        (dict(bandwidth=-1e9), ValueError, r"bandwidth=-1000000000.0"),
        (dict(latency=-1e-6), ValueError, r"latency=-1e-06"),
        (dict(latency=math.inf), ValueError, r"finite"),
        (dict(concurrency=0), ValueError, r"concurrency=0"),
        (dict(concurrency=5), ValueError, r"cannot exceed `num_gpus`.*num_gpus=4"),
        (dict(name=3), TypeError, r"name=3"),
    ],
)
def test_hardware_rejects_bad_arguments(kwargs, error, match):
    args = dict(num_gpus=4, relative_speed=1.0, bandwidth=1e9, latency=0.0)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        Hardware(**args)


@pytest.mark.parametrize(
    "bandwidth, latency, num_bytes, expected",
    [
        (10.0, 0.5, 0, 0.0),  # nothing to send: no latency either
        (10.0, 0.5, 10, 1.5),
        (10.0, 0.0, 25, 2.5),
        (math.inf, 0.25, 1e9, 0.25),  # a free link still has latency
    ],
)
def test_transfer_time(bandwidth, latency, num_bytes, expected):
    machine = hw(bandwidth=bandwidth, latency=latency)
    assert machine.transfer_time(num_bytes) == pytest.approx(expected)


@pytest.mark.parametrize(
    "n, bandwidth, latency, num_bytes, expected",
    [
        (1, 10.0, 1.0, 100, 0.0),  # one device: nothing to reduce
        (2, 10.0, 1.0, 100, 12.0),  # 2*1/2 * 100/10 + 2*1 * 1
        (4, 10.0, 0.0, 100, 15.0),  # 2*3/4 * 100/10
        (4, 60.0, 0.1, 120, 3.6),  # 2*3/4 * 2 + 6 * 0.1
        (3, 10.0, 1.0, 0, 0.0),  # no weights
    ],
)
def test_ring_allreduce_time(n, bandwidth, latency, num_bytes, expected):
    machine = Hardware(n, 1.0, bandwidth, latency)
    assert machine.allreduce_time(num_bytes) == pytest.approx(expected)


def test_replace_keeps_default_concurrency_in_step_with_num_gpus():
    eight = costmodel.NVLINK.replace(num_gpus=8)
    assert (eight.num_gpus, eight.concurrency) == (8, 8.0)
    assert eight.bandwidth == costmodel.NVLINK.bandwidth
    shared = hw(num_gpus=4, concurrency=1.5).replace(num_gpus=2)
    assert shared.concurrency == 1.5
    with pytest.raises(TypeError, match=r"Unknown Hardware field.*'speed'"):
        costmodel.PCIE3_X16.replace(speed=2.0)
