"""Every model a Keras user builds goes into `PipelineModel`, and trains as Keras trains it.

The models are those found failing on public Keras example scripts (issue 30): custom
layers that cannot be rebuilt from their config (keras-io's "Text classification with
Transformer" layers, layers given another layer, an array or a list of blocks), a
`Sequential` without an `Input` (with an `input_shape=` argument, or none at all, built by
its first `fit`), a subclassed model (refused with a way out, or split by hand into a list
of stages), a subclassed model nested as a layer, and an input of open length.

Every pipeline runs in sync mode (sequential SGD) and is compared with plain Keras training
the same architecture from the same initial weights on the same mini-batches: History,
trained weights and `predict` agree within float tolerance. Stage copies that are not made
from a config are checked directly: on their device, independent of the original, and
computing what it computes. Models are tiny (a few Dense layers, 40 examples, batch 8);
conftest.py has split the CPU into /CPU:0 .. /CPU:3.
"""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import tf_spectrain
from tf_spectrain import partition
from tf_spectrain.partition.layer_copy import copy_layer

LR, MOMENTUM, BATCH, EPOCHS = 0.05, 0.9, 8, 2
RTOL, ATOL = 1e-5, 1e-5


def sgd():
    return keras.optimizers.SGD(LR, momentum=MOMENTUM)


def regression_data(shape=(6,), n=40, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, *shape)).astype("float32"),
            rng.normal(size=(n, 1)).astype("float32"))


def train_both(build, x, y, loss="mse", pipe_kwargs=None, compare_initial=True):
    """Builds the model twice (`build` fixes the seed), trains one with Keras' `fit` and
    the other as a sync pipeline; checks History, weights and `predict` agree. Returns
    the pipeline and the Keras model."""
    ref = build()
    if compare_initial:
        initial = build().get_weights()
        np.testing.assert_array_equal(np.concatenate([w.ravel() for w in initial]),
                                      np.concatenate([w.ravel() for w in ref.get_weights()]))
    ref.compile(optimizer=sgd(), loss=loss)
    expected = ref.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    pipe = tf_spectrain.PipelineModel(build(), mode="sync", **(pipe_kwargs or {}))
    pipe.compile(optimizer=sgd(), loss=loss)
    history = pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=RTOL)
    assert history.history["loss"][-1] < history.history["loss"][0]  # it did train
    got, want = pipe.model.get_weights(), ref.get_weights()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(pipe.predict(x[:5], verbose=0), ref.predict(x[:5], verbose=0),
                               rtol=RTOL, atol=ATOL)
    return pipe, ref


# --- custom layers that do not round-trip their config ---------------------------------------


class TokenAndPositionEmbedding(layers.Layer):
    """keras-io's: no **kwargs, no get_config (Keras' automatic config adds `trainable`)."""

    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = self.pos_emb(keras.ops.arange(0, keras.ops.shape(x)[-1]))
        return self.token_emb(x) + positions


