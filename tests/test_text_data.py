"""Tests of the text sets of `tf_spectrain.data`: the `pydoc` corpus (splits, windows,
vocabulary), `imdb_reviews` through mocked tensorflow-datasets (never the network), and
how `train.py` picks and checks a text dataset and reports a language model's perplexity.

The text models of the zoo are replaced here by tiny stand-ins under their registry names.
"""

import collections
import math
import re
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from data_reference import make_layout

from tf_spectrain import data, models
from tf_spectrain.app import cli, preparation, training
from tf_spectrain.app.config import ConfigError, RunConfig
from tf_spectrain.data import pydoc_corpus


@pytest.fixture(autouse=True)
def _private_tempdir(tmp_path, monkeypatch):
    # tfds leaves `tmp*tfds` folders behind; parse_args creates runs/...: keep both here.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def normal(paragraph):
    return " ".join(paragraph.split())


# ---------------------------------------------------------------------------------------
# The pydoc corpus: splits, tokens, windows, vocabulary.


def test_every_paragraph_of_pydoc_is_in_exactly_one_split():
    from pydoc_data.topics import topics

    splits = {s: pydoc_corpus.split_text(s).split("\n\n") for s in ("train", "test")}
    kept = {s: [normal(p) for p in paragraphs] for s, paragraphs in splits.items()}
    train, test = set(kept["train"]), set(kept["test"])
    assert len(kept["train"]) == len(train) and len(kept["test"]) == len(test)  # no repeats
    assert not train & test
    every = {normal(p) for text in topics.values() for p in text.split("\n\n")} - {""}
    assert train | test == every
    share = len(pydoc_corpus.split_text("test")) / sum(len(t) for t in map(
        pydoc_corpus.split_text, ("train", "test")))
    assert 0.05 < share < 0.15, share


@pytest.mark.parametrize("name, seq_len", [("pydoc", 128), ("pydoc_words", 64)])
def test_pydoc_counts_are_exact_and_windows_shift_by_one(name, seq_len):
    info = data.get_info(name)
    assert (info.input_shape, info.task, info.source) == ((seq_len,), "language_model",
                                                          "embedded")
    assert info.num_classes == info.vocab_size and info.label_shape == (seq_len,)
    level = "bytes" if name == "pydoc" else "words"
    for split, count in (("train", info.num_train), ("test", info.num_test)):
        tokens = np.array(pydoc_corpus.token_ids(level, split))
        assert count == (len(tokens) - 1) // seq_len  # each window needs one token more
        x, y = data.load_arrays(name, split)
        assert x.shape == y.shape == (count, seq_len) and x.dtype == y.dtype == np.int32
        np.testing.assert_array_equal(x.ravel(), tokens[: count * seq_len])
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
        np.testing.assert_array_equal(y[:-1, -1], x[1:, 0])
        assert y[-1, -1] == tokens[count * seq_len]
        assert 0 <= tokens.min() and tokens.max() < info.vocab_size


def test_byte_ids_are_the_utf8_text_and_no_test_window_occurs_in_train():
    for split in ("train", "test"):
        encoded = pydoc_corpus.split_text(split).encode("utf-8")
        assert pydoc_corpus.token_ids("bytes", split) == tuple(encoded)
        assert 0 not in encoded  # id 0 stays free for padding
    train = pydoc_corpus.split_text("train").encode("utf-8")
    x_test, _ = data.load_arrays("pydoc", "test")
    shared = [bytes(w.astype(np.uint8)) for w in x_test if bytes(w.astype(np.uint8)) in train]
    # Only the rules of a table ("|=====|") may repeat verbatim: no prose does.
    assert len(shared) <= len(x_test) // 100
    assert all(sum(c.isalpha() for c in w.decode()) < 20 for w in shared), shared


def test_word_vocabulary_comes_from_the_training_split_alone():
    def tokens(text):
        return re.findall(r"\w+|[^\w\s]", text.lower())

    train = tokens(pydoc_corpus.split_text("train"))
    test = tokens(pydoc_corpus.split_text("test"))

    def top(words):
        counts = collections.Counter(words)
        ranked = sorted(counts, key=lambda w: (-counts[w], w))[: data.get_info(
            "pydoc_words").vocab_size - 2]
        return {word: 2 + rank for rank, word in enumerate(ranked)}

    vocabulary = pydoc_corpus.word_vocabulary()
    assert vocabulary == top(train)
    assert vocabulary != top(train + test)  # so the check above can tell the two apart
    ids = pydoc_corpus.token_ids("words", "test")
    expected = [vocabulary.get(word, pydoc_corpus.OOV_ID) for word in test]
    assert list(ids) == expected
    unseen = set(test) - set(train)
    assert unseen and all(ids[i] == pydoc_corpus.OOV_ID for i, w in enumerate(test)
                          if w in unseen)
    assert pydoc_corpus.PAD_ID not in ids


