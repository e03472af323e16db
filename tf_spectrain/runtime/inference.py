"""Inference through a pipeline's stages: the outputs for `predict`, the logs of `evaluate`.

The stages run one after another in the caller's thread, in inference mode
(`training=False`), with the weights the stages hold.
"""

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import batching, input_checks
from tf_spectrain.runtime.bookkeeping import metric_logs
from tf_spectrain.runtime.stage import as_list, one_or_list


def infer(runners, x):
    """Outputs of the stages chained in inference mode, and their summed layer losses."""
    h, penalty = as_list(x), 0.0
    for runner in runners:
        h, stage_penalty = runner.infer(h)
        penalty += float(stage_penalty)
    return one_or_list(h), penalty


def evaluate_logs(runners, model, loss, metrics, data, batch_size, names=None):
    """Loss and metrics on `data`: `(x, y)` arrays or a dataset of `(x, y)` batches.

    Fresh copies of `metrics` are used, so the training metrics are left alone. Error
    messages call the data `validation_data` unless `names` gives the names of `x` and `y`.
    """
    x, y = input_checks.unpack_validation_data(data)
    names = input_checks.validation_names(y) if names is None else names
    ds = batching.dataset(model, loss, x, y, batch_size, shuffle=False, names=names)
    tracker = keras.metrics.Mean(name="loss")
    metrics = [m.__class__.from_config(m.get_config()) for m in metrics]
    for xb, yb in ds:
        logits, penalty = infer(runners, xb)
        tracker.update_state(loss(yb, logits) + penalty, sample_weight=tf.shape(yb)[0])
        for m in metrics:
            m.update_state(yb, logits)
    return metric_logs(tracker, metrics)


def predict_dataset(model, x, batch_size):
    """`(batches of x, whether x was a dataset)`, checked against the model's inputs.

    Raises:
        ValueError, TypeError: for a bad `batch_size`, inputs that do not fit the model,
            or a dataset that yields nothing.
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
    return ds, is_dataset


def collect_outputs(runners, ds, is_dataset):
    """Runs `ds` through the stages; returns the outputs as one NumPy array."""
    outputs = []
    for xb in ds:
        if is_dataset and isinstance(xb, tuple) and len(xb) in (2, 3):
            xb = xb[0]  # (x, y) or (x, y, sample_weight), as in Keras
        outputs.append(np.asarray(infer(runners, xb)[0]))
    if not outputs:
        raise ValueError("`x` is empty: the dataset yielded no batch.")
    return np.concatenate(outputs, axis=0)
