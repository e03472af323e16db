"""Checks of `PipelineModel`'s arguments, before any training step runs.

One rule, from `tf_spectrain.checks`: a value of the wrong type raises `TypeError`, one of
the right type but out of range `ValueError`; the message names the argument, shows the
value and says what is valid. `PipelineModel.fit`, `evaluate` and `predict` call these
once, at the API boundary, so a mistake never surfaces later from deep inside Keras,
TensorFlow or a stage thread. Whether data fit the model is `tf_spectrain.workflow.data_checks`
(with `tf_spectrain.workflow.data_structure`: data in parts per model input and output).
"""

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain.checks import check_bool, check_int
from tf_spectrain.workflow.data_checks import check_data

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "check_fit_args",
    "check_micro_batch_split",
    "check_verbose",
    "unpack_validation_data",
    "validation_names",
]

DEFAULT_BATCH_SIZE = 32
"""Batch size of `fit`, `evaluate` and `predict` when `batch_size` is None, as in Keras."""

_VERBOSE_HELP = "'auto', 0 (silent), 1 (progress bar) or 2 (one line per epoch)"


def check_verbose(verbose):
    """Checks `verbose` as Keras takes it: "auto", 0, 1 or 2 (False and True are 0 and 1).

    Args:
        verbose: the value passed to `fit`, `evaluate` or `predict`.

    Raises:
        TypeError: if it is neither a string nor an integer.
        ValueError: for another string or integer.
    """
    if isinstance(verbose, bool):
        return  # Keras takes verbose=True and False, as Python ints 1 and 0
    check_int("verbose", verbose, 0, 2, allow=("auto",), valid=_VERBOSE_HELP)


def check_micro_batch_split(num_examples, batch_size, micro_batches, flags=False):
    """Checks that every mini-batch splits into `micro_batches` equal micro-batches.

    `batch_size` must be a multiple of `micro_batches`, and the last, shorter mini-batch
    of an epoch of `num_examples` must not have fewer examples than `micro_batches`.
    Nothing to check for one micro-batch. The arguments are assumed to be checked ints.

    Args:
        num_examples: examples per epoch, or None when unknown (only the batch size is
            checked then).
        batch_size: the mini-batch size.
        micro_batches: micro-batches per mini-batch.
        flags: True to name the command-line flags (`--batch-size`, `--micro-batches`) in
            the message, False for the arguments (`batch_size`, `micro_batches`).

    Raises:
        ValueError: if a mini-batch cannot be split.
    """
    m = micro_batches
    if m == 1:
        return
    if batch_size % m:
        if flags:
            raise ValueError(
                f"--micro-batches must divide --batch-size. Received: --batch-size "
                f"{batch_size} and --micro-batches {m}"
            )
        raise ValueError(
            f"`micro_batches`={m} must divide `batch_size` (each mini-batch splits into "
            f"{m} equal micro-batches). Received: batch_size={batch_size}"
        )
    last = 0 if num_examples is None else num_examples % batch_size
    if not 0 < last < m:
        return
    if flags:
        raise ValueError(
            f"The last mini-batch of an epoch has {last} examples ({num_examples} training "
            f"examples, --batch-size {batch_size}), fewer than --micro-batches {m}: it "
            "cannot be split. Choose a batch size that leaves no remainder or a larger one, "
            "or fewer micro-batches."
        )
    raise ValueError(
        f"The last mini-batch of an epoch has {last} examples ({num_examples} examples, "
        f"batch_size={batch_size}), fewer than `micro_batches`={m}: it cannot be "
        "split. Choose a batch size that leaves no remainder, or fewer micro-batches."
    )


def _check_callbacks(callbacks):
    if callbacks is None:
        return
    if isinstance(callbacks, keras.callbacks.Callback):
        raise TypeError(
            "`callbacks` must be a list of keras.callbacks.Callback instances. Received: "
            f"callbacks={callbacks!r}; did you mean callbacks=[{type(callbacks).__name__}(...)]?"
        )
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(
            "`callbacks` must be a list of keras.callbacks.Callback instances. "
            f"Received: callbacks={callbacks!r} of type {type(callbacks).__name__}"
        )
    for c in callbacks:
        if not isinstance(c, keras.callbacks.Callback):
            what = "a class, not an instance" if isinstance(c, type) else type(c).__name__
            raise TypeError(
                "`callbacks` must contain keras.callbacks.Callback instances. "
                f"Received: {c!r} ({what}) in callbacks"
            )




def unpack_validation_data(validation_data):
    """Splits `validation_data` into `(x_val, y_val, sample_weight_val)`, as Keras does.

    Args:
        validation_data: `(x_val, y_val)` or `(x_val, y_val, sample_weight_val)` as a
            tuple or list, or a `tf.data.Dataset` of `(x, y[, sample_weight])` batches.

    Returns:
        `(x_val, y_val, sample_weight_val)`, with `y_val` and `sample_weight_val` None when
        `validation_data` is a dataset (and the weights None when not given).

    Raises:
        ValueError: for a tuple or list that does not have 2 or 3 items.
        TypeError: for anything else that is not a tuple, list or tf.data.Dataset.
    """
    if isinstance(validation_data, tf.data.Dataset):
        return validation_data, None, None
    if isinstance(validation_data, (tuple, list)) and len(validation_data) in (2, 3):
        return tuple(validation_data) + (None,) * (3 - len(validation_data))
    if isinstance(validation_data, (tuple, list)):
        raise ValueError(
            "`validation_data` must be (x_val, y_val), (x_val, y_val, sample_weight_val) or "
            "a tf.data.Dataset of (x, y) batches. Received: a "
            f"{type(validation_data).__name__} of {len(validation_data)}"
        )
    raise TypeError(
        "`validation_data` must be (x_val, y_val) or a tf.data.Dataset of (x, y) batches. "
        f"Received: validation_data of type {type(validation_data).__name__}"
    )


