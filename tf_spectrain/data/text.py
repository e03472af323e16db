"""The text sets as NumPy arrays of token ids: `pydoc` windows, and `imdb_reviews`
tokenised by a Keras `TextVectorization` layer adapted on its training reviews.

`imdb_reviews`: each review is lower-cased, its `<br />` line breaks and punctuation are
removed, and it is split on whitespace; ids follow the word counts of the training reviews
(most frequent first, ties broken by the word: Keras' rule): 0 is padding, 1 an unknown
word, then the `IMDB_VOCAB_SIZE - 2` most frequent words. Every review is cut to its
first `IMDB_SEQ_LEN` tokens, or padded with 0 at the end. Labels: 0 negative, 1 positive.
The `pydoc` sets are described in `pydoc_corpus`.
"""

import functools

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain.data import pydoc_corpus
from tf_spectrain.data.catalog import (
    IMDB_SEQ_LEN,
    IMDB_VOCAB_SIZE,
    PYDOC_SETS,
    check_data_dir,
    check_split,
)
from tf_spectrain.data.tfds_source import tfds_examples

_PUNCTUATION = r"[!\"#$%&()\*\+,\-\./:;<=>?@\[\\\]^_`{|}~']"
_BATCH = 1024


def pydoc_windows(name, split):
    """Returns the examples of a `pydoc` set: non-overlapping windows and their next tokens.

    Args:
        name: `"pydoc"` or `"pydoc_words"`.
        split: `"train"` or `"test"`.

    Returns:
        `(inputs, labels)`, read-only int32 arrays `[N, seq_len]`; `labels[i]` is
        `inputs[i]` one token later.
    """
    level, seq_len = PYDOC_SETS[name]
    tokens = np.asarray(pydoc_corpus.token_ids(level, split), np.int32)
    count = pydoc_corpus.num_windows(len(tokens), seq_len)
    inputs = tokens[: count * seq_len].reshape(count, seq_len)
    labels = tokens[1 : count * seq_len + 1].reshape(count, seq_len)
    for array in (inputs, labels):
        array.flags.writeable = False
    return inputs, labels


def _standardize(texts):
    """Lower case, `<br />` line breaks as spaces, no punctuation."""
    texts = tf.strings.lower(texts)
    texts = tf.strings.regex_replace(texts, r"<br\s*/?>", " ")
    return tf.strings.regex_replace(texts, _PUNCTUATION, "")


def _reviews(split, data_dir, download):
    """The texts (an object array of bytes) and int32 labels of an `imdb_reviews` split."""
    examples = tfds_examples("imdb_reviews", split, data_dir, download)
    texts, labels = [], []
    for batch in examples.batch(_BATCH).as_numpy_iterator():
        texts.append(batch["text"])
        labels.append(batch["label"])
    return np.concatenate(texts), np.concatenate(labels).astype(np.int32)


@functools.lru_cache(maxsize=1)
def _vectorizer(data_dir, download):
    """The `TextVectorization` of `imdb_vectorizer`, cached per data dir."""
    texts, _ = _reviews("train", data_dir, download)
    layer = keras.layers.TextVectorization(
        max_tokens=IMDB_VOCAB_SIZE,
        standardize=_standardize,
        output_mode="int",
        output_sequence_length=IMDB_SEQ_LEN,
        name="imdb_vectorizer",
    )
    layer.adapt(tf.data.Dataset.from_tensor_slices(texts).batch(_BATCH))
    return layer


def imdb_vectorizer(data_dir=None, download=False):
    """The Keras layer that turns a batch of reviews into `imdb_reviews` token ids.

    A `TextVectorization` adapted on the training reviews (built once per data dir) giving
    int64 ids `[B, IMDB_SEQ_LEN]`. `data_dir` None means tfds' default; `download` lets
    tensorflow-datasets download and prepare the set, else DatasetNotFoundError is raised
    if it is not prepared in `data_dir`.
    """
    return _vectorizer(check_data_dir(data_dir), download)


@functools.lru_cache(maxsize=2)
def _imdb_arrays(split, data_dir, download):
    """`imdb_arrays` after its checks, cached."""
    vectorizer = _vectorizer(data_dir, download)
    texts, labels = _reviews(split, data_dir, download)
    ids = [
        vectorizer(texts[start : start + _BATCH]).numpy().astype(np.int32)
        for start in range(0, len(texts), _BATCH)
    ]
    inputs = np.concatenate(ids) if ids else np.zeros((0, IMDB_SEQ_LEN), np.int32)
    for array in (inputs, labels):
        array.flags.writeable = False
    return inputs, labels


def imdb_arrays(split, data_dir=None, download=False):
    """`(inputs, labels)` of `imdb_reviews` split `"train"` or `"test"`: read-only int32 arrays
    `[N, IMDB_SEQ_LEN]` and `[N]`, in file order (raises as `check_split`, `imdb_vectorizer`)."""
    check_split(split)
    return _imdb_arrays(split, check_data_dir(data_dir), download)
