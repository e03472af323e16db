"""Tests for cutting Keras models into stages, describing them and placing them."""

import itertools

import keras
import numpy as np
import pytest
from keras import layers

from tf_spectrain.partition import (
    copy_weights,
    default_cuts,
    describe_stages,
    layer_costs,
    place_stages,
    split_model,
)

RNG = np.random.default_rng(0)


def _images(shape, batch=2):
    return RNG.random((batch, *shape), dtype=np.float32)


def _run_chain(stages, x, **kwargs):
    for stage in stages:
        x = stage(x, **kwargs)
    return x


def _assert_same(a, b):
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def _op_names(model):
    """Operation names in Keras' topological order, without input layers."""
    ops = model.layers if isinstance(model, keras.Sequential) else model.operations
    return [op.name for op in ops if not isinstance(op, layers.InputLayer)]


# ----------------------------------------------------------------------------- models


def _vgg_sequential():
    return keras.Sequential(
        [
            keras.Input((8, 8, 3), name="image"),
            layers.Conv2D(4, 3, padding="same", activation="relu", name="block1_conv"),
            layers.MaxPooling2D(name="block1_pool"),
            layers.Conv2D(8, 3, padding="same", activation="relu", name="block2_conv"),
            layers.MaxPooling2D(name="block2_pool"),
            layers.Flatten(name="flatten"),
            layers.Dense(16, activation="relu", name="fc"),
            layers.Dense(3, name="predictions"),
        ],
        name="tiny_vgg",
    )


def _cnn_functional():
    inputs = keras.Input((8, 8, 3), name="image")
    x = layers.Conv2D(4, 3, padding="same", name="conv1")(inputs)
    x = layers.BatchNormalization(name="bn1")(x)
    x = layers.ReLU(name="relu1")(x)
    x = layers.MaxPooling2D(name="pool1")(x)
    x = layers.Conv2D(6, 3, padding="same", activation="relu", name="conv2")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(3, name="predictions")(x)
    return keras.Model(inputs, outputs, name="tiny_cnn")


def _residual_block(x, prefix):
    r = layers.Conv2D(8, 3, padding="same", name=f"{prefix}_conv1")(x)
    r = layers.BatchNormalization(name=f"{prefix}_bn1")(r)
    r = layers.ReLU(name=f"{prefix}_relu1")(r)
    r = layers.Conv2D(8, 3, padding="same", name=f"{prefix}_conv2")(r)
    x = layers.Add(name=f"{prefix}_add")([x, r])
    return layers.ReLU(name=f"{prefix}_out")(x)


def _tiny_resnet(long_skip):
    """stem -> two residual blocks -> (optional add of the stem output) -> head."""
    inputs = keras.Input((8, 8, 3), name="image")
    stem = layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    x = _residual_block(stem, "b1")
    x = _residual_block(x, "b2")
    if long_skip:
        # The stem output skips both blocks: cutting after b1_out and b2_out, it passes
        # through the whole middle stage.
        x = layers.Add(name="long_add")([x, stem])
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(3, name="head")(x)
    return keras.Model(inputs, outputs, name="tiny_resnet")


def _two_outputs():
    """h1 is a model output and also feeds h2: it passes through every later stage."""
    inputs = keras.Input((5,), name="features")
    h1 = layers.Dense(4, name="h1")(inputs)
    h2 = layers.Dense(4, name="h2")(h1)
    h3 = layers.Dense(2, name="h3")(h2)
    return keras.Model(inputs, [h1, h3], name="two_outputs")


def _two_inputs():
    a = keras.Input((4,), name="a")
    b = keras.Input((3,), name="b")
    da = layers.Dense(5, name="da")(a)
    db = layers.Dense(5, name="db")(b)
    x = layers.Concatenate(name="cat")([da, db])
    outputs = layers.Dense(2, name="out")(x)
    return keras.Model([a, b], outputs, name="two_inputs")


@pytest.fixture(scope="module")
def vgg16():
    return keras.applications.VGG16(weights=None, input_shape=(32, 32, 3), classes=10)


