"""`batching`: arrays and datasets as `(x, y)` mini-batches for a pipeline."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain.workflow import batching, keras_data


def _model(classes=2):
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(classes)(inputs))


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
    ],
)
def test_num_batches_refuses(ds, steps, pattern):
    with pytest.raises(ValueError, match=pattern):
        batching.num_batches(ds, steps)


def _feed(n, batch_size, steps, m, x=None):
    y = np.zeros(n, "int64") if x is None else None
    x = np.zeros((n, 3), "float32") if x is None else x
    return batching.EpochFeed(_model(), LOSS, x, y, batch_size, False, steps, m)


@pytest.mark.parametrize(
    "n, batch_size, steps, m, pattern",
    [
        (12, 6, None, 4, "must divide `batch_size`"),
        (13, 4, None, 2, "last mini-batch of an epoch has 1 examples"),
    ],
)
def test_epoch_feed_refuses_mini_batches_that_do_not_split(n, batch_size, steps, m, pattern):
    with pytest.raises(ValueError, match=pattern):
        _feed(n, batch_size, steps, m)


@pytest.mark.parametrize(
    "n, batch_size, steps, m, num_batches",
    [(12, 6, None, 3, 2), (13, 4, 3, 2, 3), (13, 4, None, 1, 4), (14, 4, None, 2, 4)],
)
def test_epoch_feed_accepts(n, batch_size, steps, m, num_batches):
    assert _feed(n, batch_size, steps, m).num_batches == num_batches


def test_epoch_feed_leaves_a_datasets_batches_to_run_time():
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((6, 3), "float32"), np.zeros(6, "int64")))
    ds = ds.batch(5)
    assert _feed(6, None, None, 4, x=ds).num_batches == 2


def test_epoch_feed_orders_shuffled_arrays_per_epoch_and_continues_a_dataset():
    tf.random.set_seed(None)  # without a global seed: the pipeline's own order per epoch
    x, y = np.arange(30, dtype="float32").reshape(10, 3), np.arange(10)
    feed = batching.EpochFeed(_model(10), LOSS, x, y, 10, True, None, 1)
    got = next(feed.batches(5, 2))[1].numpy()
    np.testing.assert_array_equal(got, np.random.default_rng([5, 2]).permutation(10))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2).repeat()
    feed = batching.EpochFeed(_model(10), LOSS, ds, None, None, False, 3, 1)
    first = [yb.numpy().tolist() for _, yb in itertools.islice(feed.batches(0, 0), 3)]
    second = [yb.numpy().tolist() for _, yb in itertools.islice(feed.batches(0, 1), 2)]
    assert first + second == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]  # one iterator


def test_epoch_feed_takes_keras_order_every_epoch_under_a_global_seed():
    x, y = np.arange(30, dtype="float32").reshape(10, 3), np.arange(10)
    tf.random.set_seed(4)
    feed = batching.EpochFeed(_model(10), LOSS, x, y, 10, True, None, 1)
    orders = [next(feed.batches(5, epoch))[1].numpy().tolist() for epoch in (0, 1)]
    keras_order = keras_data.keras_order(10).tolist()
    assert orders == [keras_order, keras_order] and sorted(keras_order) == list(range(10))
    assert keras_order != list(range(10))