def test_pydoc_training_order_is_deterministic_per_seed():
    def order(seed, **kwargs):
        ds = data.load("pydoc", "train", 64, seed=seed, limit=200, **kwargs)
        return np.concatenate([x for x, _ in ds.as_numpy_iterator()])

    first, again, other = order(3), order(3), order(4)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    x_ref, _ = data.load_arrays("pydoc", "train", limit=200)
    assert sorted(map(bytes, first)) == sorted(map(bytes, x_ref))  # the same 200 windows
    test_order = np.concatenate([x for x, _ in data.load("pydoc", "test", 64)])
    np.testing.assert_array_equal(test_order, data.load_arrays("pydoc", "test")[0])
    two = list(data.load_epochs("pydoc_words", 100, epochs=2, seed=1, limit=100))
    assert len(two) == 2 and not np.array_equal(two[0][0], two[1][0])
    np.testing.assert_array_equal(np.sort(two[0][1], axis=0), np.sort(two[1][1], axis=0))
    assert data.steps_per_epoch("pydoc", 64) == math.ceil(data.get_info("pydoc").num_train / 64)


def test_text_infos_tell_the_model_options_and_bad_levels_are_explained():
    imdb = data.get_info("imdb_reviews")
    assert (imdb.num_classes, imdb.input_shape, imdb.input_dtype) == (2, (256,), "int32")
    assert (imdb.input_kind, imdb.task, imdb.label_shape, imdb.image_shape) == (
        "text", "classification", (), None)
    assert imdb.model_options() == {"vocab_size": 20_000}
    assert data.get_info("pydoc").model_options() == {}  # num_classes is its vocabulary
    with pytest.raises(ValueError, match=r"`level` must be one of \['bytes', 'words'\]. "
                                         r"Received: level='chars'"):
        pydoc_corpus.token_ids("chars", "train")
    with pytest.raises(ValueError, match="Received: split='valid'"):
        pydoc_corpus.split_text("valid")


# ---------------------------------------------------------------------------------------
# imdb_reviews: tfds mocked with known reviews, read from a prepared data dir only.

TRAIN_REVIEWS = ["Good, good GOOD good film film film bad bad plot.", "good<br />film"]
TEST_REVIEWS = ["zebra good film", "film " * 300]
VOCABULARY = ["", "[UNK]", "good", "film", "bad", "plot"]  # by count in TRAIN_REVIEWS


def fake_reviews(self, split, **kwargs):
    texts = TEST_REVIEWS if "test" in str(split) else TRAIN_REVIEWS
    labels = np.array([1, 0], np.int64)
    return tf.data.Dataset.from_tensor_slices({"text": texts, "label": labels})


@pytest.fixture
def imdb_dir(tmp_path, monkeypatch):
    """A data dir with a prepared `imdb_reviews` layout, tfds mocked, `tfds.load` watched."""
    make_layout(tmp_path, ["tfds/imdb_reviews/plain_text/1.0.0/dataset_info.json"])
    calls = []
    load = tfds.load

    def watched(*args, **kwargs):
        calls.append((args, kwargs))
        return load(*args, **kwargs)

    monkeypatch.setattr(tfds, "load", watched)
    with tfds.testing.mock_data(as_dataset_fn=fake_reviews):
        yield str(tmp_path / "tfds"), calls