@pytest.fixture(scope="module")
def resnet50():
    return keras.applications.ResNet50(
        weights=None, include_top=False, input_shape=(32, 32, 3)
    )


# ------------------------------------------------------------------------ split_model


@pytest.mark.parametrize(
    "build, shape, cuts",
    [
        (_vgg_sequential, (8, 8, 3), ["block1_pool"]),
        (_vgg_sequential, (8, 8, 3), ["block1_conv", "block2_pool", "fc"]),
        (_vgg_sequential, (8, 8, 3), []),
        (_cnn_functional, (8, 8, 3), ["bn1", "conv2"]),
        (lambda: _tiny_resnet(False), (8, 8, 3), ["b1_relu1"]),  # two tensors cross
        (lambda: _tiny_resnet(False), (8, 8, 3), ["b1_out", "b2_conv2", "gap"]),
        (lambda: _tiny_resnet(True), (8, 8, 3), ["b1_out", "b2_out"]),  # pass-through
        (lambda: _tiny_resnet(True), (8, 8, 3), ["stem", "b1_bn1", "b2_add"]),
        (_two_outputs, (5,), ["h1", "h2"]),
    ],
)
def test_chained_stages_reproduce_the_model(build, shape, cuts):
    model = build()
    x = _images(shape)
    stages = split_model(model, cuts)
    assert len(stages) == len(cuts) + 1
    _assert_same(_run_chain(stages, x), model(x))


def test_two_input_model_chains_with_inputs_as_a_list():
    model = _two_inputs()
    x = [_images((4,)), _images((3,))]
    stages = split_model(model, ["da", "cat"])
    assert len(stages[0].inputs) == 2
    _assert_same(_run_chain(stages, x), model(x))


def test_stages_share_the_model_variables():
    model = _tiny_resnet(True)
    stages = split_model(model, ["b1_out", "b2_out"])
    stage_vars = [v for stage in stages for v in stage.weights]
    assert len(stage_vars) == len(model.weights)
    assert {id(v) for v in stage_vars} == {id(v) for v in model.weights}
    # Changing a stage's weight changes the model.
    stages[1].get_layer("b2_conv1").kernel.assign(
        np.zeros(stages[1].get_layer("b2_conv1").kernel.shape)
    )
    np.testing.assert_array_equal(model.get_layer("b2_conv1").kernel.numpy(), 0.0)


def test_residual_cut_inside_block_sends_two_tensors():
    model = _tiny_resnet(False)
    first, second = split_model(model, ["b1_relu1"])
    # The block input (the stem output) and the block's inner activation cross.
    assert len(first.outputs) == 2 and len(second.inputs) == 2
    stem = keras.Model(model.input, model.get_layer("stem").output)
    x = _images((8, 8, 3))
    # Crossing tensors are ordered by the layer that produced them: the stem comes first.
    np.testing.assert_array_equal(first(x)[0], stem(x))


def test_pass_through_tensor_is_forwarded_unchanged():
    model = _tiny_resnet(True)
    _, middle, _ = split_model(model, ["b1_out", "b2_out"])
    assert len(middle.inputs) == 2 and len(middle.outputs) == 2
    s, b = _images((8, 8, 8)), _images((8, 8, 8))
    # The stem output (produced first, so listed first) passes through unchanged.
    out = middle([s, b])
    np.testing.assert_array_equal(out[0], s)
    block2 = keras.Model(model.get_layer("b2_conv1").input, model.get_layer("b2_out").output)
    np.testing.assert_allclose(out[1], block2(b), rtol=1e-6, atol=1e-6)


def test_one_tensor_stages_take_and_return_tensors():
    stages = split_model(_vgg_sequential(), ["block1_pool"])
    for stage in stages:
        assert isinstance(stage.input, keras.KerasTensor)
        assert isinstance(stage.output, keras.KerasTensor)
        assert not isinstance(stage.inputs[0], list)


