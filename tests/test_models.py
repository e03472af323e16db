"""Tests for the model zoo `tf_spectrain.models`.

Parameter counts and depths are recomputed here from the architecture descriptions, and
graph properties (depth, tensors crossing a cut) are read from the functional graph through
the public `operations` / `input` / `output` attributes.
"""

import keras
import numpy as np
import pytest

from tf_spectrain import models

BATCH = 2


# ---------------------------------------------------------------- independent counting


def conv_params(kernel, c_in, c_out, bias=False):
    return kernel * kernel * c_in * c_out + (c_out if bias else 0)


def bn_params(channels):
    return 4 * channels  # gamma, beta, moving mean, moving variance


def dense_params(n_in, n_out):
    return n_in * n_out + n_out


def expected_vgg16_params(height, width, channels, num_classes, divisor=1):
    blocks = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    total, c_in = 0, channels
    for filters in blocks:
        for c_out in filters:
            c_out = max(1, c_out // divisor)
            total += conv_params(3, c_in, c_out) + bn_params(c_out)
            c_in = c_out
        height, width = height // 2, width // 2
    flat = height * width * c_in
    fc = max(1, 512 // divisor)
    return total + dense_params(flat, fc) + dense_params(fc, fc) + dense_params(fc, num_classes)


def expected_cifar_resnet_params(channels, num_classes, n):
    total = conv_params(3, channels, 16) + bn_params(16)
    c_in = 16
    for stage, f in enumerate([16, 32, 64]):
        for block in range(n):
            total += conv_params(3, c_in, f) + bn_params(f) + conv_params(3, f, f) + bn_params(f)
            if c_in != f or (stage > 0 and block == 0):
                total += conv_params(1, c_in, f) + bn_params(f)
            c_in = f
    return total + dense_params(64, num_classes)


def expected_resnet50_params(channels, num_classes):
    # keras.applications ResNet50: convolutions with bias, bottleneck blocks of 1x1-3x3-1x1.
    total = conv_params(7, channels, 64, bias=True) + bn_params(64)
    c_in = 64
    for f, blocks in zip([64, 128, 256, 512], [3, 4, 6, 3]):
        for block in range(blocks):
            if block == 0:
                total += conv_params(1, c_in, 4 * f, bias=True) + bn_params(4 * f)
            total += conv_params(1, c_in, f, bias=True) + bn_params(f)
            total += conv_params(3, f, f, bias=True) + bn_params(f)
            total += conv_params(1, f, 4 * f, bias=True) + bn_params(4 * f)
            c_in = 4 * f
    return total, total + dense_params(c_in, num_classes)


def expected_small_cnn_params(height, width, channels, num_classes, scale=1.0):
    f1, f2, units = (max(1, round(n * scale)) for n in (16, 32, 64))
    flat = (height // 2 // 2) * (width // 2 // 2) * f2
    return (
        conv_params(3, channels, f1) + bn_params(f1) + conv_params(3, f1, f2) + bn_params(f2)
        + dense_params(flat, units) + dense_params(units, num_classes)
    )


def expected_mlp_params(shape, num_classes, hidden):
    flat = int(np.prod(shape))
    return (
        dense_params(flat, hidden) + dense_params(hidden, hidden)
        + dense_params(hidden, num_classes)
    )


# ---------------------------------------------------------------- graph helpers


def _flat(tensors):
    return keras.tree.flatten(tensors)


def _inputs_of(op):
    return [] if isinstance(op, keras.layers.InputLayer) else _flat(op.input)


def _producer_index(model):
    """Maps id(tensor) to the position in `model.operations` of the op that produced it."""
    return {id(t): i for i, op in enumerate(model.operations) for t in _flat(op.output)}


def main_path_depth(model):
    """Longest chain of Conv2D/Dense layers from the input to the output."""
    producer = _producer_index(model)
    depth = []
    for op in model.operations:  # topological order
        before = [depth[producer[id(t)]] for t in _inputs_of(op)]
        own = 1 if isinstance(op, (keras.layers.Conv2D, keras.layers.Dense)) else 0
        depth.append(own + max(before, default=0))
    return depth[-1]


def tensors_crossing_cut_after(model, layer_name):
    """Ids of tensors produced up to `layer_name` (in op order) and consumed after it."""
    ops = model.operations
    cut = [op.name for op in ops].index(layer_name)
    producer = _producer_index(model)
    return {
        id(t) for op in ops[cut + 1:] for t in _inputs_of(op) if producer[id(t)] <= cut
    }


def forward(model, input_shape):
    x = np.random.default_rng(0).normal(size=(BATCH, *input_shape)).astype("float32")
    return keras.ops.convert_to_numpy(model(x, training=False))


def assert_logits_head(model, num_classes):
    head = model.get_layer("predictions")
    assert model.layers[-1] is head
    assert head.units == num_classes
    assert head.activation is keras.activations.linear


# ---------------------------------------------------------------- fixtures (big models, once)


@pytest.fixture(scope="module")
def vgg16():
    return models.get_model("vgg16", input_shape=(32, 32, 3), num_classes=10)


@pytest.fixture(scope="module")
def resnet50():
    return models.get_model("resnet50", input_shape=(32, 32, 3), num_classes=10)


@pytest.fixture(scope="module")
def resnet20():
    return models.get_model("resnet20", input_shape=(32, 32, 3), num_classes=10)


# ---------------------------------------------------------------- registry


def test_model_names_lists_all_nine_sorted():
    names = models.model_names()
    assert names == sorted(names)
    assert set(names) == {"mlp", "small_cnn", "vgg16", "resnet20", "resnet56", "resnet50",
                          "transformer_lm", "transformer_classifier", "residual_lstm"}
    # The text models (test_text_models.py) take token ids, the others images or anything.
    assert {models.model_input_kind(n) for n in names} == {"image", "tokens", "any"}


@pytest.mark.parametrize(
    "name, input_shape, num_classes, kwargs, params, depth",
    [
        ("mlp", (8, 8, 1), 10, {}, lambda: expected_mlp_params((8, 8, 1), 10, 128), 3),
        ("mlp", (20,), 3, {"hidden": 7}, lambda: expected_mlp_params((20,), 3, 7), 3),
        ("small_cnn", (32, 32, 3), 10, {}, lambda: expected_small_cnn_params(32, 32, 3, 10), 4),
        ("small_cnn", (40, 57, 1), 2, {"width": 0.5},
         lambda: expected_small_cnn_params(40, 57, 1, 2, scale=0.5), 4),
        ("resnet20", (36, 48, 2), 5, {}, lambda: expected_cifar_resnet_params(2, 5, 3), 20),
        ("resnet56", (32, 32, 3), 100, {}, lambda: expected_cifar_resnet_params(3, 100, 9), 56),
    ],
)
def test_models_shapes_params_and_depth(name, input_shape, num_classes, kwargs, params, depth):
    model = models.get_model(name, list(input_shape), num_classes, **kwargs)
    assert model.name == name
    assert model.count_params() == params()
    # Depth: the longest chain of conv + dense layers (shortcut convs are off the main path).
    assert main_path_depth(model) == depth
    assert_logits_head(model, num_classes)
    assert forward(model, input_shape).shape == (BATCH, num_classes)


def test_layer_names_are_stable_across_builds():
    first = [layer.name for layer in models.get_model("small_cnn", (32, 32, 3), 10).layers]
    second = [layer.name for layer in models.get_model("small_cnn", (32, 32, 3), 10).layers]
    assert first == second
    assert first == [
        "input", "conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "pool2",
        "flatten", "fc1", "predictions",
    ]


def test_models_output_logits_not_probabilities():
    model = models.get_model("mlp", (8, 8, 1), 10)
    out = forward(model, (8, 8, 1))
    assert (out < 0).any()  # a softmax output would be non-negative and sum to 1
    assert not np.allclose(out.sum(axis=1), 1.0)


# ---------------------------------------------------------------- vgg16


def test_vgg16_layer_names(vgg16):
    names = {layer.name for layer in vgg16.layers}
    convs_per_block = [2, 2, 3, 3, 3]
    expected = {"flatten", "fc1", "fc2", "predictions"}
    for b, convs in enumerate(convs_per_block, start=1):
        expected.add(f"block{b}_pool")
        for c in range(1, convs + 1):
            expected |= {f"block{b}_conv{c}", f"block{b}_bn{c}", f"block{b}_relu{c}"}
    assert expected <= names
    conv_layers = [layer for layer in vgg16.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len(conv_layers) == 13
    assert not any(layer.use_bias for layer in conv_layers)


def test_vgg16_params_shape_and_logits(vgg16):
    expected = expected_vgg16_params(32, 32, 3, 10)
    assert vgg16.count_params() == expected
    assert 15.2e6 < expected < 15.3e6
    assert vgg16.name == "vgg16"
    assert_logits_head(vgg16, 10)
    assert forward(vgg16, (32, 32, 3)).shape == (BATCH, 10)
    assert main_path_depth(vgg16) == 16


@pytest.mark.parametrize("divisor", [8, 1, 1000])
def test_vgg16_narrow_is_vgg16_with_divided_widths(vgg16, divisor):
    narrow = models.vgg16_narrow((32, 32, 3), 10, divisor=divisor)
    assert narrow.name == f"vgg16_div{divisor}"
    assert [layer.name for layer in narrow.layers] == [layer.name for layer in vgg16.layers]
    assert narrow.count_params() == expected_vgg16_params(32, 32, 3, 10, divisor)
    assert_logits_head(narrow, 10)
    assert forward(narrow, (32, 32, 3)).shape == (BATCH, 10)
    assert "vgg16_narrow" not in models.model_names()  # a builder outside the registry


def test_vgg16_narrow_default_is_a_quarter_million_weights():
    assert 0.23e6 < models.vgg16_narrow((32, 32, 3), 10).count_params() < 0.25e6


@pytest.mark.parametrize(
    "divisor, error, match",
    [
        (0, ValueError, r"`divisor` must be an integer >= 1\. Received: divisor=0$"),
        (2.0, TypeError, r"Received: divisor=2\.0 of type float"),
        (True, TypeError, r"Received: divisor=True of type bool"),
    ],
)
def test_vgg16_narrow_checks_its_divisor(divisor, error, match):
    with pytest.raises(error, match=match):
        models.vgg16_narrow((32, 32, 3), 10, divisor=divisor)


# ---------------------------------------------------------------- CIFAR ResNets


def test_resnet20_block_names_and_shortcuts(resnet20):
    names = {layer.name for layer in resnet20.layers}
    assert {"conv1", "bn1", "relu1", "avg_pool", "predictions"} <= names
    parts = ["conv1", "bn1", "relu1", "conv2", "bn2", "add", "out"]
    for s in (1, 2, 3):
        for b in (1, 2, 3):
            assert {f"stage{s}_block{b}_{p}" for p in parts} <= names
            projection = s > 1 and b == 1
            for p in ("shortcut_conv", "shortcut_bn"):
                assert (f"stage{s}_block{b}_{p}" in names) == projection


def test_resnet20_params_and_shape(resnet20):
    assert resnet20.count_params() == expected_cifar_resnet_params(3, 10, 3)
    assert_logits_head(resnet20, 10)
    assert forward(resnet20, (32, 32, 3)).shape == (BATCH, 10)


@pytest.mark.parametrize(
    "add_name, expected_inputs",
    [
        ("stage1_block1_add", ["stage1_block1_bn2", "relu1"]),
        ("stage2_block1_add", ["stage2_block1_bn2", "stage2_block1_shortcut_bn"]),
        ("stage2_block2_add", ["stage2_block2_bn2", "stage2_block1_out"]),
        ("stage3_block3_add", ["stage3_block3_bn2", "stage3_block2_out"]),
    ],
)
def test_resnet_add_joins_main_path_and_shortcut(resnet20, add_name, expected_inputs):
    add = resnet20.get_layer(add_name)
    assert len(add.input) == 2
    sources = [resnet20.get_layer(n).output for n in expected_inputs]
    assert [id(t) for t in add.input] == [id(t) for t in sources]


def test_resnet20_cut_inside_block_is_crossed_by_two_tensors(resnet20):
    crossing = tensors_crossing_cut_after(resnet20, "stage2_block1_relu1")
    expected = {
        id(resnet20.get_layer("stage2_block1_relu1").output),
        id(resnet20.get_layer("stage1_block3_out").output),  # the block input
    }
    assert crossing == expected
    # Between blocks only the block output crosses.
    between = tensors_crossing_cut_after(resnet20, "stage2_block1_out")
    assert between == {id(resnet20.get_layer("stage2_block1_out").output)}


# ---------------------------------------------------------------- resnet50


def test_resnet50_is_flat_with_application_layer_names(resnet50):
    names = [layer.name for layer in resnet50.layers]
    assert resnet50.name == "resnet50"
    assert not any(isinstance(layer, keras.Model) for layer in resnet50.layers)
    for name in ("conv1_conv", "conv2_block3_out", "conv3_block4_out", "conv4_block6_out",
                 "conv5_block3_out", "avg_pool", "predictions"):
        assert name in names
    assert len(resnet50.get_layer("conv3_block4_add").input) == 2


def test_resnet50_params_and_shape(resnet50):
    backbone, total = expected_resnet50_params(3, 10)
    assert 23.5e6 < backbone < 23.6e6
    assert resnet50.count_params() == total
    assert_logits_head(resnet50, 10)
    assert forward(resnet50, (32, 32, 3)).shape == (BATCH, 10)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "name, match",
    [
        ("vgg61", r"`name` must be one of \['mlp', .*'vgg16'\]\. Received: name='vgg61'; "
                  r"did you mean 'vgg16'\?"),
        ("ResNet20", r"Received: name='ResNet20'; did you mean 'resnet20'\?"),
        ("transformer", r"Received: name='transformer'; did you mean 'transformer_lm'\?"),
        ("bert", r"Received: name='bert'$"),
        (None, r"`name` must be one of .* Received: name=None$"),
    ],
)
def test_unknown_name_raises(name, match):
    with pytest.raises(ValueError, match=match):
        models.get_model(name, (32, 32, 3), 10)


@pytest.mark.parametrize(
    "name, input_shape",
    [
        ("vgg16", (16, 16, 3)),
        ("resnet20", (32, 31, 3)),
        ("resnet50", (28, 28, 1)),
        ("small_cnn", (32, 32)),
        ("small_cnn", (32, 32, 3, 1)),
        ("small_cnn", (32, 32, 0)),
        ("small_cnn", (32.0, 32, 3)),
        ("small_cnn", "32x32x3"),
        ("mlp", ()),
        ("mlp", (8, -8, 1)),
        ("mlp", (8, True, 1)),
        ("mlp", None),
    ],
)
def test_bad_input_shape_raises(name, input_shape):
    with pytest.raises(ValueError, match=rf"`input_shape` for model '{name}' must be .*"
                                         rf"Received: input_shape="):
        models.get_model(name, input_shape, 10)


def test_conv_input_shape_message_names_the_minimum():
    with pytest.raises(ValueError, match=r"height and width >= 32\. "
                                         r"Received: input_shape=\(16, 16, 3\)"):
        models.get_model("vgg16", (16, 16, 3), 10)


@pytest.mark.parametrize("num_classes", [1, 0, -3, 2.0, "10", True, None])
def test_bad_num_classes_raises(num_classes):
    with pytest.raises(ValueError, match=r"`num_classes` must be an int >= 2\. "
                                         rf"Received: num_classes={num_classes!r}"):
        models.get_model("mlp", (8, 8, 1), num_classes)


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("mlp", {"hiden": 3}, r"'mlp': \['hiden'\]\. Valid keyword arguments: \['hidden'\]; "
                              r"did you mean 'hidden'\?"),
        ("small_cnn", {"filters": 3}, r"'small_cnn': \['filters'\]\. .*\['width'\]$"),
        ("vgg16", {"seed": 1}, r"'vgg16': \['seed'\]\. Valid keyword arguments: none$"),
    ],
)
def test_unknown_kwargs_raise_type_error(name, kwargs, match):
    with pytest.raises(TypeError, match=match):
        models.get_model(name, (32, 32, 3), 10, **kwargs)


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("mlp", {"hidden": 0}, r"`hidden` .* int >= 1\. Received: hidden=0"),
        ("mlp", {"hidden": 2.5}, r"Received: hidden=2\.5"),
        ("small_cnn", {"width": 0}, r"`width` .* number > 0\. Received: width=0"),
        ("small_cnn", {"width": "wide"}, r"Received: width='wide'"),
    ],
)
def test_bad_builder_options_raise(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        models.get_model(name, (32, 32, 3), 10, **kwargs)


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("name, input_shape", [("mlp", (8, 8, 1)), ("small_cnn", (32, 32, 3))])
def test_models_train_and_reduce_loss(name, input_shape):
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, *input_shape)).astype("float32")
    y = rng.integers(0, 4, size=16)
    model = models.get_model(name, input_shape, 4)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    losses = model.fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0]
