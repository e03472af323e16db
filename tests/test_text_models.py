"""The zoo's text models (`models/text.py`) and Keras masks across pipeline cuts.

Parameter counts are recomputed here from the architecture descriptions; cut stages are
chained with NumPy arrays between them (an eager tensor would carry its Keras mask from
one stage to the next, which a pipeline's hand-off does not); sync pipelines are compared
with plain Keras `fit`; masked models with the same model without its masks, so that every
comparison could fail. Models are tiny (8 tokens, width 8); conftest.py has split the CPU
into /CPU:0 .. /CPU:3.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain import costmodel, models, partition
from tf_spectrain.partition.graph import read_graph
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

SEQ, VOCAB, CLASSES, WIDTH, HEADS, MLP = 8, 24, 3, 8, 2, 16
LR, MOMENTUM = 0.1, 0.9
TEXT_MODELS = ["transformer_lm", "transformer_classifier", "residual_lstm"]
BLOCK_ENDS = ["block1_out", "block2_out", "block3_out"]
DEVICES = ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build(name, blocks=4, seed=0, seq=SEQ):
    keras.utils.set_random_seed(seed)
    if name == "transformer_lm":
        return models.get_model(name, (seq,), VOCAB, blocks=blocks, width=WIDTH, heads=HEADS,
                                mlp_width=MLP)
    if name == "transformer_classifier":
        return models.get_model(name, (seq,), CLASSES, vocab_size=VOCAB, blocks=blocks,
                                width=WIDTH, heads=HEADS, mlp_width=MLP)
    return models.get_model(name, [seq], CLASSES, vocab_size=VOCAB, blocks=blocks, width=WIDTH)


def padded_tokens(n, seed=1, seq=SEQ):
    """Token ids in [1, VOCAB) followed by padding (0): lengths 2 .. SEQ, one full row."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(n, seq)).astype("int32")
    lengths = rng.integers(2, SEQ + 1, size=n)
    lengths[0] = SEQ
    for row, length in enumerate(lengths):
        x[row, length:] = 0
    return x


def data(name, n=8, seed=1):
    """`(tokens, labels)`: next-token labels `(n, SEQ)` for the LM, classes otherwise."""
    rng = np.random.default_rng(seed + 1)
    if name == "transformer_lm":
        x = rng.integers(0, VOCAB, size=(n, SEQ + 1)).astype("int32")  # full length
        return x[:, :-1], x[:, 1:]
    return padded_tokens(n, seed), rng.integers(0, CLASSES, size=n).astype("int32")


def run_stages(stages, x):
    """Chains stages with NumPy arrays in between, as plain tensors cross a pipeline cut."""
    values = x
    for stage in stages:
        out = stage(values, training=False)
        values = [np.asarray(t) for t in keras.tree.flatten(out)]
        values = values[0] if len(values) == 1 else values
    return values


def keras_one_step(model, x, y):
    """A Keras copy of `model` after plain `fit` on `(x, y)` (momentum SGD), and its loss."""
    ref = keras.models.clone_model(model)
    ref.set_weights(model.get_weights())
    ref.compile(keras.optimizers.SGD(LR, momentum=MOMENTUM), loss_fn(), run_eagerly=True)
    history = ref.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return ref, history.history["loss"]


def pipeline(model, cuts, mode="sync"):
    pipe = PipelineModel(model, cuts=cuts, devices=DEVICES[: len(cuts) + 1], mode=mode)
    pipe.compile(SpecTrainSGD(learning_rate=LR, momentum=MOMENTUM), loss_fn())
    return pipe