def test_split_works_twice_and_after_sequential_add():
    model = keras.Sequential([keras.Input((6,)), layers.Dense(4, name="a")], name="grown")
    model.add(layers.Dense(3, name="b"))  # rebuilding calls layer 'a' a second time
    model.add(layers.Dense(2, name="c"))
    x = _images((6,))
    for cuts in (["a"], ["a", "b"]):
        _assert_same(_run_chain(split_model(model, cuts), x), model(x))


@pytest.mark.parametrize("cuts", [["block2_pool", "block4_conv2", "fc1"], ["flatten"]])
def test_vgg16_chained(vgg16, cuts):
    x = _images((32, 32, 3), batch=1)
    _assert_same(_run_chain(split_model(vgg16, cuts), x), vgg16(x))


def test_vgg16_default_cuts_chained(vgg16):
    cuts = default_cuts(vgg16, 4)
    x = _images((32, 32, 3), batch=1)
    _assert_same(_run_chain(split_model(vgg16, cuts), x), vgg16(x))


@pytest.mark.parametrize(
    "cuts",
    [
        # inside residual blocks: the block input and the branch both cross
        ["conv2_block1_1_relu", "conv3_block2_add", "conv4_block1_0_conv"],
        ["conv3_block4_out"],
    ],
)
def test_resnet50_chained(resnet50, cuts):
    x = _images((32, 32, 3), batch=1)
    stages = split_model(resnet50, cuts)
    _assert_same(_run_chain(stages, x), resnet50(x))


def test_resnet50_cut_inside_block_sends_several_tensors(resnet50):
    specs = describe_stages(resnet50, ["conv3_block2_2_conv"])
    # The block input (for the identity shortcut) and the branch activation cross.
    assert specs[0].num_outputs == 2 and specs[1].num_inputs == 2


# ---------------------------------------------------------------------- describe_stages


def test_describe_stages_agrees_with_built_stages_and_model():
    model = _tiny_resnet(True)
    cuts = ["b1_out", "b2_out"]
    specs = describe_stages(model, cuts)
    stages = split_model(model, cuts)
    assert [s.index for s in specs] == [0, 1, 2]
    # The layers partition the model's layers, in order, each stage ending at its cut.
    assert [n for s in specs for n in s.layer_names] == _op_names(model)
    assert [s.layer_names[-1] for s in specs[:-1]] == cuts
    assert sum(s.num_params for s in specs) == model.count_params()
    for spec, stage in zip(specs, stages):
        assert spec.num_inputs == len(stage.inputs)
        assert spec.num_outputs == len(stage.outputs)
        assert list(spec.input_shapes) == [tuple(t.shape) for t in stage.inputs]
        assert list(spec.output_shapes) == [tuple(t.shape) for t in stage.outputs]
        layer_params = sum(stage.get_layer(n).count_params() for n in spec.layer_names)
        assert spec.num_params == layer_params
    # Only the stem output passes through the middle stage.
    assert [s.num_pass_through for s in specs] == [0, 1, 0]
    assert specs[1].input_shapes == ((None, 8, 8, 8), (None, 8, 8, 8))
    as_dict = specs[1].to_dict()
    assert as_dict["num_inputs"] == 2 and as_dict["layer_names"][0] == "b2_conv1"


def test_describe_stages_shapes_of_sequential():
    specs = describe_stages(_vgg_sequential(), ["block1_pool", "flatten"])
    assert [s.input_shapes for s in specs] == [
        ((None, 8, 8, 3),),
        ((None, 4, 4, 4),),
        ((None, 2 * 2 * 8),),
    ]
    assert specs[-1].output_shapes == ((None, 3),)


# ---------------------------------------------------------------------- default_cuts


