"""Inference through a pipeline's stages: the outputs for `predict`, the logs of `evaluate`.

The stages run one after another in the caller's thread, in inference mode
(`training=False`), with the weights the stages hold.
"""

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import batching, input_checks
from tf_spectrain.runtime import iterators
from tf_spectrain.runtime.bookkeeping import metric_logs
from tf_spectrain.runtime.graphs import as_list, one_or_list


def infer(runners, x):
    """Chains the stages in inference mode.

    Args:
        runners: the stages' `StageRunner`s, in order.
        x: the model inputs (a tensor, or a list of them).

    Returns:
        `(outputs, penalty)`: the last stage's outputs (a tensor, or a list of them) and
        the stages' summed layer losses, as a float.
    """
    h, penalty = as_list(x), 0.0
    for runner in runners:
        h, stage_penalty = runner.infer(h)
        penalty += float(stage_penalty)
    return one_or_list(h), penalty


def evaluate_logs(runners, model, loss, metrics, data, batch_size, names=None):
    """Computes the loss and metrics on `data`: `(x, y)` arrays or a dataset of `(x, y)` batches.

    Fresh copies of `metrics` are used, so the training metrics are left alone. The loss
    includes the stages' layer losses, as in training.

    Args:
        runners: the stages' `StageRunner`s, in order.
        model: the wrapped Keras model (to check the data).
        loss: the compiled loss.
        metrics: the compiled metrics (copied from their config).
        data: `(x, y)` as a tuple or list, or a `tf.data.Dataset` of `(x, y)` batches.
        batch_size: for arrays; None for the default of 32.
        names: how error messages call `x` and `y`; None: as parts of `validation_data`.

    Returns:
        A dict `{"loss": ..., <metric>: ...}` of floats.

    Raises:
        ValueError, TypeError: for a bad `data` or `batch_size` (see `batching.dataset`).
    """
    x, y = input_checks.unpack_validation_data(data)
    names = input_checks.validation_names(y) if names is None else names
    ds = batching.dataset(model, loss, x, y, batch_size, shuffle=False, names=names)
    tracker = keras.metrics.Mean(name="loss")
    metrics = [m.__class__.from_config(m.get_config()) for m in metrics]
    for xb, yb in iterators.iterate(ds):
        logits, penalty = infer(runners, xb)
        tracker.update_state(loss(yb, logits) + penalty, sample_weight=tf.shape(yb)[0])
        for m in metrics:
            m.update_state(yb, logits)
    return metric_logs(tracker, metrics)


def predict_dataset(model, x, batch_size):
    """Batches `predict`'s `x`, checked against the model's inputs.

    Args:
        model: the wrapped Keras model.
        x: input arrays, or a `tf.data.Dataset` of input or `(x, y[, w])` batches.
        batch_size: for arrays; None for the default of 32 (ignored for a dataset).

    Returns:
        `(ds, is_dataset)`: the batches, and whether `x` was a dataset.

    Raises:
        ValueError, TypeError: for a bad `batch_size`, inputs that do not fit the model,
            or a dataset of 0 batches.
    """
    is_dataset = isinstance(x, tf.data.Dataset)
    if is_dataset:
        input_checks.check_predict_dataset(model, x)
        ds = x
    else:
        bs = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        input_checks.check_int("batch_size", bs, 1)
        input_checks.check_inputs(model, x)
        ds = tf.data.Dataset.from_tensor_slices(input_checks.model_inputs(model, x)).batch(bs)
        ds = iterators.without_autotune(ds)
    return ds, is_dataset


def collect_outputs(runners, ds, is_dataset):
    """Runs `ds` through the stages in inference mode.

    Args:
        runners: the stages' `StageRunner`s, in order.
        ds: the batches, from `predict_dataset`.
        is_dataset: whether `x` was a dataset (then `(x, y[, w])` batches give their `x`).

    Returns:
        The outputs of all batches, concatenated into one NumPy array.

    Raises:
        ValueError: if `ds` yields no batch.
    """
    outputs = []
    for xb in iterators.iterate(ds):
        if is_dataset and isinstance(xb, tuple) and len(xb) in (2, 3):
            xb = xb[0]  # (x, y) or (x, y, sample_weight), as in Keras
        outputs.append(np.asarray(infer(runners, xb)[0]))
    if not outputs:
        raise ValueError("`x` is empty: the dataset yielded no batch.")
    return np.concatenate(outputs, axis=0)