def test_imdb_is_tokenised_with_a_vocabulary_of_the_training_reviews(imdb_dir):
    root, calls = imdb_dir
    x, y = data.load_arrays("imdb_reviews", "test", data_dir=root)
    assert data.imdb_vectorizer(root).get_vocabulary() == VOCABULARY
    assert x.shape == (2, 256) and x.dtype == y.dtype == np.int32
    np.testing.assert_array_equal(x[0], [1, 2, 3] + [0] * 253)  # zebra: unknown
    np.testing.assert_array_equal(x[1], [3] * 256)  # cut to 256 tokens
    np.testing.assert_array_equal(y, [1, 0])
    x_train, _ = data.load_arrays("imdb_reviews", "train", data_dir=root)
    np.testing.assert_array_equal(x_train[1, :3], [2, 3, 0])  # <br /> is no word
    batches = list(data.load("imdb_reviews", "train", 1, data_dir=root, seed=0))
    assert sorted(int(b[1][0]) for b in batches) == [0, 1]
    assert calls and all(kw["download"] is False for _, kw in calls)
    assert all(args[0] == "imdb_reviews/plain_text:1.0.0" for args, _ in calls)


def test_imdb_without_prepared_data_fails_at_once_without_tfds(imdb_dir, tmp_path):
    _, calls = imdb_dir
    empty = tmp_path / "empty"
    empty.mkdir()
    for call in (lambda: data.load("imdb_reviews", "train", 8, data_dir=empty),
                 lambda: data.load_arrays("imdb_reviews", "test", data_dir=empty),
                 lambda: data.imdb_vectorizer(empty)):
        with pytest.raises(data.DatasetNotFoundError) as error:
            call()
        message = str(error.value)
        assert "Dataset 'imdb_reviews' is not prepared in `data_dir`" in message
        assert str(empty / "imdb_reviews" / "plain_text" / "<version>") in message
        assert "python train.py --dataset imdb_reviews --download --data-dir DIR" in message
    assert calls == []  # tensorflow-datasets was never asked, so it could not download


# ---------------------------------------------------------------------------------------
# train.py: default datasets, refusals, and a language model's test perplexity.


def tiny_lm(input_shape, num_classes):
    tokens = keras.Input(input_shape, dtype="int32", name="tokens")
    x = keras.layers.Embedding(num_classes, 8, name="embed")(tokens)
    x = keras.layers.Dense(16, activation="relu", name="block1")(x)
    return keras.Model(tokens, keras.layers.Dense(num_classes, name="logits")(x),
                       name="transformer_lm")


def tiny_classifier(input_shape, num_classes, *, vocab_size):
    tokens = keras.Input(input_shape, dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocab_size, 4, name="embed")(tokens)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(tokens, keras.layers.Dense(num_classes, name="logits")(x),
                       name="residual_lstm")


STAND_INS = {"transformer_lm": tiny_lm, "residual_lstm": tiny_classifier,
             "transformer_classifier": tiny_classifier}


@pytest.fixture
def text_models(monkeypatch):
    """The text model names, built as tiny stand-ins; returns the `get_model` calls."""
    calls, real_get, real_names = [], models.get_model, models.model_names

    def get_model(name, input_shape, num_classes, **options):
        calls.append((name, tuple(input_shape), num_classes, options))
        if name in STAND_INS:
            return STAND_INS[name](tuple(input_shape), num_classes, **options)
        return real_get(name, input_shape, num_classes, **options)

    monkeypatch.setattr(models, "get_model", get_model)
    monkeypatch.setattr(models, "model_names", lambda: sorted({*real_names(), *STAND_INS}))
    return calls


def test_default_dataset_follows_the_model(text_models):
    assert RunConfig(model="vgg16").dataset == "digits"
    assert cli.parse_args(["--model", "vgg16", "--gpus", "4"]).dataset == "digits"
    assert RunConfig(model="transformer_lm").dataset == "pydoc"
    assert RunConfig(model="transformer_lm", dataset="pydoc_words").dataset == "pydoc_words"
    with pytest.raises(ConfigError) as error:
        RunConfig(model="residual_lstm")
    assert str(error.value) == (
        "--model residual_lstm classifies token sequences and needs a dataset of labelled "
        "token sequences: give --dataset imdb_reviews (tensorflow-datasets, prepared in "
        "--data-dir). The bundled pydoc sets teach language modelling, for --model "
        "transformer_lm.")


