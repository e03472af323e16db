"""Mini-batches for `PipelineModel`: arrays or datasets as `tf.data` batches of `(x, y)`.

Arrays are checked against the model and loss, then batched; shuffled arrays get an order
per epoch that depends only on a seed and the epoch count, so a resumed run sees the
epochs an uninterrupted one would.
"""

import numpy as np
import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.workflow import (
    data_checks,
    data_structure,
    input_checks,
    keras_data,
    sample_weights,
)
from tf_spectrain.workflow.iterators import retire, without_autotune
from tf_spectrain.workflow.outputs import OutputLoss, is_multi_output


def dataset(model, loss, x, y, batch_size, shuffle, names=("x", "y"), sample_weight=None):
    """`(x, y)` batches from arrays or a dataset, checked against the model and loss.

    For a model with several outputs, `y` becomes a tuple in output order, and the
    `outputs.OutputLoss` is built for the labels' shapes. With sample weights (the
    `sample_weight` array, or a dataset of `(x, y, sample_weight)` batches), each batch's
    `y` carries its weights (`sample_weights.pack`).

    Args:
        model: the wrapped Keras model (its inputs fix the expected shapes).
        loss: the compiled loss (it fixes the expected labels).
        x, y: arrays, or `x` a `tf.data.Dataset` of `(x, y)` batches (used as given).
        batch_size: for arrays; None for the default of 32.
        shuffle: shuffle arrays (reshuffled at every iteration).
        names: how error messages call `x` and `y`.
        sample_weight: None, or an array of one weight per example (arrays only).

    Returns:
        A `tf.data.Dataset` of `(x, y)` batches.

    Raises:
        ValueError, TypeError: for a bad `batch_size` or data that does not fit the model.
    """
    batch_size = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    checks.check_int("batch_size", batch_size, 1)
    n_x = data_checks.check_data(model, loss, x, y, names)
    if n_x is None:
        return _labels_in_order(model, loss, x)  # a dataset of (x, y) batches, as given
    input_checks.check_sample_weight(sample_weight, n_x)
    inputs = data_structure.model_inputs(model, x)
    labels = sample_weights.pack(data_structure.model_labels(model, y), sample_weight)
    ds = tf.data.Dataset.from_tensor_slices((inputs, labels))
    if shuffle:
        ds = ds.shuffle(n_x, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size)
    _build_loss(loss, ds)
    return without_autotune(ds.prefetch(2))


def _labels_in_order(model, loss, ds):
    """A dataset for a model with several outputs yields its labels as a tuple in output order.

    Labels given as a dict (by output name) or a list are mapped to that tuple; a tuple, or
    a model with one output, leaves the labels as they are. `(x, y, sample_weight)` batches
    become `(x, y)` batches whose labels carry their weights, and the inputs are made the
    model's (`data_structure.model_inputs`: a dict by input name in the model's order).
    """
    if len(ds.element_spec) == 3:
        ds = ds.map(lambda x, y, w: (x, sample_weights.pack(y, w)))
    if data_structure.changes_inputs(model, ds.element_spec[0]):  # a dict, or Keras' ranks
        ds = ds.map(lambda x, y: (data_structure.model_inputs(model, x), y))
    labels, _ = sample_weights.unpack(ds.element_spec[1])
    if is_multi_output(model) and isinstance(labels, (dict, list)):
        def in_order(x, y):
            y, w = sample_weights.unpack(y)
            return x, sample_weights.pack(data_structure.model_labels(model, y), w)

        ds = ds.map(in_order)
    _build_loss(loss, ds)
    return ds


def _build_loss(loss, ds):
    """A model with several outputs resolves its losses and metrics for the first labels.

    `ds` yields batches, so the labels' shapes have their batch axis, as Keras sees them.
    """
    if isinstance(loss, OutputLoss):
        loss.build(sample_weights.unpack(ds.element_spec[1])[0])


