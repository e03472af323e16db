"""Tests for tf_spectrain.partition.stages: `split_model` cuts a Keras model into stages
that, chained, compute what the model computes, and `describe_stages` says what each holds."""


import keras
import numpy as np
import pytest
from keras import layers
from partition_helpers import (
    _assert_same,
    _cnn_functional,
    _images,
    _op_names,
    _run_chain,
    _tiny_resnet,
    _two_inputs,
    _two_outputs,
    _vgg_sequential,
)

from tf_spectrain.partition import (
    default_cuts,
    describe_stages,
    split_model,
)
from tf_spectrain.partition.graph import read_graph


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


def test_the_model_and_its_stages_still_save_after_a_split_where_an_input_crosses(tmp_path):
    # Stage 1 takes the model input and an inner tensor: Keras re-wires such an input's
    # history when it builds the stage, which once broke `model.save()`.
    inputs = keras.Input((4,), name="x")
    a = keras.layers.Dense(3, name="a")(inputs)
    joined = keras.layers.Concatenate(name="cat")([a, inputs])  # the input crosses cut "a"
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(joined))
    stages = split_model(model, ["a"])
    owned = {id(v) for v in model.weights}
    assert [len(s.weights) for s in stages] == [2, 2]
    assert all({id(v) for v in s.weights} <= owned for s in stages)  # shared, not copied
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), atol=1e-6)
    for k, stage in enumerate(stages):
        stage.save(tmp_path / f"stage{k}.keras")
    first = keras.models.load_model(tmp_path / "stage0.keras")
    second = keras.models.load_model(tmp_path / "stage1.keras")
    np.testing.assert_allclose(np.asarray(second(first(x))), np.asarray(model(x)), atol=1e-6)
    assert len(split_model(model, ["a"])) == 2  # the model still splits after all that


def test_a_sub_model_missing_a_model_input_it_needs_is_refused():
    a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")
    mid = layers.Dense(3, name="mid")(a)
    out = layers.Add(name="sum")([mid, layers.Dense(3, name="from_b")(b)])
    graph = read_graph(keras.Model([a, b], out))
    with pytest.raises(ValueError, match="needs the model input 'b'"):
        graph.sub_model([a, mid], [out], "part")
    part = graph.sub_model([b, mid], [out], "part")  # mixed, complete: built anew
    assert [t.name for t in part.inputs] == ["b", f"{mid.name}CLONE"]