class TransformerBlock(layers.Layer):
    """keras-io's, with a Sequential sublayer; rate 0 so that Keras' dropout draws do not
    differ between the runs compared."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.0):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn)
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1), training=training))


MAXLEN, VOCAB = 6, 20


def transformer_classifier():
    keras.utils.set_random_seed(0)
    inputs = layers.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, 8)(inputs)
    x = TransformerBlock(8, 2, 8)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(8, activation="relu")(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def test_transformer_with_custom_layers_plans_places_and_trains_as_keras():
    # The failure: the planner's stage timing and place_stages cloned the model
    # through its config. 4 stages, cuts planned from measured time.
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, size=(40, MAXLEN))
    y = rng.integers(0, 2, size=40)
    pipe, _ = train_both(transformer_classifier, x, y, loss="sparse_categorical_crossentropy",
                         pipe_kwargs=dict(devices=["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"],
                                          profile_batch_size=BATCH))
    assert pipe.num_stages == 4 and pipe.partition_plan is not None


class Scaled(layers.Layer):
    """Given a layer in `__init__`: Keras has no automatic config for it."""

    def __init__(self, inner, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner
        self.factor = factor

    def call(self, x):
        return self.factor * self.inner(x)


class Shift(layers.Layer):
    """Given an array in `__init__`, with a weight of its own."""

    def __init__(self, offset, **kwargs):
        super().__init__(**kwargs)
        self.offset = np.asarray(offset, dtype="float32")

    def build(self, input_shape):
        self.gain = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.gain + self.offset


class Block(layers.Layer):
    """A keras_hub-style block: sublayers and a residual."""

    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(dim, activation="tanh")
        self.norm = layers.LayerNormalization()

    def call(self, x):
        return self.norm(x + self.dense(x))


class Encoder(layers.Layer):
    """Given a list of blocks (layers inside layers inside a list)."""

    def __init__(self, blocks, **kwargs):
        super().__init__(**kwargs)
        self.blocks = list(blocks)

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Widen(layers.Layer):
    """Its get_config leaves out `units`: the layer from_config builds has other shapes."""

    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units))

    def call(self, x):
        return x @ self.kernel

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable, "dtype": self.dtype_policy}


def custom_layers_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    h = Scaled(layers.Dense(6, activation="tanh"), 0.5, name="scaled")(inputs)
    h = Shift(np.linspace(-1, 1, 6), name="shift")(h)
    h = Encoder([Block(6), Block(6)], name="encoder")(h)
    h = Widen(units=5, name="widen")(h)
    return keras.Model(inputs, layers.Dense(1, name="out")(h))


def test_custom_layers_with_layers_arrays_and_blocks_as_arguments_train_as_keras():
    x, y = regression_data()
    pipe, _ = train_both(custom_layers_model, x, y,
                         pipe_kwargs=dict(cuts=["scaled", "shift", "encoder"]))
    # Each stage's copies are on its own device and own their variables.
    for stage, split, device in zip(pipe.stages, pipe._split, pipe.devices):
        assert {v.value.device for v in stage.weights} <= {tf.DeviceSpec.from_string(
            "/job:localhost/replica:0/task:0" + device).to_string()}
        assert not {id(v) for v in stage.weights} & {id(v) for v in split.weights}
    widen = pipe.stages[3].get_layer("widen")
    assert widen.units == 5 and tuple(widen.kernel.shape) == (6, 5)


def test_copy_layer_is_independent_on_its_device_and_computes_the_same():
    model = transformer_classifier()
    block = model.layers[2]
    x = tf.random.normal((3, MAXLEN, 8), seed=2)
    with tf.device("/CPU:3"):
        copy = copy_layer(block)
    assert type(copy) is TransformerBlock and copy is not block
    assert len(copy.weights) == len(block.weights) == 16
    for mine, theirs in zip(copy.weights, block.weights):
        assert mine is not theirs and mine.path == theirs.path
        assert mine.value.device.endswith("CPU:3")
        assert theirs.value.device.endswith("CPU:0")
    np.testing.assert_allclose(copy(x), block(x), rtol=1e-6, atol=1e-6)
    assert copy.ffn is not block.ffn and copy.ffn.layers[0] is not block.ffn.layers[0]
    # Not part of the model's graph: no calls recorded, the original's left alone.
    assert copy._inbound_nodes == [] and len(block._inbound_nodes) == 1
    # Training the copy leaves the original alone.
    before = [w.numpy() for w in block.weights]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(copy(x) ** 2)
    grads = tape.gradient(loss, copy.trainable_weights)
    assert all(g is not None for g in grads)
    for w, g in zip(copy.trainable_weights, grads):
        w.assign_sub(0.1 * g)
    for w, b in zip(block.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)
    assert np.abs(copy(x) - block(x)).max() > 1e-3
    # The tracker knows the copy's own sublayers (for any later tracking).
    assert id(copy.att) in copy._tracker.stored_ids["layers"]


def test_placed_copies_train_apart_until_weights_are_copied_back():
    model = custom_layers_model()
    split = partition.split_model(model, ["shift"])
    placed = partition.place_stages(split, ["/CPU:1", "/CPU:2"])
    before = model.get_weights()
    for v in placed[1].trainable_weights:
        v.assign(v + 1.0)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    partition.copy_weights(placed, split)
    x = regression_data()[0][:4]
    np.testing.assert_allclose(model(x), placed[1](placed[0](x)), rtol=1e-6, atol=1e-6)


class Locked(layers.Layer):
    """Neither rebuilt from its config (no **kwargs) nor copied (a lock cannot be)."""

    def __init__(self, units):
        super().__init__(name="locked")
        self.lock = threading.Lock()
        self.dense = layers.Dense(units)

    def call(self, x):
        return self.dense(x)


def test_a_layer_that_cannot_be_copied_at_all_is_named_with_what_to_do():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, Locked(2)(inputs))
    with pytest.raises(ValueError, match=r"Layer 'locked' \(class Locked\) cannot be copied.*"
                                         r"get_config\(\).*\*\*kwargs"):
        partition.place_stages(partition.split_model(model, []), ["/CPU:1"])


# --- Sequential models without an Input --------------------------------------------------------


def lstm_sequential():
    keras.utils.set_random_seed(2)
    model = keras.Sequential()
    with pytest.warns(UserWarning, match="input_shape"):
        model.add(layers.LSTM(8, input_shape=(7, 3), name="lstm"))  # keras-io's time series
    model.add(layers.Dense(4, activation="relu", name="dense"))
    model.add(layers.Dense(1, name="out"))
    return model


def test_sequential_with_input_shape_argument_trains_and_predicts_one_sample():
    x, y = regression_data(shape=(7, 3))
    pipe, ref = train_both(lstm_sequential, x, y, pipe_kwargs=dict(cuts=["lstm", "dense"]))
    one = pipe.predict(x[:1], verbose=0)  # failed: "has never been called"
    assert one.shape == (1, 1)
    np.testing.assert_allclose(one, ref.predict(x[:1], verbose=0), rtol=RTOL, atol=ATOL)


def unbuilt_sequential():
    keras.utils.set_random_seed(3)
    return keras.Sequential([layers.Dense(8, activation="tanh", name="d0"),
                             layers.Dense(8, activation="tanh", name="d1"),
                             layers.Dense(1, name="d2")])


@pytest.mark.parametrize("cuts", [["d0", "d1"], "auto"])
def test_unbuilt_sequential_is_built_by_the_first_fit_as_keras_builds_it(cuts):
    x, y = regression_data()
    pipe = tf_spectrain.PipelineModel(unbuilt_sequential(), mode="sync", cuts=cuts,
                                      num_stages=3, profile_batch_size=BATCH)
    assert pipe.stages is None and not pipe.model.built  # cut and placed at the first data
    pipe.compile(optimizer=sgd(), loss="mse")  # held until then
    history = pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    assert pipe.num_stages == 3 and pipe.model.built
    assert pipe.model.inputs[0].shape == (None, 6)  # the batch size left open, as Keras
    ref = unbuilt_sequential()  # seeded initialisers: the same weights once built
    ref.compile(optimizer=sgd(), loss="mse")
    expected = ref.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=RTOL)
    for a, b in zip(pipe.model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_unbuilt_sequential_is_built_by_predict_on_a_generator():
    x, _ = regression_data()
    ref = unbuilt_sequential()
    expected = ref.predict(x, batch_size=BATCH, verbose=0)
    pipe = tf_spectrain.PipelineModel(unbuilt_sequential(), mode="sync", cuts=["d1"])
    pipe.compile(optimizer=sgd(), loss="mse")
    batches = ((x[i:i + BATCH],) for i in range(0, len(x), BATCH))  # (x,), as Keras takes
    got = pipe.predict(batches, verbose=0)  # the batch read to build the model is kept
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_unbuilt_sequential_with_several_inputs_is_refused_clearly():
    pipe = tf_spectrain.PipelineModel(unbuilt_sequential(), mode="sync", cuts=["d1"])
    pipe.compile(optimizer=sgd(), loss="mse")
    x = np.zeros((8, 6), "float32")
    with pytest.raises(ValueError, match="several inputs.*keras.Input"):
        pipe.fit([x, x], np.zeros((8, 1)), verbose=0)


def test_unbuilt_sequential_checks_its_devices_at_once():
    with pytest.raises(ValueError, match="one device per stage: there are 2 stages"):
        tf_spectrain.PipelineModel(unbuilt_sequential(), mode="sync", cuts=["d1"],
                                   devices=["/CPU:0"])


# --- subclassed models --------------------------------------------------------------------------


class Tower(keras.Model):
    """A subclassed model: its computation is its Python `call`."""

    def __init__(self, width, depth=2, **kwargs):
        super().__init__(**kwargs)
        self.hidden = [layers.Dense(width, activation="tanh") for _ in range(depth)]

    def call(self, x):
        for layer in self.hidden:
            x = layer(x)
        return x


def test_subclassed_model_is_refused_with_the_way_to_pipeline_it():
    with pytest.raises(ValueError) as raised:
        tf_spectrain.PipelineModel(Tower(4, name="tower"), mode="sync", num_stages=2)
    message = str(raised.value)
    assert "'tower' is a subclassed keras.Model" in message
    assert "Tower overrides `call()`" in message
    assert "PipelineModel([stage0, stage1, ...])" in message
    assert "functional API" in message


def hand_split_stages():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((6,), name="features")
    first = keras.Model(inputs, layers.Dense(8, activation="tanh", name="f_dense")(inputs),
                        name="first")
    return [first, Tower(8, name="tower_a"), Tower(6, depth=1, name="tower_b"),
            layers.Dense(1, name="head")]


def test_list_of_stages_split_by_hand_trains_as_keras_chaining_them():
    x, y = regression_data()

    def keras_chain():
        stages = hand_split_stages()
        inputs = keras.Input((6,))
        h = inputs
        for stage in stages:
            h = stage(h)
        return keras.Model(inputs, h)

    ref = keras_chain()
    ref.compile(optimizer=sgd(), loss="mse")
    expected = ref.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    stages = hand_split_stages()
    pipe = tf_spectrain.PipelineModel(stages, mode="sync")
    assert pipe.num_stages == 4 and pipe.devices == ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]
    assert pipe.cuts == ["f_dense", "tower_a", "tower_b"]
    pipe.compile(optimizer=sgd(), loss="mse")
    history = pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=RTOL)
    # The trained weights are the user's stage objects'.
    got = [w for stage in stages for w in stage.get_weights()]
    for a, b in zip(got, ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(pipe.predict(x, verbose=0), ref.predict(x, verbose=0),
                               rtol=RTOL, atol=ATOL)
    for stage, device in zip(pipe.stages, pipe.devices):
        assert all(v.value.device.endswith(device[1:]) for v in stage.weights)


def test_list_of_subclassed_stages_without_inputs_is_built_by_the_first_fit():
    x, y = regression_data()

    def stages():
        keras.utils.set_random_seed(5)
        return [Tower(8, name="t0"), Tower(8, name="t1"), layers.Dense(1, name="out")]

    ref = keras.Sequential(stages())
    ref.compile(optimizer=sgd(), loss="mse")
    expected = ref.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    pipe = tf_spectrain.PipelineModel(stages(), mode="sync", devices=["/CPU:1", "/CPU:2",
                                                                      "/CPU:3"])
    assert pipe.cuts is None
    pipe.compile(optimizer=sgd(), loss="mse")
    history = pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    assert pipe.cuts == ["t0", "t1"]
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=RTOL)
    for a, b in zip(pipe.model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_list_of_stages_takes_several_inputs_by_name():
    keras.utils.set_random_seed(8)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    first = keras.Model({"a": a, "b": b},
                        layers.Dense(4, name="mix")(layers.Concatenate(name="cat")([a, b])))
    stages = [first, Tower(4, name="t_mid"), layers.Dense(1, name="t_out")]
    pipe = tf_spectrain.PipelineModel(stages, mode="sync", devices=["/CPU:1", "/CPU:2",
                                                                    "/CPU:3"])
    assert pipe.cuts == ["mix", "t_mid"]
    pipe.compile(optimizer=sgd(), loss="mse")
    rng = np.random.default_rng(4)
    x = {"a": rng.normal(size=(16, 3)).astype("float32"),
         "b": rng.normal(size=(16, 2)).astype("float32")}
    expected = pipe.model.predict(x, verbose=0)  # Keras' own run of the chained stages
    np.testing.assert_allclose(pipe.predict(x, verbose=0), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kwargs, match", [
    (dict(cuts=["t0"]), "`cuts` must be left out"),
    (dict(num_stages=3), "`num_stages` must be None or the number of stages"),
])
def test_list_of_stages_refuses_cuts_and_a_wrong_num_stages(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tf_spectrain.PipelineModel([Tower(4, name="t0"), Tower(4)], mode="sync", **kwargs)


def test_list_with_a_stage_twice_or_a_non_layer_is_refused():
    tower = Tower(4)
    with pytest.raises(ValueError, match="listed twice"):
        tf_spectrain.PipelineModel([tower, tower], mode="sync")
    with pytest.raises(TypeError, match="must hold Keras models or layers.*index 1"):
        tf_spectrain.PipelineModel([tower, "dense"], mode="sync")


def nested_subclassed_model():
    keras.utils.set_random_seed(6)
    inputs = keras.Input((6,))
    h = layers.Dense(8, activation="tanh", name="pre")(inputs)
    h = Tower(8, name="tower")(h)  # one operation of the graph: cut before or after it
    return keras.Model(inputs, layers.Dense(1, name="post")(h))


def test_subclassed_model_nested_as_a_layer_is_one_stage_operation():
    x, y = regression_data()
    pipe, _ = train_both(nested_subclassed_model, x, y, pipe_kwargs=dict(cuts=["pre", "tower"]))
    assert [s.layers[-1].name for s in pipe.stages][:2] == ["pre", "tower"]
    with pytest.raises(ValueError, match="must name layers|not a layer|did you mean"):
        tf_spectrain.PipelineModel(nested_subclassed_model(), mode="sync",
                                   cuts=[pipe.model.get_layer("tower").hidden[0].name])


# --- inputs of open length --------------------------------------------------------------------


def open_length_model():
    keras.utils.set_random_seed(7)
    inputs = keras.Input(shape=(None,), dtype="int32")  # as keras-io's text scripts
    h = layers.Embedding(VOCAB, 8)(inputs)
    h = layers.GlobalAveragePooling1D()(h)
    h = layers.Dense(8, activation="tanh")(h)
    return keras.Model(inputs, layers.Dense(1)(h))


def test_input_of_open_length_is_planned_and_trains_as_keras():
    rng = np.random.default_rng(3)
    x = rng.integers(0, VOCAB, size=(40, 9)).astype("int32")
    y = rng.normal(size=(40, 1)).astype("float32")
    pipe, ref = train_both(open_length_model, x, y,
                           pipe_kwargs=dict(num_stages=2, profile_batch_size=BATCH))
    assert pipe.partition_plan is not None and len(pipe.cuts) == 1
    short = x[:3, :4]  # another length
    np.testing.assert_allclose(pipe.predict(short, verbose=0), ref.predict(short, verbose=0),
                               rtol=RTOL, atol=ATOL)


def test_a_model_with_fewer_places_to_cut_than_devices_gets_fewer_stages_with_a_warning():
    # As keras-io's character-level text generator (LSTM(input_shape=...), then Dense), on
    # every (4) device by default: two places to cut, so 3 stages and a warning that says so.
    with pytest.warns(UserWarning, match=r"only 2 place\(s\) \(\['lstm', 'dense'\]\).*3 stage"):
        pipe = tf_spectrain.PipelineModel(lstm_sequential(), mode="sync",
                                          profile_batch_size=BATCH)
    assert pipe.num_stages == 3 and pipe.cuts == ["lstm", "dense"]
    with pytest.raises(ValueError, match=r"into 4 stages: only 2 of its layers.*at most 3"):
        tf_spectrain.PipelineModel(lstm_sequential(), num_stages=4)  # asked for: refused


def test_adapted_preprocessing_layers_keep_their_state_on_the_stages():
    # keras.io's regression and structured-data tutorials: Normalization and StringLookup
    # adapted before the model is built; their stage copies must not start un-adapted.
    rng = np.random.default_rng(0)
    numbers = (rng.normal(size=(40, 1)) * 10 + 50).astype("float32")
    words = tf.constant(rng.choice(["cat", "dog", "fish", "bird"], size=(40, 1)))
    norm = layers.Normalization(name="norm")
    norm.adapt(numbers)
    lookup = layers.StringLookup(output_mode="one_hot", name="lookup")
    lookup.adapt(words)
    keras.utils.set_random_seed(1)
    number_in = keras.Input((1,), name="number")
    word_in = keras.Input((1,), dtype="string", name="word")
    h = layers.Concatenate(name="both")([norm(number_in), lookup(word_in)])
    h = layers.Dense(4, activation="tanh", name="d0")(h)
    model = keras.Model([number_in, word_in], layers.Dense(1, name="out")(h))
    expected = model.predict([numbers, words], verbose=0)
    pipe = tf_spectrain.PipelineModel(model, cuts=["both"], devices=["/CPU:0", "/CPU:1"],
                                      mode="sync")
    pipe.compile(optimizer=sgd(), loss="mse")
    np.testing.assert_allclose(pipe.predict([numbers, words], verbose=0), expected,
                               rtol=RTOL, atol=ATOL)


def test_unfreezing_a_base_model_and_compiling_again_fine_tunes_as_keras():
    # keras.io's transfer-learning recipe: train a head on a frozen base, then set
    # base.trainable = True, compile again and fine-tune the whole model.
    x, y = regression_data()

    def frozen_base():
        keras.utils.set_random_seed(8)
        base_in = keras.Input((6,))
        h = layers.Dense(8, activation="tanh", name="b0")(base_in)
        base = keras.Model(base_in, layers.Dense(8, activation="tanh", name="b1")(h),
                           name="base")
        base.trainable = False
        inputs = keras.Input((6,))
        h = base(inputs, training=False)
        return keras.Model(inputs, layers.Dense(1, name="head")(h)), base

    results = []
    for wrap in (False, True):
        model, base = frozen_base()
        trainer = tf_spectrain.PipelineModel(
            model, cuts=["b0", "b1"], mode="sync", devices=["/CPU:0", "/CPU:1", "/CPU:2"]
        ) if wrap else model
        histories = []
        for _ in range(2):
            trainer.compile(optimizer=sgd(), loss="mse")
            histories.append(trainer.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                                         verbose=0).history["loss"])
            base.trainable = True
        results.append((histories, [w.copy() for w in model.get_weights()]))
    (keras_losses, keras_weights), (pipe_losses, pipe_weights) = results
    np.testing.assert_allclose(pipe_losses, keras_losses, rtol=RTOL)
    for a, b in zip(pipe_weights, keras_weights):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_sequential_with_a_mask_trains_as_keras():
    # The TensorFlow text-classification tutorial: a Sequential of Embedding(mask_zero=True)
    # and pooling; Keras adds the mask's not_equal op beside the layers.
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 20, size=(40, 7)).astype("int32")
    tokens[:, 5:] = 0  # padding
    y = rng.normal(size=(40, 1)).astype("float32")

    def masked():
        keras.utils.set_random_seed(9)
        return keras.Sequential([keras.Input((7,), dtype="int32"),
                                 layers.Embedding(20, 4, mask_zero=True, name="emb"),
                                 layers.GlobalAveragePooling1D(name="pool"),
                                 layers.Dense(1, name="out")])

    reference = masked()
    reference.compile(optimizer=sgd(), loss="mse")
    pipe = tf_spectrain.PipelineModel(masked(), cuts=["pool"], mode="sync",
                                      devices=["/CPU:0", "/CPU:1"])
    pipe.compile(optimizer=sgd(), loss="mse")
    args = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(pipe.fit(tokens, y, **args).history["loss"],
                               reference.fit(tokens, y, **args).history["loss"], rtol=RTOL)


@pytest.mark.parametrize("mode", ["sync", "spectrain"])
def test_predict_before_compile_and_summary_before_the_first_data_as_keras(capsys, mode):
    # keras.io's regression tutorial predicts with the untrained model before compiling it,
    # and prints the summary of a Sequential that its first data will build.
    x, _ = regression_data()
    pipe = tf_spectrain.PipelineModel(unbuilt_sequential(), cuts=["d0", "d1"], mode=mode)
    pipe.summary()
    assert "cut at the first fit" in capsys.readouterr().out
    ref = unbuilt_sequential()
    np.testing.assert_allclose(pipe.predict(x[:5], verbose=0), ref.predict(x[:5], verbose=0),
                               rtol=RTOL, atol=ATOL)
    pipe.summary()
    assert f"3 stages ({mode})" in capsys.readouterr().out


class ActivityPenalty(layers.Layer):
    """keras.io's subclassing guide: a layer that adds a loss in `call`, no get_config."""

    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * keras.ops.sum(inputs))
        return inputs


def test_a_layer_adding_a_loss_without_a_config_is_copied_and_trains_as_keras():
    x, y = regression_data()

    def penalised():
        keras.utils.set_random_seed(12)
        inputs = keras.Input((6,))
        h = layers.Dense(8, activation="tanh", name="d0")(inputs)
        h = ActivityPenalty(1e-2)(h)
        return keras.Model(inputs, layers.Dense(1, name="out")(h))

    reference = penalised()
    reference.compile(optimizer=sgd(), loss="mse")
    model = penalised()
    tf.function(model)(x[:2])  # called in a graph, as profiling does: its losses stay there
    pipe = tf_spectrain.PipelineModel(model, cuts=["d0"], mode="sync",
                                      devices=["/CPU:0", "/CPU:1"])
    pipe.compile(optimizer=sgd(), loss="mse")
    args = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(pipe.fit(x, y, **args).history["loss"],
                               reference.fit(x, y, **args).history["loss"], rtol=RTOL)