def epoch_batches(model, x, y, batch_size, seed, epoch, order=None):
    """Batches arrays (already checked) in a shuffled order for epoch `epoch` of a pipeline's life.

    The order depends only on `seed` and `epoch`, so successive `fit` calls see new
    orders, as with Keras, and a resumed run the same orders as an uninterrupted one;
    unless `order` is given (`keras_data.keras_order`: Keras' own, under a global seed).

    Args:
        model: the wrapped Keras model (its inputs name the parts of `x`).
        x: the input arrays (an array, a list or a dict of them).
        y: the label arrays (an array, or a tuple or dict of them).
        batch_size: examples per mini-batch; None for the default of 32.
        seed: the pipeline's shuffle seed.
        epoch: the epoch count since the pipeline started (0 for the first).
        order: None, or the permutation of the examples to use.

    Returns:
        A `tf.data.Dataset` of `(x, y)` batches, in the epoch's order.
    """
    batch_size = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    inputs = data_structure.model_inputs(model, x)
    n = len(tf.nest.flatten(inputs)[0])
    if order is None:
        order = np.random.default_rng([seed, epoch]).permutation(n)

    def permuted(part):
        return np.asarray(part)[order]

    inputs = tf.nest.map_structure(permuted, inputs)
    labels = tf.nest.map_structure(permuted, y) if isinstance(y, (tuple, dict)) else permuted(y)
    ds = tf.data.Dataset.from_tensor_slices((inputs, labels))
    return without_autotune(ds.batch(batch_size).prefetch(2))


def num_batches(ds, steps):
    """Mini-batches per epoch: `steps` if given, else the dataset's known length.

    Args:
        ds: the training dataset of `(x, y)` batches.
        steps: `fit`'s `steps_per_epoch` (already checked: None or an int >= 1).

    Returns:
        The number of mini-batches per epoch, as an int.

    Raises:
        ValueError: without `steps`, a dataset of unknown, infinite or zero length.
    """
    if steps is not None:
        return int(steps)
    n = int(ds.cardinality())
    if n < 0:
        raise ValueError(
            "The number of batches in the dataset is unknown or infinite; pass "
            "`steps_per_epoch` (the pipeline schedule needs the epoch length up front)."
        )
    if n == 0:
        raise ValueError("The training data is empty.")
    return n


class EpochFeed:
    """The mini-batches of every epoch of one `fit`, checked before training starts.

    Arrays with `shuffle` (and no `steps_per_epoch`) get a new order per epoch from
    `epoch_batches`; a dataset is iterated anew each epoch, or, with `steps_per_epoch`,
    continued across epochs.

    Args:
        model, loss: the wrapped model and the compiled loss (to check the data).
        x, y, batch_size, shuffle, steps_per_epoch: as `PipelineModel.fit` takes them.
        micro_batches: the pipeline's micro-batches per mini-batch.
        sample_weight: None, or the examples' weights (arrays only).

    Raises:
        ValueError, TypeError: data that does not fit, or an epoch length that is
            unknown or cannot be split into micro-batches.
    """

    def __init__(self, model, loss, x, y, batch_size, shuffle, steps_per_epoch, micro_batches,
                 sample_weight=None):
        self.dataset = dataset(model, loss, x, y, batch_size, shuffle,
                               sample_weight=sample_weight)
        self.num_batches = num_batches(self.dataset, steps_per_epoch)
        if not isinstance(x, tf.data.Dataset):  # a dataset's batch sizes show when it runs
            input_checks.check_micro_batch_split(
                None if steps_per_epoch is not None else len(tf.nest.flatten(x)[0]),
                input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
                micro_batches,
            )
        labels = y if isinstance(x, tf.data.Dataset) else sample_weights.pack(
            data_structure.model_labels(model, y), sample_weight)
        self._arrays = (model, x, labels, batch_size)
        self._per_epoch_order = (
            shuffle and not isinstance(x, tf.data.Dataset) and steps_per_epoch is None
        )
        # Under a global seed Keras takes arrays in one seeded order every epoch: so do we.
        self._order = keras_data.keras_order(len(tf.nest.flatten(x)[0])) if (
            self._per_epoch_order) else None
        self._iterator = iter(self.dataset) if steps_per_epoch is not None else None
        self._epoch_iterator = None

    def batches(self, seed, epoch):
        """Gives the `(x, y)` mini-batches of the next epoch.

        The previous epoch's iterator (if it was one per epoch) is retired: deleted on a
        background thread (`workflow.iterators.retire`), so that no epoch waits for it.

        Args:
            seed: the pipeline's shuffle seed (used only for arrays shuffled per epoch).
            epoch: the epoch count since the pipeline started (likewise).

        Returns:
            An iterator of `(x, y)` batches: freshly shuffled arrays, a new pass over the
            dataset, or, with `steps_per_epoch`, the one iterator continued across epochs.
        """
        if self._iterator is not None:
            return self._iterator
        retire(self._epoch_iterator)
        if self._per_epoch_order:
            self._epoch_iterator = iter(epoch_batches(*self._arrays, seed, epoch, self._order))
        else:
            self._epoch_iterator = iter(self.dataset)
        return self._epoch_iterator

    def close(self):
        """Retires the iterators still open (call when `fit` ends, however it ends)."""
        retire(self._epoch_iterator)
        retire(self._iterator)
        self._epoch_iterator = self._iterator = None
