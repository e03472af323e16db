"""The data a Keras user passes to `fit`, `evaluate` and `predict`, taken as Keras takes it.

Keras' own data handling does the work here: `validation_split` takes the last fraction of
the arrays before any shuffling, `class_weight` becomes sample weights, `(x, y,
sample_weight)` tuples unpack, and inputs that are neither arrays nor a `tf.data.Dataset`
(a `keras.utils.PyDataset`, a Python generator, pandas objects) go through Keras' data
adapters into a `tf.data.Dataset` of batches. The pipeline then batches arrays itself (its
shuffled order per epoch is what makes a resumed run exact) and uses datasets as given.

Under a global seed (`keras.utils.set_random_seed`), shuffled arrays are taken in Keras'
own order (`keras_order`), so that a `fit` in sync mode repeats Keras' `fit` exactly.

This is the one module of the project that uses Keras' data-handling internals
(`keras.src.trainers.data_adapters`), and TensorFlow's eager context for its global seed:
neither exports a public API for them.
"""

import warnings

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters import array_data_adapter as _array_adapter
from keras.src.trainers.data_adapters import array_slicing as _array_slicing
from keras.src.trainers.data_adapters import data_adapter_utils as _adapter_utils
from keras.src.trainers.data_adapters import get_data_adapter as _get_data_adapter

from tf_spectrain import checks, messages

# The global seed TensorFlow's eager context holds (TensorFlow exports no getter for it).
from tensorflow.python.eager import context as _context  # noqa: E402  isort: skip


def unpack(data):
    """`(x, y, sample_weight)` from a tuple of 1 to 3 parts, as Keras' `validation_data`."""
    return _adapter_utils.unpack_x_y_sample_weight(data)


def is_arrays(*parts):
    """Whether every part is arrays Keras can slice (NumPy, tensors, pandas; or None)."""
    return _array_adapter.can_convert_arrays(parts)


def is_adaptable(x):
    """Whether `x` is data for Keras' adapters: a `keras.utils.PyDataset` or an iterator
    (a generator) of batches."""
    return isinstance(x, keras.utils.PyDataset) or hasattr(x, "__next__")


def as_arrays(data):
    """Arrays (NumPy, tensors, pandas objects) as NumPy arrays, in the same structure."""
    return tf.nest.map_structure(_as_array, data)


def _as_array(part):
    """One array-like as a NumPy array (pandas via `to_numpy`, tensors via `numpy`)."""
    if part is None or isinstance(part, np.ndarray):
        return part
    if hasattr(part, "to_numpy"):
        return part.to_numpy()
    return np.asarray(part)


def keras_order(num_examples):
    """The order in which Keras' `fit(shuffle=True)` takes `num_examples` examples of arrays
    when a global seed is set (`keras.utils.set_random_seed`), else None.

    Keras shuffles arrays in a `tf.data` function whose random op is seeded from the global
    seed alone, and makes a new iterator every epoch: every epoch of every `fit` then sees
    the same order, which this computes with Keras' own adapter. Without a global seed
    Keras' order is not reproducible, and the pipeline uses its own seeded orders.
    """
    if _context.global_seed() is None:
        return None
    adapter = _array_adapter.ArrayDataAdapter(
        np.arange(num_examples, dtype="int64"), batch_size=max(1, num_examples), shuffle=True)
    return np.concatenate([np.asarray(batch) for batch in adapter.get_tf_dataset()])


def split_validation(x, y, sample_weight, validation_split):
    """Keras' `validation_split`: the last fraction of the arrays becomes validation data.

    Args:
        x, y, sample_weight: `fit`'s arrays (`sample_weight` may be None).
        validation_split: a float in (0, 1).

    Returns:
        `((x, y, sample_weight), (x_val, y_val, sample_weight_val))`.

    Raises:
        TypeError: `validation_split` is not a number.
        ValueError: it is not in (0, 1), the data are not arrays, or too few examples.
    """
    if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)):
        raise TypeError(
            "`validation_split` must be a float between 0 and 1. Received: "
            f"validation_split={validation_split!r}")
    if not 0 < validation_split < 1:
        raise ValueError(
            "`validation_split` must be a float strictly between 0 and 1 (the fraction of "
            f"the data to validate on). Received: validation_split={validation_split!r}")
    if not is_arrays(x, y, sample_weight):
        raise ValueError(
            "`validation_split` is only supported for arrays (NumPy, tensors, pandas), "
            f"not for x of type {type(x).__name__}; pass `validation_data` instead.")
    return _array_slicing.train_validation_split((x, y, sample_weight), validation_split)