def differ(a, b):
    """Whether `a` and `b` differ by more than 5% of `b`'s largest magnitude."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max()) > 0.05 * float(np.abs(b).max())


def assert_weights_close(got, expected, atol=1e-5):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


# ---------------------------------------------------------------- independent counting


def dense(n_in, n_out):
    return n_in * n_out + n_out


def transformer_block_params(w, mlp):
    attention = 4 * dense(w, w)  # query, key, value and output projections (heads * key_dim = w)
    return 2 * (2 * w) + attention + dense(w, mlp) + dense(mlp, w)  # two LayerNorms


def expected_params(name, blocks=4, w=WIDTH):
    if name == "residual_lstm":
        lstm = 4 * (w * w + w * w + w)  # four gates: input kernel, recurrent kernel, bias
        return VOCAB * w + blocks * lstm + dense(w, CLASSES)
    body = VOCAB * w + SEQ * w + blocks * transformer_block_params(w, MLP) + 2 * w
    return body + dense(w, VOCAB if name == "transformer_lm" else CLASSES)


# ---------------------------------------------------------------- the builders


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_text_models_shapes_names_params_and_logits(name):
    model = build(name)
    names = [layer.name for layer in model.layers]
    assert model.name == name
    assert names == [layer.name for layer in build(name).layers]  # stable across builds
    assert model.count_params() == expected_params(name)
    assert model.inputs[0].dtype == "int32" and tuple(model.inputs[0].shape) == (None, SEQ)
    head = model.get_layer("predictions")
    assert model.layers[-1] is head and head.activation is keras.activations.linear
    per_block = ["_lstm", "_out"] if name == "residual_lstm" else [
        "_ln1", "_attn", "_add", "_ln2", "_mlp1", "_mlp2", "_out"]
    first = {"transformer_lm": ["input", "token_embedding", "position_embedding"],
             "transformer_classifier": ["input", "token_embedding", "position_embedding",
                                        "padding_mask"],
             "residual_lstm": ["input", "token_embedding", "padding_mask"]}[name]
    assert set(first) <= set(names) and names[0] == "input"
    for b in range(1, 5):
        assert {f"block{b}{part}" for part in per_block} <= set(names)
    assert "block5_out" not in names
    x, _ = data(name)
    out = np.asarray(model(x))
    if name == "transformer_lm":
        assert out.shape == (len(x), SEQ, VOCAB)
    else:
        assert out.shape == (len(x), CLASSES)
    assert (out < 0).any()  # logits, not probabilities


def test_initial_weights_follow_the_global_keras_seed():
    same = [build("transformer_lm", seed=3).get_weights(), build("transformer_lm", seed=3)
            .get_weights()]
    other = build("transformer_lm", seed=4).get_weights()
    assert_weights_close(same[0], same[1], atol=0)
    assert max(float(np.abs(a - b).max()) for a, b in zip(same[0], other)) > 1e-3


def test_the_language_model_is_causal():
    model = build("transformer_lm")
    x, _ = data("transformer_lm", n=2)
    changed = x.copy()
    changed[:, 5] = (changed[:, 5] + 1) % VOCAB
    before, after = np.asarray(model(x)), np.asarray(model(changed))
    np.testing.assert_allclose(after[:, :5], before[:, :5], atol=1e-6)  # the past cannot see it
    assert np.abs(after[:, 5:] - before[:, 5:]).min(axis=-1).max() > 1e-4


@pytest.mark.parametrize("name", ["transformer_classifier", "residual_lstm"])
def test_classifiers_ignore_padding(name):
    # The same weights on 12 tokens: 4 more padding ids (and new position vectors, which
    # only padding gets) must change nothing; without the mask everything changes.
    short, long = build(name), build(name, seed=5, seq=SEQ + 4)
    weights = short.get_weights()
    if name == "transformer_classifier":
        table = long.get_layer("position_embedding").get_weights()[0]
        table[:SEQ] = short.get_layer("position_embedding").get_weights()[0]
        long.get_layer("position_embedding").set_weights([table])
        index = [id(w) for w in short.weights].index(
            id(short.get_layer("position_embedding").weights[0]))
        weights[index] = table
    long.set_weights(weights)
    x = padded_tokens(6)
    padded = np.pad(x, [(0, 0), (0, 4)])
    np.testing.assert_allclose(np.asarray(long(padded)), np.asarray(short(x)), atol=1e-5)
    # Without the mask (no token id is -1, so nothing is padding) the padding counts.
    for model in (short, long):
        model.get_layer("padding_mask").padding_id = -1
    assert differ(long(padded), short(x))


# ---------------------------------------------------------------- the registry


def test_model_input_kind_names_images_tokens_and_any():
    kinds = {name: models.model_input_kind(name) for name in models.model_names()}
    assert {n for n, k in kinds.items() if k == "tokens"} == set(TEXT_MODELS)
    assert kinds["mlp"] == "any"
    assert {n for n, k in kinds.items() if k == "image"} == {
        "small_cnn", "vgg16", "resnet20", "resnet56", "resnet50"}
    with pytest.raises(ValueError, match=r"Received: name='lstm'"):
        models.model_input_kind("lstm")


@pytest.mark.parametrize("input_shape", [(8, 8), (0,), (), "8", (8.0,), None, (32, 32, 3)])
def test_text_models_take_one_positive_sequence_length(input_shape):
    with pytest.raises(ValueError, match=r"`input_shape` for model 'residual_lstm' must be a "
                                         r"tuple/list of one positive int \(seq_len,\)\. "
                                         r"Received: input_shape="):
        models.get_model("residual_lstm", input_shape, 2, vocab_size=10)


@pytest.mark.parametrize("name", ["transformer_classifier", "residual_lstm"])
def test_classifiers_require_a_vocab_size(name):
    with pytest.raises(TypeError, match=rf"Model '{name}' requires the keyword argument\(s\) "
                                        r"\['vocab_size'\] \(the number of token ids, an int "
                                        r">= 2, padding id 0 included\)\. Received: kwargs=\{\}"):
        models.get_model(name, (8,), 2)
    for bad in (1, 0, 2.5, True, "100"):
        with pytest.raises(ValueError, match=rf"`vocab_size` of model '{name}' must be an int "
                                             rf">= 2\. Received: vocab_size={bad!r}$"):
            models.get_model(name, (8,), 2, vocab_size=bad)


@pytest.mark.parametrize(
    "name, kwargs, error, match",
    [
        ("transformer_lm", {"vocab_size": 24}, TypeError,
         r"'transformer_lm': \['vocab_size'\]\. Valid keyword arguments: \['blocks', 'heads', "
         r"'mlp_width', 'width'\]"),
        ("transformer_lm", {"blocks": 0}, ValueError, r"`blocks` .* int >= 1\. Received: blocks=0"),
        ("transformer_lm", {"width": 10, "heads": 4}, ValueError,
         r"`width` of model 'transformer_lm' must be divisible by `heads` .*"
         r"Received: width=10, heads=4"),
        ("transformer_classifier", {"vocab_size": 9, "mlp_width": 0}, ValueError,
         r"Received: mlp_width=0"),
        ("residual_lstm", {"vocab_size": 9, "layers": 2}, TypeError,
         r"\['layers'\]\. Valid keyword arguments: \['blocks', 'vocab_size', 'width'\]"),
        ("residual_lstm", {"vocab_size": 9, "width": 1.5}, ValueError, r"Received: width=1\.5"),
    ],
)
def test_bad_text_model_options_raise(name, kwargs, error, match):
    with pytest.raises(error, match=match):
        models.get_model(name, (8,), 24, **kwargs)


# ---------------------------------------------------------------- cuts


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_cuts_at_block_ends_chain_to_the_whole_model(name):
    model = build(name)
    specs = partition.describe_stages(model, BLOCK_ENDS)
    # The LM hands on the block output alone, the classifiers also their padding mask.
    crossing = 1 if name == "transformer_lm" else 2
    assert [s.num_outputs for s in specs[:-1]] == [crossing] * 3
    assert [s.layer_names[-1] for s in specs[:-1]] == BLOCK_ENDS
    x, _ = data(name)
    np.testing.assert_allclose(run_stages(partition.split_model(model, BLOCK_ENDS), x),
                               np.asarray(model(x)), atol=1e-5)


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_default_cuts_are_the_block_ends(name):
    assert partition.default_cuts(build(name), 4) == BLOCK_ENDS


def test_auto_cuts_keep_one_stage_per_device_and_balance_the_language_model():
    # What PipelineModel(cuts="auto") plans (here without its calibrating rounds).
    model = build("transformer_lm")
    plan = costmodel.auto_partition(model, DEVICES, batch_size=8, calibration_rounds=0)
    assert plan.num_stages == 4 and len(plan.cuts) == 3
    assert len(partition.split_model(model, plan.cuts)) == 4
    assert plan.balance < 1.5  # all in one stage would be 4.0


@pytest.mark.parametrize("name", ["transformer_classifier", "residual_lstm"])
def test_the_model_and_its_stages_save_after_a_split_at_every_layer(name, tmp_path):
    # Timing layers one by one for `cuts="auto"` splits like this: later stages take the
    # token input (for the padding mask) beside inner tensors, which once broke saving.
    model = build(name, blocks=2)
    x, _ = data(name)
    expected = np.asarray(model(x))
    stages = partition.split_model(model, read_graph(model).names[:-1], keep_masks=False)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(np.asarray(loaded(x)), expected, atol=1e-5)
    values = x
    for k, stage in enumerate(stages):
        stage.save(tmp_path / f"stage{k}.keras")
        out = keras.models.load_model(tmp_path / f"stage{k}.keras")(values, training=False)
        mine = keras.tree.flatten(stage(values, training=False))
        assert len(keras.tree.flatten(out)) == len(mine)
        for got, want in zip(keras.tree.flatten(out), mine):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5,
                                       err_msg=stage.name)
        values = [np.asarray(t) for t in keras.tree.flatten(out)]
        values = values[0] if len(values) == 1 else values
    np.testing.assert_allclose(run_stages(partition.split_model(model, BLOCK_ENDS[:1]), x),
                               expected, atol=1e-5)


# ---------------------------------------------------------------- Keras masks across cuts


def user_text_model(mask_zero=True, seed=0):
    """Keras masking as users write it: every way a mask is read, one per layer.

    `emb` makes the mask, `lstm1` gets it as a recorded `mask=`, `mha` reads its query's
    and value's masks from the tensors, `add` passes them on, `lstm2` records the mask of
    the sum, and the per-token `head` hands it to the loss.
    """
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((SEQ,), dtype="int32", name="tokens")
    # Large initial weights, so that the logits (and the loss) depend on the masks.
    normal = keras.initializers.RandomNormal(stddev=1.0)
    x = keras.layers.Embedding(VOCAB, 4, normal, mask_zero=mask_zero, name="emb")(tokens)
    x = keras.layers.LSTM(4, return_sequences=True, name="lstm1")(x)
    a = keras.layers.MultiHeadAttention(2, 2, name="mha")(x, x)
    x = keras.layers.Add(name="add")([x, a])
    x = keras.layers.LSTM(4, return_sequences=True, name="lstm2")(x)
    head = keras.layers.Dense(CLASSES, kernel_initializer=keras.initializers.RandomNormal(
        stddev=10.0), name="head")
    return keras.Model(tokens, head(x), name="tagger")


def test_a_layer_called_with_keyword_arguments_reads_its_mask_from_the_tensor():
    # `LSTM(4)(x)` records its `mask=`; with any keyword argument Keras records none and
    # the LSTM reads the mask from `x` at run time, which a cut in front of it loses.
    keras.utils.set_random_seed(0)
    tokens = keras.Input((SEQ,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, 4, "random_normal", mask_zero=True, name="emb")(tokens)
    x = keras.layers.Dense(4, name="dense")(x)
    x = keras.layers.LSTM(4, name="lstm")(x, training=False)
    model = keras.Model(tokens, keras.layers.Dense(CLASSES, name="head")(x))
    assert partition.cuts_keeping_masks(model) == ["lstm"]
    with pytest.raises(ValueError, match=r"the cut after 'dense' does: the output of layer "
                                         r"'dense' carries a mask .* layer 'lstm' \(LSTM\)"):
        partition.split_model(model, ["dense"])
    x = padded_tokens(8)
    out = run_stages(partition.split_model(model, ["emb"], keep_masks=False), x)
    assert differ(out, model(x))


def masking_model(masked=True, seed=0):
    """A `Masking` layer on float features whose padded steps are zero, then two LSTMs."""
    keras.utils.set_random_seed(seed)
    features = keras.Input((SEQ, 3), name="features")
    x = keras.layers.Masking(name="masking")(features) if masked else features
    x = keras.layers.Dense(4, name="dense")(x)
    x = keras.layers.LSTM(4, return_sequences=True, name="lstm1")(x)
    x = keras.layers.LSTM(4, name="lstm2")(x)
    return keras.Model(features, keras.layers.Dense(CLASSES, name="head")(x), name="masking")


def masked_features(n=8):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, SEQ, 3)).astype("float32")
    x[padded_tokens(n) == 0] = 0.0
    return x


def test_cuts_that_hand_masks_on_as_tensors_equal_the_model():
    # After the mask's maker, after the attention that reads it, after the add that
    # passes it on to the LSTM that records it; alone and together.
    model = user_text_model()
    x = padded_tokens(8)
    expected = np.asarray(model(x))
    for cuts in (["emb"], ["mha"], ["add"], ["emb", "add"]):
        out = run_stages(partition.split_model(model, cuts), x)
        np.testing.assert_allclose(out, expected, atol=1e-6, err_msg=f"cuts={cuts}")
    # The masks matter: the same weights without them compute something else.
    assert differ(user_text_model(mask_zero=False)(x), expected)


@pytest.mark.parametrize(
    "cut, reader",
    [
        ("lstm1", r"the output of layer 'lstm1' carries a mask .* that layer 'mha' "
                  r"\(MultiHeadAttention\) reads from the tensor itself"),
        ("lstm2", r"the output of layer 'lstm2' carries a mask .* that the loss and metrics "
                  r"read from the model's output"),
    ],
    ids=["mha_reads", "loss_reads"],
)
def test_cuts_that_would_drop_a_mask_are_refused(cut, reader):
    model = user_text_model()
    keeping = partition.cuts_keeping_masks(model)
    assert set(keeping) >= {"emb", "mha", "add"} and not {"lstm1", "lstm2"} & set(keeping)
    message = (rf"`cuts` must not cut a Keras mask off from its reader, but the cut after "
               rf"'{cut}' does: {reader}.* Cut where every mask is kept, after one of "
               rf"\[.*'emb'.*'add'.*\].* Received: cuts=\['{cut}'\]")
    with pytest.raises(ValueError, match=message):
        partition.split_model(model, [cut])
    with pytest.raises(ValueError, match=message):
        PipelineModel(model, cuts=[cut], devices=DEVICES[:2], mode="sync")
    # What the refusal prevents: stages that silently compute without the mask.
    x, y = padded_tokens(8), np.random.default_rng(0).integers(0, CLASSES, size=(8, SEQ))
    out = run_stages(partition.split_model(model, [cut], keep_masks=False), x)
    whole = model(x)  # Keras keeps its mask, for the loss
    if cut == "lstm1":
        assert differ(out, whole)
    else:  # the same logits, but the loss would count the padding
        np.testing.assert_allclose(out, np.asarray(whole), atol=1e-6)
        assert abs(float(loss_fn()(y, out)) - float(loss_fn()(y, whole))) > 1e-4


def test_a_masking_layers_mask_crosses_cuts():
    # Right after `Masking`, after the `Dense` that passes its mask on, between the LSTMs.
    model, x = masking_model(), masked_features()
    assert partition.cuts_keeping_masks(model) == [
        call.name for call in read_graph(model).calls[:-1]]
    expected = np.asarray(model(x))
    for cuts in (["masking"], ["dense"], ["lstm1"], ["masking", "lstm1"]):
        out = run_stages(partition.split_model(model, cuts), x)
        np.testing.assert_allclose(out, expected, atol=1e-6, err_msg=f"cuts={cuts}")
    assert differ(masking_model(masked=False)(x), expected)


def test_a_sync_pipeline_of_a_masked_model_equals_keras_fit():
    # Three stages (masks handed on as tensors into both later ones); the per-token labels
    # make the last stage's loss use the mask, as Keras' `fit` does.
    model, x = user_text_model(), padded_tokens(8)
    y = np.random.default_rng(2).integers(0, CLASSES, size=(8, SEQ))
    w0 = model.get_weights()
    ref, ref_loss = keras_one_step(model, x, y)
    history = pipeline(model, ["emb", "add"]).fit(x, y, batch_size=8, epochs=1, verbose=0)
    np.testing.assert_allclose(history.history["loss"], ref_loss, rtol=1e-5)
    assert_weights_close(model.get_weights(), ref.get_weights())
    assert max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), w0)) > 1e-3
    logits = np.asarray(user_text_model()(x))  # an array: without the mask, so the loss
    assert abs(float(loss_fn()(y, logits)) - ref_loss[0]) > 1e-3  # would count the padding


def test_auto_cuts_never_lose_a_mask():
    # A 4-layer tagger: `emb`, its mask op, `lstm`, `head`; a cut after `lstm` would hand
    # the loss logits without their mask, so 2 stages are cut before it and 4 cannot be.
    keras.utils.set_random_seed(0)
    tokens = keras.Input((SEQ,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, 4, mask_zero=True, name="emb")(tokens)
    x = keras.layers.LSTM(4, return_sequences=True, name="lstm")(x)
    model = keras.Model(tokens, keras.layers.Dense(CLASSES, name="head")(x))
    keeping = partition.cuts_keeping_masks(model)
    assert keeping[0] == "emb" and len(keeping) == 2 and "lstm" not in keeping
    plan = costmodel.auto_partition(model, DEVICES[:2], batch_size=8, calibration_rounds=0)
    assert plan.cuts[0] in keeping
    with pytest.raises(ValueError, match=r"into 4 stages: only 2 of its layers can end a stage "
                                         r".*Use at most 3 stage"):
        costmodel.auto_partition(model, DEVICES, batch_size=8)
    assert set(partition.default_cuts(model, 2, by="layers")) <= set(keeping)


# ---------------------------------------------------------------- training in every mode


# Every mode on the recurrent model; the transformers (the same stage machinery, which the
# other modes' tests cover on MLPs) in sync (against Keras) and spectrain (predicting).
@pytest.mark.parametrize(
    "name, mode",
    [("residual_lstm", m) for m in ("sync", "vanilla", "stash", "spectrain")]
    + [(n, m) for n in ("transformer_lm", "transformer_classifier") for m in ("sync", "spectrain")],
)
def test_text_models_train_in_every_mode(name, mode, monkeypatch):
    # One block cut in its middle (three tensors cross, the padding mask among them; the
    # LSTM's output carries a Keras mask); sync is also one step of Keras' own `fit`.
    model, keras_twin = build(name, blocks=1), build(name, blocks=1)
    x, y = data(name)
    w0 = model.get_weights()
    cut = "block1_lstm" if name == "residual_lstm" else "block1_attn"
    pipe = pipeline(model, [cut], mode=mode)
    watched, watch = [], tf.GradientTape.watch

    def spy(tape, tensor):
        watched.extend(t.dtype for t in tf.nest.flatten(tensor))
        return watch(tape, tensor)

    monkeypatch.setattr(tf.GradientTape, "watch", spy)
    losses = pipe.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history["loss"]
    monkeypatch.undo()
    # The classifiers' boolean padding mask crosses the cut: no tape may watch it (which
    # TensorFlow refuses with a warning on every trace).
    assert watched and all(d.is_floating for d in watched), watched
    if mode == "sync":
        ref, ref_loss = keras_one_step(keras_twin, x, y)
        np.testing.assert_allclose(losses, ref_loss, rtol=1e-5)
        assert_weights_close(model.get_weights(), ref.get_weights())
    more = pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    losses += more
    assert np.all(np.isfinite(losses)) and losses[-1] != losses[0]
    trainable = {id(v) for v in model.trainable_weights}
    moved = [float(np.abs(w.numpy() - w_0).max())
             for w, w_0 in zip(model.weights, w0) if id(w) in trainable]
    assert min(moved) > 0  # every weight of both stages, LSTMs and attention included
