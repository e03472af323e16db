"""Tests for tf_spectrain.partition.placement: `place_stages` copies stages onto devices and
`copy_weights` writes their weights back."""


import numpy as np
import pytest
from partition_helpers import (
    RNG,
    _assert_same,
    _cnn_functional,
    _images,
    _run_chain,
    _tiny_resnet,
    _vgg_sequential,
)

from tf_spectrain.partition import (
    copy_weights,
    place_stages,
    split_model,
)

# ------------------------------------------------------------------- place_stages


def test_place_stages_puts_variables_on_devices_and_copies_weights():
    model = _tiny_resnet(True)
    stages = split_model(model, ["b1_out", "b2_out"])
    devices = ["/CPU:1", "/CPU:2", "/CPU:3"]
    placed = place_stages(stages, devices)
    for k, (stage, copy) in enumerate(zip(stages, placed)):
        assert copy is not stage and len(copy.weights) == len(stage.weights)
        for v, w in zip(copy.weights, stage.weights):
            assert v.value.device.endswith(f"device:CPU:{k + 1}"), v.value.device
            assert v is not w
            np.testing.assert_array_equal(v.numpy(), w.numpy())
    x = _images((8, 8, 3))
    _assert_same(_run_chain(placed, x, training=False), model(x, training=False))


def test_copy_weights_writes_back_into_the_model():
    model = _cnn_functional()
    stages = split_model(model, ["relu1"])
    placed = place_stages(stages, ["/CPU:0", "/CPU:1"])
    # Change every weight of the copies, BatchNorm statistics included.
    for copy in placed:
        for v in copy.weights:
            v.assign(RNG.random(v.shape, dtype=np.float32) + 0.5)
    x = _images((8, 8, 3))
    assert not np.allclose(_run_chain(placed, x), model(x))
    copy_weights(placed, stages)
    expected = {v.path: v.numpy() for copy in placed for v in copy.weights}
    actual = {v.path: v.numpy() for v in model.weights}
    assert expected.keys() == actual.keys()
    for path in expected:
        np.testing.assert_array_equal(actual[path], expected[path])
    _assert_same(model(x), _run_chain(placed, x))


@pytest.mark.parametrize(
    "devices, error, match",
    [
        (["/CPU:0"], ValueError, r"2 stages but 1 devices\. Received: devices=\['/CPU:0'\]"),
        ("/CPU:0", TypeError, "list of device names"),
        (["/CPU:0", 1], TypeError, "1 of type int"),
        (["/CPU:0", "CPU-1"], ValueError, "valid device names.*'CPU-1'"),
        (["/CPU:0", "/CPU:9"], ValueError, r"exist.*'/CPU:9'.*available: .*'/CPU:3'"),
    ],
)
def test_place_stages_rejects_bad_devices(devices, error, match):
    stages = split_model(_vgg_sequential(), ["block1_pool"])
    with pytest.raises(error, match=match):
        place_stages(stages, devices)


def test_copy_weights_rejects_mismatches():
    first = split_model(_vgg_sequential(), ["block1_pool"])
    second = split_model(_vgg_sequential(), ["block2_pool"])
    with pytest.raises(ValueError, match="same length.*2 sources and 1 destinations"):
        copy_weights(first, first[:1])
    with pytest.raises(ValueError, match="Model 0.*source has 2 weights but the destination has 4"):
        copy_weights(first, second)
    with pytest.raises(TypeError, match="`dst_models` must be a list of keras.Model"):
        copy_weights(first, [1, 2])
