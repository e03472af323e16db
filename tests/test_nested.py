"""Nested models (a functional or Sequential model used as a layer) are cut inside.

`read_graph` flattens a nested model into its own layers, so cut names are the nested
layers' names and the stages are built on the flat graph, whose layers (and variables) are
the nested model's own. Each check compares with an independent computation: the same
architecture built without nesting (names, order, costs), the nested model run by Keras
itself (`model(x, training=...)`), or plain Keras `model.fit` (one `sync` step is one SGD
step). Models are tiny except one MobileNetV2 (alpha 0.35, 32x32), a transfer-learning
backbone under a new head; conftest.py has split the CPU into /CPU:0 .. /CPU:3.
"""

import weakref

import keras
import numpy as np
import pytest
from conftest import collect_garbage
from keras import layers
from step_helpers import momentum_sgd, rel_error

from tf_spectrain import costmodel, partition
from tf_spectrain.partition.graph import read_graph
from tf_spectrain.pipeline_model import PipelineModel

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
LR, MOMENTUM = 0.05, 0.9
SHAPE = (6, 6, 2)
RTOL_SYNC = 1e-4  # float32: measured 0 for the small models and 5e-9 for MobileNetV2


# --- models -----------------------------------------------------------------------------------


def base_layers(x, prefix="b"):
    """conv -> bn -> relu -> conv, added to a 1x1 projection of `x` (2 tensors cross inside)."""
    h = layers.Conv2D(4, 3, padding="same", name=f"{prefix}_conv1")(x)
    # A low momentum makes one step move the moving statistics visibly.
    h = layers.BatchNormalization(momentum=0.5, name=f"{prefix}_bn")(h)
    h = layers.ReLU(name=f"{prefix}_relu")(h)
    h = layers.Conv2D(4, 3, padding="same", name=f"{prefix}_conv2")(h)
    p = layers.Conv2D(4, 1, name=f"{prefix}_proj")(x)
    return layers.Add(name=f"{prefix}_add")([h, p])


def head_layers(x):
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    return layers.Dense(3, name="logits")(x)


def small_base(prefix="b", name="base"):
    inputs = keras.Input(SHAPE, name=f"{prefix}_in")
    return keras.Model(inputs, base_layers(inputs, prefix), name=name)


def nested(base=None, training=None, trainable=True, seed=0):
    """image -> base (a nested functional model) -> gap -> logits."""
    keras.utils.set_random_seed(seed)
    base = base or small_base()
    base.trainable = trainable
    inputs = keras.Input(SHAPE, name="image")
    x = base(inputs) if training is None else base(inputs, training=training)
    return keras.Model(inputs, head_layers(x), name="outer")


def flat_twin(seed=0):
    """The architecture of `nested()` built without nesting (same names and weights)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(SHAPE, name="image")
    return keras.Model(inputs, head_layers(base_layers(inputs)), name="twin")


def two_level(seed=0):
    """image -> middle(stem -> base -> post) -> gap -> logits: nesting two deep."""
    keras.utils.set_random_seed(seed)
    mid_in = keras.Input((8, 8, 2), name="mid_in")
    h = layers.Conv2D(2, 3, name="stem")(mid_in)  # 8x8 -> 6x6
    h = small_base()(h)
    h = layers.ReLU(name="post")(h)
    middle = keras.Model(mid_in, h, name="middle")
    inputs = keras.Input((8, 8, 2), name="image")
    return keras.Model(inputs, head_layers(middle(inputs)), name="outer")


def with_sequential(seed=0):
    """A functional model with a nested Sequential (conv, bn, relu) before its head."""
    keras.utils.set_random_seed(seed)
    seq = keras.Sequential(
        [
            layers.Conv2D(4, 3, padding="same", name="s_conv"),
            layers.BatchNormalization(momentum=0.5, name="s_bn"),
            layers.ReLU(name="s_relu"),
        ],
        name="seq",
    )
    inputs = keras.Input(SHAPE, name="image")
    x = layers.Conv2D(2, 1, name="pre")(inputs)
    return keras.Model(inputs, head_layers(seq(x)), name="outer")


def sequential_of_base(seed=0):
    """A top-level Sequential whose first layer is a functional base."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input(SHAPE, name="image"), small_base(), layers.GlobalAveragePooling2D(name="gap"),
         layers.Dense(3, name="logits")],
        name="outer",
    )