@pytest.mark.parametrize("model, dataset, fitting", [
    ("vgg16", "pydoc", "cifar10, cifar100, digits, fashion_mnist, mnist"),
    ("mlp", "imdb_reviews", "cifar10, cifar100, digits, fashion_mnist, mnist"),
    ("transformer_lm", "digits", "pydoc, pydoc_words"),
    ("transformer_lm", "imdb_reviews", "pydoc, pydoc_words"),
    ("transformer_classifier", "pydoc", "imdb_reviews"),
])
def test_a_model_that_does_not_fit_the_dataset_is_refused(model, dataset, fitting,
                                                          text_models, capsys, tmp_path):
    with pytest.raises(ConfigError) as error:
        RunConfig(model=model, dataset=dataset, data_dir=str(tmp_path))  # before any check
    assert error.value.errors == [  # of the data dir, where imdb_reviews is not prepared
        f"--dataset {dataset} does not fit --model {model}: the model "
        f"{cli_kind(model)}, the dataset is for a model that {cli_kind_of_dataset(dataset)}."
        f" Use --dataset {fitting}, or another model. Received: --model {model} --dataset "
        f"{dataset}"]
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--model", model, "--dataset", dataset])
    assert exit_.value.code == 2
    assert f"--dataset {dataset} does not fit --model {model}" in capsys.readouterr().err
    assert text_models == []  # refused before any model was built


def cli_kind(model):
    return {"transformer_lm": "predicts the next token (language modelling)",
            "transformer_classifier": "classifies token sequences"}.get(model,
                                                                         "classifies images")


def cli_kind_of_dataset(dataset):
    return {"pydoc": cli_kind("transformer_lm"), "imdb_reviews": cli_kind(
        "transformer_classifier")}.get(dataset, "classifies images")


def lm_config(tmp_path, **kwargs):
    settings = dict(model="transformer_lm", gpus=1, mode="single", epochs=1, batch_size=16,
                    limit=48, keep_checkpoints=0, export="none", logdir=str(tmp_path / "run"),
                    verbose=0, log_every=1000, prediction_every=0, lr=0.05)
    return RunConfig(**{**settings, **kwargs})


def tiny_lm_logits(model, x):
    """The stand-in LM's forward pass in NumPy (float64), from its weights."""
    embed, kernel1, bias1, kernel2, bias2 = (w.astype(np.float64) for w in model.get_weights())
    return np.maximum(embed[x] @ kernel1 + bias1, 0) @ kernel2 + bias2


@pytest.mark.parametrize("mode, gpus, cuts", [("single", 1, "auto"), ("sync", 2, ("embed",))])
def test_language_model_run_reports_per_token_loss_and_perplexity(mode, gpus, cuts,
                                                                   text_models, tmp_path):
    result = training.run(lm_config(tmp_path, mode=mode, gpus=gpus, cuts=cuts, limit=32))
    assert text_models[-1] == ("transformer_lm", (128,), 256, {})
    x, y = data.load_arrays("pydoc", "test", limit=32)
    logits = tiny_lm_logits(result["model"], x)
    logits -= logits.max(axis=-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    per_token = -np.take_along_axis(log_probs, y[..., None], axis=-1)[..., 0]
    assert result["test_loss"] == pytest.approx(per_token.mean(), rel=1e-4)
    assert result["test_perplexity"] == pytest.approx(math.exp(per_token.mean()), rel=1e-4)
    assert result["test_accuracy"] == pytest.approx(
        np.mean(logits.argmax(axis=-1) == y), abs=1e-6)


def test_cli_prints_a_language_model_perplexity(text_models, capsys, tmp_path):
    argv = ["--model", "transformer_lm", "--gpus", "1", "--mode", "single", "--epochs", "1",
            "--limit", "16", "--batch-size", "16", "--keep-checkpoints", "0", "--export",
            "none", "--logdir", str(tmp_path / "lm")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "transformer_lm on pydoc (16 training sequences): single on /CPU:0" in out
    assert re.search(r"test loss [\d.]+ \| test perplexity [\d.]+ \| token accuracy [\d.]+ \| "
                     r"[\d.]+ sequences/s", out), out


def test_a_text_classifier_trains_on_imdb_with_its_vocabulary(text_models, imdb_dir, tmp_path):
    root, calls = imdb_dir
    run = preparation.prepare(lm_config(tmp_path, model="residual_lstm", dataset="imdb_reviews",
                                     data_dir=root, limit=2, batch_size=2))
    assert text_models[-1] == ("residual_lstm", (256,), 2, {"vocab_size": 20_000})
    result = training.train(run)
    assert "test_perplexity" not in result and 0 <= result["test_accuracy"] <= 1
    assert calls and all(kw["download"] is False for _, kw in calls)
