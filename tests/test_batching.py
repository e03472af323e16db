"""`batching`: arrays and datasets as `(x, y)` mini-batches for a pipeline."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain import batching


def _model():
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(2)(inputs))


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
X = np.arange(30, dtype="float32").reshape(10, 3)
Y = np.arange(10) % 2


def test_dataset_batches_arrays_in_order_without_shuffle():
    ds = batching.dataset(_model(), LOSS, X, Y, batch_size=4, shuffle=False)
    sizes = [int(xb.shape[0]) for xb, _ in ds]
    assert sizes == [4, 4, 2]
    got = np.concatenate([yb.numpy() for _, yb in ds])
    np.testing.assert_array_equal(got, Y)


def test_dataset_passes_a_dataset_through():
    given = tf.data.Dataset.from_tensor_slices((X, Y)).batch(5)
    assert batching.dataset(_model(), LOSS, given, None, None, shuffle=True) is given


def test_dataset_default_batch_size_is_32():
    x = np.zeros((40, 3), "float32")
    ds = batching.dataset(_model(), LOSS, x, np.zeros(40, "int64"), None, shuffle=False)
    assert [int(xb.shape[0]) for xb, _ in ds] == [32, 8]


def test_epoch_batches_depend_only_on_seed_and_epoch():
    model = _model()

    def labels(seed, epoch):  # labels 0..9 show the order the examples come in
        ds = batching.epoch_batches(model, X, np.arange(10), 10, seed, epoch)
        return next(iter(ds))[1].numpy()

    for seed, epoch in [(3, 0), (3, 1), (4, 0)]:
        expected = np.random.default_rng([seed, epoch]).permutation(10)
        np.testing.assert_array_equal(labels(seed, epoch), expected)
    assert list(labels(3, 0)) != list(labels(3, 1))  # a new order every epoch


def test_epoch_batches_keep_inputs_and_labels_together():
    ds = batching.epoch_batches(_model(), X, np.arange(10), 4, seed=1, epoch=2)
    for xb, yb in ds:
        np.testing.assert_array_equal(xb.numpy()[:, 0], yb.numpy() * 3.0)


@pytest.mark.parametrize(
    "cardinality, steps, expected", [(5, None, 5), (5, 2, 2), (-1, 7, 7)]
)
def test_num_batches(cardinality, steps, expected):
    ds = tf.data.Dataset.range(5).batch(1)
    if cardinality < 0:
        ds = ds.repeat()
    assert batching.num_batches(ds, steps) == expected


@pytest.mark.parametrize(
    "ds, steps, pattern",
    [
        (tf.data.Dataset.range(3).repeat(), None, "unknown or infinite"),
        (tf.data.Dataset.range(0).batch(1), None, "empty"),
        (tf.data.Dataset.range(3), 0, "steps_per_epoch"),
    ],
)
def test_num_batches_refuses(ds, steps, pattern):
    with pytest.raises(ValueError, match=pattern):
        batching.num_batches(ds, steps)


@pytest.mark.parametrize(
    "n, batch_size, steps, m, pattern",
    [
        (12, 6, None, 4, "must divide `batch_size`"),
        (13, 4, None, 2, "last mini-batch of an epoch has 1 examples"),
    ],
)
def test_check_micro_batches_refuses(n, batch_size, steps, m, pattern):
    with pytest.raises(ValueError, match=pattern):
        batching.check_micro_batches(np.zeros((n, 3)), batch_size, steps, m)


@pytest.mark.parametrize(
    "n, batch_size, steps, m", [(12, 6, None, 3), (13, 4, 3, 2), (13, 4, None, 1), (14, 4, None, 2)]
)
def test_check_micro_batches_accepts(n, batch_size, steps, m):
    assert batching.check_micro_batches(np.zeros((n, 3)), batch_size, steps, m) is None


def test_check_micro_batches_leaves_datasets_alone():
    ds = tf.data.Dataset.range(3)
    assert batching.check_micro_batches(ds, 5, None, 4) is None