def class_sample_weights(y, class_weight, sample_weight=None, multi_output=False):
    """Keras' `class_weight`: each example weighted by its class's weight.

    Class indices are the labels (rounded), or the argmax of one-hot labels; classes not
    in `class_weight` weigh 1.

    Args:
        y: the labels (an array, one output).
        class_weight: a dict `{class index: weight}`, or None.
        sample_weight: `fit`'s `sample_weight` (must be None with `class_weight`).
        multi_output: whether the model has several outputs (Keras refuses those).

    Returns:
        The sample weights (a float32 array), or `sample_weight` without `class_weight`.

    Raises:
        TypeError: `class_weight` is not a dict.
        ValueError: with `sample_weight` as well, or for a model with several outputs.
    """
    if class_weight is None:
        return sample_weight
    check_class_weight(class_weight, sample_weight, multi_output)
    return _adapter_utils.class_weight_to_sample_weights(np.asarray(y), class_weight)


def check_class_weight(class_weight, sample_weight=None, multi_output=False):
    """Raises for a `class_weight` Keras would refuse (see `class_sample_weights`)."""
    if class_weight is None:
        return
    checks.check_instance("class_weight", class_weight, dict,
                          " mapping class indices to weights, e.g. {0: 1.0, 1: 5.0}")
    if sample_weight is not None:
        raise ValueError(
            "`class_weight` and `sample_weight` cannot be given together (as in Keras); "
            "multiply the class weights into `sample_weight` instead.")
    if multi_output:
        raise ValueError(
            "`class_weight` is only supported for models with a single output (as in "
            "Keras); pass per-example `sample_weight` instead.")


def weight_dataset(ds, class_weight):
    """A dataset of `(x, y[, w])` batches with `class_weight` multiplied into its weights."""
    if class_weight is None:
        return ds
    check_class_weight(class_weight)
    return ds.map(_adapter_utils.make_class_weight_map_fn(class_weight))


def adapted_dataset(x, y, sample_weight, batch_size, steps, shuffle, class_weight):
    """A `tf.data.Dataset` of batches from anything Keras' data adapters take.

    For `x` that is neither arrays nor a dataset: a `keras.utils.PyDataset`, a Python
    generator of `(x, y[, w])` batches, and so on. The dataset's length is the adapter's
    number of batches where that is known.

    Args:
        x, y, sample_weight, batch_size, steps, shuffle, class_weight: as `fit` takes
            them (`steps` is `steps_per_epoch`).

    Returns:
        A `tf.data.Dataset` of `(x,)`, `(x, y)` or `(x, y, w)` batches.

    Raises:
        ValueError: for data Keras cannot adapt (its message).
    """
    adapter = _get_data_adapter(x, y, sample_weight, batch_size=batch_size,
                                steps_per_epoch=steps, shuffle=shuffle,
                                class_weight=class_weight)
    ds = adapter.get_tf_dataset()
    n = adapter.num_batches
    if n is not None and int(ds.cardinality()) < 0:
        ds = ds.apply(tf.data.experimental.assert_cardinality(n))
    return ds


def counted(ds):
    """A dataset of unknown length with its length counted by one pass over it (a warning
    says so: `steps_per_epoch` avoids the pass), for a schedule that needs it up front."""
    n = int(ds.reduce(np.int64(0), lambda count, _: count + 1))
    warnings.warn(
        f"The training dataset's length is unknown (after `filter`, say); counted {n} "
        "batches by one pass over it. Pass `steps_per_epoch` to skip that pass.",
        stacklevel=messages.user_stacklevel())
    return ds.apply(tf.data.experimental.assert_cardinality(n))