def mobilenet_v2_nested(seed=0):
    keras.utils.set_random_seed(seed)
    base = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, include_top=False, weights=None
    )
    inputs = keras.Input((32, 32, 3), name="image")
    x = layers.GlobalAveragePooling2D(name="gap")(base(inputs))
    return keras.Model(inputs, layers.Dense(10, name="logits")(x), name="transfer")


def data(shape=SHAPE, n=8, classes=3, seed=1):
    rng = np.random.default_rng(seed)
    # Mean 1, scale 2: batch statistics differ clearly from BatchNorm's initial ones.
    x = (1.0 + 2.0 * rng.normal(size=(n, *shape))).astype("float32")
    return x, rng.integers(0, classes, size=n).astype("int32")


def run_chain(stages, x, training):
    for stage in stages:
        x = stage(x, training=training)
    return np.asarray(x)


def op_names(model):
    return [op.name for op in model.operations if not isinstance(op, layers.InputLayer)]


# --- the flat graph ---------------------------------------------------------------------------


def test_cut_names_are_the_nested_layers_in_the_order_of_the_flat_twin():
    model, twin = nested(), flat_twin()
    graph = read_graph(model)
    assert graph.names == op_names(twin)  # Keras' own order of the same model built flat
    assert graph.nested_models == {"base": op_names(twin)[:-2]}
    assert graph.model is model
    assert partition.layer_costs(model) == partition.layer_costs(twin)
    assert partition.layer_costs(model, "macs") == partition.layer_costs(twin, "macs")
    assert partition.default_cuts(model, 2) == partition.default_cuts(twin, 2)
    specs = partition.describe_stages(model, ["b_relu"])
    twin_specs = partition.describe_stages(twin, ["b_relu"])
    assert [s.to_dict() for s in specs] == [s.to_dict() for s in twin_specs]
    assert specs[0].num_outputs == 2  # the relu output and the base input (for b_proj)


def test_models_without_nesting_are_read_as_they_are():
    model = flat_twin()
    graph = read_graph(model)
    assert graph.outputs[0] is model.outputs[0]
    assert graph.nested_models == {}
    assert [call.operation for call in graph.calls] == [
        op for op in model.operations if not isinstance(op, layers.InputLayer)
    ]


def test_repeated_reads_build_the_flat_graph_once_and_free_it_with_the_model():
    model = nested()
    conv = model.get_layer("base").get_layer("b_conv1")
    for _ in range(3):
        partition.split_model(model, ["b_bn"])
        partition.layer_costs(model)
    assert len(conv._inbound_nodes) == 2  # its call in `base` and one in the flat graph
    ref = weakref.ref(model)
    del model
    collect_garbage()
    assert ref() is None


def test_the_user_model_still_works_after_flattening():
    model = nested()
    x, _ = data()
    before = np.asarray(model(x, training=False))
    # After "b_conv1" the model input crosses beside an inner tensor (`b_proj` reads it),
    # where Keras' own sub-model would rewire the input and break `get_config`.
    stages = partition.split_model(model, ["b_conv1", "gap"])
    assert len(stages[1].inputs) == 2
    np.testing.assert_allclose(run_chain(stages, x, False), before, rtol=0, atol=1e-5)
    base = model.get_layer("base")
    assert base.get_layer("b_relu").output is base.get_layer("b_conv2").input
    again = keras.Model.from_config(model.get_config())
    again.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(again(x, training=False)), before, rtol=0, atol=1e-6)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(clone(x, training=False)), before, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "build, shape, cuts",
    [
        (nested, SHAPE, ["b_relu"]),  # two tensors cross: relu output and base input
        (nested, SHAPE, ["b_conv1", "b_conv2", "gap"]),
        (two_level, (8, 8, 2), ["stem", "b_bn", "post"]),
        (with_sequential, SHAPE, ["pre", "s_bn"]),
        (sequential_of_base, SHAPE, ["b_proj"]),
        (mobilenet_v2_nested, (32, 32, 3), ["block_2_depthwise_relu", "block_5_add"]),
    ],
)
def test_stage_chain_equals_the_nested_model(build, shape, cuts):
    model = build()
    x, _ = data(shape, n=4)
    stages = partition.split_model(model, cuts)  # one split for both flags (MobileNetV2's
    assert len(stages) == len(cuts) + 1  # costs seconds)
    for training in (False, True):
        got = run_chain(stages, x, training)
        np.testing.assert_allclose(got, np.asarray(model(x, training=training)), rtol=0,
                                   atol=1e-5, err_msg=f"training={training}")
        if training:  # BatchNorm used the batch statistics: differs from inference
            assert np.max(np.abs(got - np.asarray(model(x, training=False)))) > 1e-2