def validation_names(y_val):
    """Gives how messages call the parts of `validation_data`: the `names` of `check_data`.

    Args:
        y_val: the labels `unpack_validation_data` returned (None for a dataset).

    Returns:
        `("validation_data", "validation_data")` for a dataset, else
        `("validation_data[0]", "validation_data[1]")`.
    """
    if y_val is None:
        return ("validation_data", "validation_data")
    return ("validation_data[0]", "validation_data[1]")


def check_fit_args(
    model,
    loss,
    *,
    x,
    y,
    batch_size,
    epochs,
    verbose,
    callbacks,
    validation_data,
    shuffle,
    initial_epoch,
    steps_per_epoch,
):
    """Checks every argument of `PipelineModel.fit` before anything runs.

    Call it first in `fit` (after `_require_compiled`), with `fit`'s arguments as passed.

    Args:
        model: the wrapped Keras model (its inputs and output give the expected shapes).
        loss: the compiled loss, probed once on the labels.
        x, y, batch_size, epochs, verbose, callbacks, validation_data, shuffle,
            initial_epoch, steps_per_epoch: `fit`'s arguments.

    Raises:
        TypeError: an argument of the wrong type (a number that is not an int, callbacks,
            shuffle, data that is not arrays or a dataset).
        ValueError: a bad value, or data whose shapes do not fit the model or the loss
            (the message gives both shapes); the message names the argument.
    """
    check_int("epochs", epochs, 1)
    check_int("initial_epoch", initial_epoch, 0)
    if initial_epoch >= epochs:
        raise ValueError(
            "`initial_epoch` must be smaller than `epochs` (fit trains epochs "
            f"initial_epoch .. epochs - 1). Received: initial_epoch={initial_epoch}, "
            f"epochs={epochs}"
        )
    check_int("batch_size", batch_size, 1, none_ok=True)
    check_int("steps_per_epoch", steps_per_epoch, 1, none_ok=True)
    check_verbose(verbose)
    _check_callbacks(callbacks)
    check_bool("shuffle", shuffle)
    n = check_data(model, loss, x, y)
    if validation_data is not None:
        x_val, y_val, w_val = unpack_validation_data(validation_data)
        n_val = check_data(model, loss, x_val, y_val, names=validation_names(y_val))
        check_sample_weight(w_val, n_val, "validation_data[2]")
    if steps_per_epoch is not None:
        _check_enough_batches(x, n, batch_size, steps_per_epoch, epochs - initial_epoch)


def _check_enough_batches(x, n, batch_size, steps_per_epoch, num_epochs):
    """With `steps_per_epoch` one iterator runs through all epochs: it must last."""
    if n is not None:
        size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        available, source = -(-n // size), f"{n} examples in batches of {size} give"
        fix = "lower `steps_per_epoch`, or pass a repeated tf.data.Dataset"
    else:
        available, source = int(x.cardinality()), "the dataset has"
        fix = "repeat the dataset (dataset.repeat()) or lower `steps_per_epoch`"
    needed = steps_per_epoch * num_epochs
    if 0 <= available < needed:
        raise ValueError(
            f"`steps_per_epoch`={steps_per_epoch} for {num_epochs} epoch(s) needs {needed} "
            f"batches (one iterator runs through all epochs), but {source} only "
            f"{available}: {fix}."
        )


def check_validation_args(validation_steps, validation_batch_size, validation_freq):
    """Checks `fit`'s `validation_steps`, `validation_batch_size` and `validation_freq`.

    Raises:
        TypeError, ValueError: for a value Keras would not take (the message names it).
    """
    check_int("validation_steps", validation_steps, 1, none_ok=True)
    check_int("validation_batch_size", validation_batch_size, 1, none_ok=True)
    if isinstance(validation_freq, list):
        for epoch in validation_freq:
            check_int("validation_freq", epoch, 1)
        return
    check_int("validation_freq", validation_freq, 1)


def validation_due(epoch, validation_freq):
    """Whether `fit` validates after `epoch` (0-based), as Keras' `validation_freq` says."""
    if isinstance(validation_freq, list):
        return epoch + 1 in validation_freq
    return (epoch + 1) % validation_freq == 0


def check_sample_weight(sample_weight, num_examples, name="sample_weight"):
    """`sample_weight` (called `name` in messages) must be None or numbers with one row per
    example.

    Raises:
        TypeError: for weights that are not numeric arrays.
        ValueError: for weights whose first axis is not `num_examples` long.
    """
    if sample_weight is None:
        return
    values = tf.nest.flatten(sample_weight)
    for w in values:
        w = np.asarray(w)
        if w.dtype.kind not in "biuf":
            raise TypeError(
                f"`{name}` must be numbers, one weight per example. Received: an array "
                f"of dtype {w.dtype}")
        if w.ndim == 0 or w.shape[0] != num_examples:
            raise ValueError(
                f"`{name}` must have one weight per example: its first axis must be "
                f"{num_examples} long, as `x`'s. Received: {name} of shape {w.shape}")