def _best_cuts_by_enumeration(model, num_stages, allowed_names):
    """Cut names with the least max stage params, then sum of squares, then latest."""
    names = _op_names(model)
    params = [model.get_layer(n).count_params() for n in names]
    positions = sorted(names.index(n) for n in allowed_names)
    best = None
    for cuts in itertools.combinations(positions, num_stages - 1):
        bounds = [-1, *cuts, len(names) - 1]
        stage = [sum(params[a + 1 : b + 1]) for a, b in zip(bounds, bounds[1:])]
        key = (max(stage), sum(c * c for c in stage), [-p for p in cuts])
        if best is None or key < best[0]:
            best = (key, [names[p] for p in cuts])
    return best[1]


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
def test_default_cuts_sequential_balances_params(num_stages):
    model = _vgg_sequential()
    # In a chain, one tensor crosses after every layer but the last.
    allowed = _op_names(model)[:-1]
    expected = _best_cuts_by_enumeration(model, num_stages, allowed)
    assert default_cuts(model, num_stages) == expected


@pytest.mark.parametrize("num_stages", [2, 3])
def test_default_cuts_resnet_cuts_between_blocks(num_stages):
    model = _tiny_resnet(False)
    # Written by hand: inside a block two tensors cross; after these, only one does.
    allowed = ["stem", "b1_add", "b1_out", "b2_add", "b2_out", "gap"]
    cuts = default_cuts(model, num_stages)
    assert cuts == _best_cuts_by_enumeration(model, num_stages, allowed)
    for spec in describe_stages(model, cuts):
        assert spec.num_inputs == 1 and spec.num_outputs == 1


def test_default_cuts_resnet50_lands_on_block_outputs(resnet50):
    cuts = default_cuts(resnet50, 4)
    assert len(cuts) == 3
    specs = describe_stages(resnet50, cuts)
    assert all(s.num_inputs == 1 and s.num_outputs == 1 for s in specs)
    assert all(c.endswith("_out") or c.endswith("_pool") for c in cuts), cuts
    biggest = max(s.num_params for s in specs)
    assert biggest < resnet50.count_params() / 2


def test_default_cuts_too_few_cut_points():
    # With the long skip only stem, long_add and gap have one tensor crossing after them.
    with pytest.raises(ValueError, match=r"only 3 layers .*\['stem', 'long_add', 'gap'\]"):
        default_cuts(_tiny_resnet(True), 5)


@pytest.mark.parametrize(
    "num_stages, error, match",
    [
        (0, ValueError, "num_stages=0"),
        (2.0, TypeError, "num_stages=2.0"),
        (True, TypeError, "num_stages=True"),
    ],
)
def test_default_cuts_bad_num_stages(num_stages, error, match):
    with pytest.raises(error, match=match):
        default_cuts(_vgg_sequential(), num_stages)


# -------------------------------------------------------------- cost="macs"