@pytest.mark.parametrize("as_dict", [False, True])
def test_nested_inputs_and_outputs_are_matched_in_order(as_dict):
    # Asymmetric on purpose: swapping two inputs or two outputs changes the result.
    a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")
    diff = layers.Subtract(name="diff")([layers.Dense(3, name="da")(a), b])
    scaled = layers.Dense(2, name="db")(b)
    base = keras.Model({"a": a, "b": b} if as_dict else [a, b], [scaled, diff], name="base")
    x1, x2 = keras.Input((3,), name="x1"), keras.Input((3,), name="x2")
    h1, h2 = layers.Dense(3, name="h1")(x1), layers.Dense(3, name="h2")(x2)
    scaled_out, diff_out = base({"a": h2, "b": h1} if as_dict else [h2, h1])
    out = layers.Concatenate(name="cat")([diff_out, scaled_out])
    model = keras.Model([x1, x2], out, name="outer")
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(4, 3)).astype("float32") for _ in range(2)]
    stages = partition.split_model(model, ["h2", "da"])
    got = run_chain(stages, xs, training=False)
    np.testing.assert_allclose(got, np.asarray(model(xs, training=False)), rtol=0, atol=1e-6)


def test_names_of_two_level_and_sequential_nesting():
    assert read_graph(two_level()).names == [
        "stem", "b_conv1", "b_bn", "b_relu", "b_conv2", "b_proj", "b_add", "post", "gap",
        "logits",
    ]
    graph = read_graph(two_level())
    assert graph.nested_models["middle"][0] == "stem"
    assert graph.nested_models["base"] == graph.names[1:7]
    assert read_graph(with_sequential()).names == [
        "pre", "s_conv", "s_bn", "s_relu", "gap", "logits"
    ]
    assert read_graph(sequential_of_base()).names == op_names(flat_twin())


@pytest.mark.parametrize("stored", [None, False, True])
@pytest.mark.parametrize("trainable", [True, False])
def test_flat_graph_follows_keras_training_flag(stored, trainable):
    # Keras 3's Functional.call passes an explicit outer `training` on to every inner call,
    # overriding the `training=` a nested model was called with; a frozen BatchNorm
    # (trainable=False) runs in inference mode whatever the flag.
    model = nested(training=stored, trainable=trainable)
    (flat,) = partition.split_model(model, [])
    x, _ = data(n=4)
    inference = np.asarray(model(x, training=False))
    for training in (True, False, None):
        got = np.asarray(flat(x, training=training))
        np.testing.assert_allclose(got, np.asarray(model(x, training=training)), atol=1e-5)
    batch_stats = np.max(np.abs(np.asarray(model(x, training=True)) - inference)) > 1e-2
    assert batch_stats == trainable  # `base(x, training=False)` does not stop it


# --- refusals ---------------------------------------------------------------------------------


def test_a_nested_model_called_twice_is_refused():
    base = small_base()
    inputs = keras.Input(SHAPE, name="image")
    both = layers.Add(name="both")([base(inputs), base(inputs)])
    model = keras.Model(inputs, head_layers(both), name="outer")
    with pytest.raises(ValueError, match=r"Model 'base' is called 2 times in model 'outer'"):
        partition.split_model(model, ["b_bn"])