def standardize(x, y=None, sample_weight=None, batch_size=None, steps=None, shuffle=False,
                class_weight=None, multi_output=False, count=False):
    """`fit`'s or `evaluate`'s data as arrays or a `tf.data.Dataset`, with sample weights.

    Args:
        x, y, sample_weight, batch_size, steps, shuffle, class_weight: the arguments.
        multi_output: whether the model has several outputs.
        count: count the batches of a `tf.data.Dataset` of unknown length without
            `steps` (`counted`; `fit`'s schedule needs the epoch's length).

    Returns:
        `(x, y, sample_weight)`: NumPy arrays (pandas and tensors converted,
        `class_weight` turned into `sample_weight`), or `x` a `tf.data.Dataset` of
        `(x, y)` or `(x, y, w)` batches with `y` and `sample_weight` None.

    Raises:
        TypeError, ValueError: as Keras raises for such data.
    """
    if isinstance(x, tf.data.Dataset):
        for name, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None:
                raise ValueError(
                    f"`{name}` must be None when `x` is a tf.data.Dataset: the dataset yields "
                    f"(x, y) or (x, y, sample_weight) batches. Received: {name} of type "
                    f"{type(value).__name__}")
        check_class_weight(class_weight, None, multi_output)
        if count and steps is None and int(x.cardinality()) == tf.data.UNKNOWN_CARDINALITY:
            x = counted(x)
        return weight_dataset(x, class_weight), None, None
    if x is not None and is_arrays(x, y, sample_weight):
        x, y, sample_weight = as_arrays(x), as_arrays(y), as_arrays(sample_weight)
        if class_weight is not None and y is not None:
            sample_weight = class_sample_weights(y, class_weight, sample_weight, multi_output)
        return x, y, sample_weight
    if not is_adaptable(x):
        return x, y, sample_weight  # left to the pipeline's checks, which name the problem
    check_class_weight(class_weight, sample_weight, multi_output)
    return adapted_dataset(x, y, sample_weight, batch_size, steps, shuffle,
                           class_weight), None, None


def standardize_validation(validation_data, multi_output=False):
    """`fit`'s `validation_data` as `standardize` gives data: arrays or a dataset.

    Args:
        validation_data: `(x, y)`, `(x, y, sample_weight)` or a dataset.
        multi_output: whether the model has several outputs.

    Returns:
        `(x, y, sample_weight)` arrays, or a `tf.data.Dataset`, or `validation_data` as it
        is where it is neither (the pipeline's checks name the problem).
    """
    if isinstance(validation_data, tf.data.Dataset):
        return validation_data
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        return validation_data
    x, y, weights = unpack(tuple(validation_data))
    x, y, weights = standardize(x, y, weights, multi_output=multi_output)
    return x if isinstance(x, tf.data.Dataset) else (x, y, weights)


def fit_data(x, y, sample_weight, batch_size, steps, shuffle, class_weight, validation_split,
             validation_data, multi_output=False):
    """`fit`'s data as Keras prepares them, in Keras' order: the arrays standardised, the
    last `validation_split` of them set aside, then `class_weight` turned into the training
    part's sample weights (the validation part is not weighted by class, as in Keras).

    Args:
        x, y, sample_weight, batch_size, steps, shuffle, class_weight, validation_split,
            validation_data: `fit`'s arguments (`steps` its `steps_per_epoch`).
        multi_output: whether the model has several outputs.

    Returns:
        `(x, y, sample_weight, validation_data)`, as `standardize` and
        `standardize_validation` give them.

    Raises:
        TypeError, ValueError: as Keras raises for such data and arguments.
    """
    arrays = not isinstance(x, tf.data.Dataset) and x is not None and is_arrays(
        x, y, sample_weight)
    x, y, sample_weight = standardize(
        x, y, sample_weight, batch_size, steps, shuffle,
        None if arrays else class_weight, multi_output, count=True)
    if validation_split and validation_data is None:
        (x, y, sample_weight), validation_data = split_validation(
            x, y, sample_weight, validation_split)
    if arrays and y is not None:
        sample_weight = class_sample_weights(y, class_weight, sample_weight, multi_output)
    if validation_data is not None:
        validation_data = standardize_validation(validation_data, multi_output)
    return x, y, sample_weight, validation_data