def _macs_cuts_by_enumeration(model, num_stages):
    """For a chain: least max stage MACs, then sum of squares, then latest cuts, over the
    cuts where every stage has weights and every stage but the first starts with a layer
    with weights (a weightless layer, such as a pooling, stays with the stage before)."""
    names = _op_names(model)
    macs = layer_costs(model, "macs")
    costs = [macs[n] for n in names]
    weighted = [model.get_layer(n).count_params() > 0 for n in names]
    best = None
    for cuts in itertools.combinations(range(len(names) - 1), num_stages - 1):
        bounds = [-1, *cuts, len(names) - 1]
        if not all(any(weighted[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds)):
            continue
        if not all(weighted[p + 1] for p in cuts):
            continue
        stage = [sum(costs[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds)]
        key = (max(stage), sum(c * c for c in stage), [-p for p in cuts])
        if best is None or key < best[0]:
            best = (key, [names[p] for p in cuts])
    return best[1]


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("build", [_vgg_sequential, _cnn_functional])
def test_default_cuts_by_compute_balance_macs_with_weights_in_every_stage(build, num_stages):
    model = build()
    cuts = default_cuts(model, num_stages, cost="macs")
    assert cuts == _macs_cuts_by_enumeration(model, num_stages)
    for stage in split_model(model, cuts):
        assert stage.count_params() > 0


def test_default_cuts_by_compute_differ_from_params_and_keep_pooling_before_the_cut():
    model = _vgg_sequential()
    # Parameters 112, 296 | 528, 51 (the dense fc holds the most); MACs per example
    # 6,912 + 64 (block1_conv, block1_pool) | 4,608 + 32 + 32 + 512 + 48 (the rest).
    assert default_cuts(model, 2) == ["flatten"]
    assert default_cuts(model, 2, cost="macs") == ["block1_pool"]


def test_default_cuts_by_compute_too_few_weighted_candidates():
    # Only conv1..predictions carry weights: 4 weighted layers allow at most 4 stages.
    with pytest.raises(ValueError, match=r"layers with weights on both sides: \["):
        default_cuts(_cnn_functional(), 5, cost="macs")


@pytest.mark.parametrize("cost", ["flops", None, "MACS"])
def test_default_cuts_unknown_cost_is_named(cost):
    with pytest.raises(ValueError, match=r"`cost` must be one of \['params', 'macs'\]\. "
                                         rf"Received: cost={cost!r}"):
        default_cuts(_vgg_sequential(), 2, cost=cost)


# -------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "cuts, error, match",
    [
        (
            ["bloc1_pool"],
            ValueError,
            r"`cuts` must name layers of the model 'tiny_vgg'\. "
            r"Received: cuts=\['bloc1_pool'\]; did you mean 'block1_pool'\?",
        ),
        (["zzzzzzzz"], ValueError, r"Valid names .*'block1_conv'"),
        (
            ["block2_conv", "block1_pool"],
            ValueError,
            r"order.*'block1_pool' \(layer 1\) comes before 'block2_conv' \(layer 2\).*"
            r"in model order: \['block1_pool', 'block2_conv'\]",
        ),
        (["block1_pool", "fc", "block1_pool"], ValueError, "'block1_pool' more than once"),
        (["predictions"], ValueError, "'predictions' is the model's last layer"),
        (["image"], ValueError, "'image' is an input layer"),
        ("block1_pool", TypeError, r"did you mean cuts=\['block1_pool'\]"),
        ([3], TypeError, "only layer names .*3 of type int"),
        (None, TypeError, "list of layer names"),
    ],
)
def test_bad_cuts_are_rejected(cuts, error, match):
    model = _vgg_sequential()
    with pytest.raises(error, match=match):
        split_model(model, cuts)
    with pytest.raises(error, match=match):
        describe_stages(model, cuts)


def test_subclassed_model_is_rejected():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__(name="subclassed")
            self.dense = layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="'subclassed'.*functional API.*Sequential"):
        split_model(model, [])


def test_shared_layer_is_rejected():
    inputs = keras.Input((4,))
    shared = layers.Dense(4, name="shared")
    outputs = shared(layers.ReLU(name="relu")(shared(inputs)))
    model = keras.Model(inputs, outputs)
    with pytest.raises(ValueError, match="'shared' is called 2 times"):
        split_model(model, ["relu"])


def test_unbuilt_sequential_and_non_models_are_rejected():
    with pytest.raises(ValueError, match="not built.*model.build"):
        split_model(keras.Sequential([layers.Dense(2)]), [])
    with pytest.raises(TypeError, match="must be a keras.Model"):
        split_model("model", [])


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


@pytest.mark.parametrize(
    "name, cuts",
    [
        ("vgg16", ["block2_pool", "block3_pool", "block4_pool"]),
        ("vgg16", ["block1_relu2", "block3_conv1", "fc1"]),
        ("resnet20", ["stage1_block3_out", "stage2_block1_relu1", "stage3_block2_out"]),
        ("resnet20", ["stage2_block2_relu1"]),
    ],
)
def test_zoo_models_chained(name, cuts):
    # The project's own models, as users cut them (resnet20: inside residual blocks too).
    from tf_spectrain import models

    model = models.get_model(name, (32, 32, 3), 10)
    x = _images((32, 32, 3))
    stages = split_model(model, cuts)
    assert len(stages) == len(cuts) + 1
    _assert_same(_run_chain(stages, x), model(x))