def test_a_layer_shared_inside_and_outside_a_nested_model_is_refused():
    inputs = keras.Input(SHAPE, name="b_in")
    relu = layers.ReLU(name="shared_relu")
    base = keras.Model(inputs, relu(layers.Conv2D(2, 1, name="c")(inputs)), name="base")
    outer_in = keras.Input(SHAPE, name="image")
    model = keras.Model(outer_in, head_layers(relu(base(outer_in))), name="outer")
    with pytest.raises(
        ValueError, match=r"Layer 'shared_relu' is called 2 times .* once its nested models"
    ):
        read_graph(model)
    conv = model.get_layer("base").get_layer("c")
    assert len(conv._inbound_nodes) == 1  # refused before anything was built


def test_a_layer_shared_within_a_nested_model_is_refused():
    inputs = keras.Input((4,), name="b_in")
    dense = layers.Dense(4, name="twice")
    base = keras.Model(inputs, dense(dense(inputs)), name="base")
    outer_in = keras.Input((4,), name="x")
    model = keras.Model(outer_in, layers.Dense(2, name="out")(base(outer_in)), name="outer")
    with pytest.raises(ValueError, match=r"Layer 'twice' is called 2 times in model 'outer/base'"):
        read_graph(model)


def test_duplicate_names_after_flattening_are_refused():
    base = small_base()
    inputs = keras.Input(SHAPE, name="image")
    x = layers.Conv2D(4, 1, name="b_conv1")(base(inputs))  # a second 'b_conv1'
    model = keras.Model(inputs, head_layers(x), name="outer")
    with pytest.raises(ValueError, match=r"'b_conv1' is used by 2 different layers .*'outer/base'"):
        partition.split_model(model, ["b_bn"])
    # Two copies of one architecture (a second MobileNetV2, say) have the same names.
    first, second = small_base(name="first"), small_base(name="second")
    inputs = keras.Input(SHAPE, name="image")
    both = layers.Add(name="both")([first(inputs), second(inputs)])
    model = keras.Model(inputs, head_layers(both), name="outer")
    with pytest.raises(ValueError, match=r"'outer/first', 'outer/second'"):
        partition.describe_stages(model, [])
    base = small_base()
    inputs = keras.Input(SHAPE, name="b_add")  # an input layer named like a base layer
    with pytest.raises(ValueError, match=r"'b_add' is used by the input layer"):
        read_graph(keras.Model(inputs, head_layers(base(inputs)), name="outer"))


def test_cutting_at_the_nested_model_itself_says_what_to_name():
    with pytest.raises(ValueError, match=r"'base' is a nested model.*such as 'b_add'"):
        partition.split_model(nested(), ["base"])


def test_a_nested_model_called_with_a_mask_is_refused():
    inputs = keras.Input((4,), name="b_in")
    base = keras.Model(inputs, layers.Dense(4, name="d")(inputs), name="base")
    outer_in = keras.Input((4,), name="x")
    mask = keras.Input((4,), dtype="bool", name="m")
    model = keras.Model([outer_in, mask], base(outer_in, mask=mask), name="outer")
    with pytest.raises(ValueError, match=r"Nested model 'base' .* is called with `mask`"):
        read_graph(model)


# --- profiling and training -----------------------------------------------------------------


def test_profile_model_measures_the_nested_layers():
    model = nested()
    profile = costmodel.profile_model(model, batch_size=2, repeats=1, warmup=0)
    assert profile.names == read_graph(model).names
    layer_of = {layer.name: layer for layer in model.get_layer("base").layers + model.layers}
    trainable = [
        sum(int(np.prod(v.shape)) for v in layer_of[name].trainable_weights)
        for name in profile.names
    ]
    assert [lp.weight_bytes for lp in profile.layers] == [4.0 * n for n in trainable]  # float32
    assert trainable[0] == 3 * 3 * 2 * 4 + 4  # b_conv1


_KERAS_STEPS = {}


def keras_step(model, x, y, key=None):
    """One Keras `fit` step of a clone of `model`: (weights, loss history). With a `key`,
    once for the cases that start from the same model, weights and batch (checked)."""
    if key in _KERAS_STEPS:
        w0, weights, losses = _KERAS_STEPS[key]
        for a, b in zip(model.get_weights(), w0):
            np.testing.assert_array_equal(a, b)
        return weights, losses
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    assert len(reference.trainable_weights) == len(model.trainable_weights)
    reference.compile(keras.optimizers.SGD(LR, momentum=MOMENTUM), LOSS)
    ref_history = reference.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    result = reference.get_weights(), ref_history.history["loss"]
    if key is not None:
        _KERAS_STEPS[key] = (model.get_weights(), *result)
    return result


def sync_vs_keras(model, x, y, cuts, key=None):
    """One `sync` step of the pipeline and one Keras `fit` step from the same weights."""
    w0 = model.get_weights()
    ref_weights, ref_losses = keras_step(model, x, y, key)
    planned = cuts == "auto"
    pipe = PipelineModel(model, cuts=cuts, mode="sync", num_stages=3 if planned else None,
                         profile_batch_size=len(x))
    pipe.compile(keras.optimizers.SGD(LR, momentum=MOMENTUM), LOSS)
    history = pipe.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    assert pipe.model is model
    assert pipe.num_stages == (3 if planned else len(cuts) + 1)
    if planned:  # the planned cuts are layers of the flattened model, in order
        names = read_graph(model).names
        positions = [names.index(c) for c in pipe.cuts]
        assert pipe.cuts == pipe.partition_plan.cuts and positions == sorted(positions)
    np.testing.assert_allclose(history.history["loss"], ref_losses, rtol=1e-5)
    return w0, model.get_weights(), ref_weights


@pytest.mark.parametrize(
    "build, shape, cuts",
    [
        (nested, SHAPE, ["b_relu"]),
        (two_level, (8, 8, 2), ["stem", "b_bn", "post"]),
        (with_sequential, SHAPE, ["s_bn"]),
        (sequential_of_base, SHAPE, ["b_conv2"]),
        (lambda: nested(training=False), SHAPE, ["b_relu"]),
        (two_level, (8, 8, 2), "auto"),  # planned cuts inside two levels of nesting
    ],
)
def test_sync_step_equals_keras_fit(build, shape, cuts):
    model = build()
    x, y = data(shape)
    # two_level's two cases (given and planned cuts) share Keras' step
    key = "two_level" if build is two_level else None
    w0, got, ref = sync_vs_keras(model, x, y, cuts, key)
    assert rel_error(got, ref, w0) < RTOL_SYNC


def test_frozen_backbone_sync_training_equals_keras_fit():
    model = nested(training=False, trainable=False)
    x, y = data(n=16)
    base = model.get_layer("base")
    frozen = base.get_weights()
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    reference.get_layer("base").trainable = False
    reference.compile(keras.optimizers.SGD(LR, momentum=MOMENTUM), LOSS)
    w0 = model.get_weights()
    reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    pipe = PipelineModel(model, cuts=["b_relu", "b_add"], mode="sync")
    pipe.compile(keras.optimizers.SGD(LR, momentum=MOMENTUM), LOSS)
    pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert len(model.trainable_weights) == 2  # the head's Dense only
    for a, b in zip(base.get_weights(), frozen):  # frozen: moving statistics included
        np.testing.assert_array_equal(a, b)
    assert rel_error(model.get_weights(), reference.get_weights(), w0) < RTOL_SYNC


@pytest.mark.parametrize("mode", ["vanilla", "stash", "spectrain"])
def test_async_modes_train_a_nested_model(mode):
    model = two_level()
    x, y = data((8, 8, 2), n=32)
    w0 = model.get_weights()
    pipe = PipelineModel(model, cuts=["b_bn", "post"], mode=mode)
    pipe.compile(momentum_sgd(mode, LR, MOMENTUM), LOSS)
    history = pipe.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    moved = [float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), w0)]
    assert min(moved) > 0  # every weight of every stage trained (stats included)
    for a, b in zip(model.get_layer("middle").get_weights(), w0):
        assert np.max(np.abs(a - b)) > 0  # into the nested models' own layers
