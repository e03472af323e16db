"""Inference through a pipeline's stages: the outputs for `predict`, the logs of `evaluate`.

The stages run in inference mode (`training=False`) with the weights they hold, as a
forward-only pipeline (`runtime.forward_pipeline`): several batches in flight, every stage
busy on its own device, results consumed in order in the caller's thread.
"""

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.partition.keras_nodes import one_or_list
from tf_spectrain.runtime import forward_pipeline, stall
from tf_spectrain.runtime.bookkeeping import BatchLogs, fresh_metrics
from tf_spectrain.runtime.graphs import as_list, graph_function
from tf_spectrain.workflow import (
    batching,
    data_checks,
    data_structure,
    input_checks,
    iterators,
    sample_weights,
)


def infer(runners, x):
    """Chains the stages in inference mode, in the caller's thread.

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


class Evaluator:
    """Computes a pipeline's loss and metrics on data, as a forward-only pipeline.

    Made once per `compile`: its `bookkeeping.BatchLogs` (a loss tracker and metric copies
    on the last stage's device, made at the first call) is reset at every call, and its
    per-batch update is one graph function, traced once per batch shape, so `evaluate` and
    every epoch's validation reuse it.

    Args:
        runners: the stages' `StageRunner`s, in order.
        model: the wrapped Keras model (to check the data).
        loss: the compiled loss.
        metrics: the compiled metrics (or `output_metrics.OutputMetrics`); fresh copies are made
            from their configs, so the training metrics are left alone.
    """

    def __init__(self, runners, model, loss, metrics):
        self.runners = runners
        self.model = model
        self.loss = loss
        self.compiled_metrics = metrics
        self.device = runners[-1].device
        self.logs = None  # made at the first call, once the data have built the loss
        self._update = graph_function(self._update_state)

    def _update_state(self, labels, outputs, penalties):
        with tf.device(self.device):
            predictions = one_or_list(outputs)
            total = sample_weights.loss_value(self.loss, labels, predictions)
            total = total + tf.add_n(penalties)
            size = tf.shape(tf.nest.flatten(labels)[0])[0]
            self.logs.update(total, size, [(labels, predictions)])

    def _consume(self, result):
        self._update(result.extra, result.outputs, result.penalties)

    def __call__(self, data, batch_size, names=None, pipelined=True, steps=None,
                 callbacks=None, stall_timeout=stall.DEFAULT_TIMEOUT):
        """Computes the loss and metrics on `data`: `(x, y)` arrays or a dataset of batches.

        The loss includes the stages' layer losses, as in training.

        Args:
            data: `(x, y)` or `(x, y, sample_weight)` as a tuple or list, or a
                `tf.data.Dataset` of `(x, y[, sample_weight])` batches.
            batch_size: for arrays; None for the default of 32.
            names: how error messages call `x` and `y`; None: as parts of
                `validation_data`.
            pipelined: False runs the stages one after another in this thread instead
                (the same results; for comparisons).
            steps: None for every batch, else only the first `steps` batches.
            callbacks: None, or a `keras.callbacks.CallbackList` whose test-batch hooks
                run as each batch's results arrive (with the running logs).
            stall_timeout: see `forward_pipeline.run_forward`.

        Returns:
            A dict `{"loss": ..., <metric>: ...}` of floats.

        Raises:
            ValueError, TypeError: for a bad `data` or `batch_size` (see
                `batching.dataset`).
            Exception: whatever a stage raised, with a note naming the stage and batch.
        """
        x, y, weights = input_checks.unpack_validation_data(data)
        names = input_checks.validation_names(y) if names is None else names
        ds = batching.dataset(self.model, self.loss, x, y, batch_size, shuffle=False,
                              names=names, sample_weight=weights)
        if steps is not None:
            ds = ds.take(steps)
        if self.logs is None:
            with tf.device(self.device):
                self.logs = BatchLogs(fresh_metrics(self.compiled_metrics))
        self.logs.reset()
        consume = self._consume if callbacks is None else self._with_hooks(callbacks)
        _run(self.runners, ds, _labelled, consume, pipelined, stall_timeout)
        return self.logs.result()

    def _with_hooks(self, callbacks):
        """`_consume`, then the callbacks' test-batch hooks with the running logs."""
        step = iter(range(2**62))

        def consume(result):
            i = next(step)
            callbacks.on_test_batch_begin(i)
            self._consume(result)
            callbacks.on_test_batch_end(i, self.logs.result())

        return consume


def _labelled(element):
    """`(x, y)` -> the inputs (a list) and the labels."""
    x, y = element
    return as_list(x), y


def _run(runners, ds, split, consume, pipelined, stall_timeout=stall.DEFAULT_TIMEOUT):
    """Runs `ds` through the stages, as a pipeline or one stage after another."""
    if pipelined:  # one stage too: its thread is watched
        return forward_pipeline.run_forward(runners, ds, split, consume,
                                            stall_timeout=stall_timeout)
    return forward_pipeline.run_in_order(runners, ds, split, consume)


def evaluate_logs(
    runners, model, loss, metrics, data, batch_size, names=None, pipelined=True
):
    """`Evaluator(runners, model, loss, metrics)(data, batch_size, names, pipelined)`.

    A fresh `Evaluator` (and trace) per call: callers that evaluate often keep one.
    """
    return Evaluator(runners, model, loss, metrics)(data, batch_size, names, pipelined)


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
        data_checks.check_predict_dataset(model, x)
        ds = _model_inputs(model, x)
    else:
        bs = input_checks.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        checks.check_int("batch_size", bs, 1)
        data_checks.check_inputs(model, x)
        ds = tf.data.Dataset.from_tensor_slices(data_structure.model_inputs(model, x)).batch(bs)
        ds = iterators.without_autotune(ds)
    return ds, is_dataset


def _model_inputs(model, ds):
    """A dataset of inputs or `(x, y[, w])` batches as `(inputs, ...)` batches, the inputs
    the model's (`data_structure.model_inputs`: a dict by input name in the model's order)."""
    spec = ds.element_spec
    labelled = isinstance(spec, tuple) and len(spec) in (2, 3)
    if not data_structure.changes_inputs(model, spec[0] if labelled else spec):
        return ds
    if labelled:
        return ds.map(lambda x, *rest: (data_structure.model_inputs(model, x), *rest))
    return ds.map(lambda *x: (data_structure.model_inputs(model, x[0] if len(x) == 1 else x),))


def _predict_inputs(is_dataset):
    """The `split` of `predict`: a batch's inputs; `(x, y[, w])` batches give their `x`."""

    def split(element):
        if is_dataset and isinstance(element, tuple) and len(element) in (1, 2, 3):
            element = element[0]  # (x,), (x, y) or (x, y, sample_weight), as in Keras
        return as_list(element), None

    return split


def collect_outputs(runners, ds, is_dataset, pipelined=True, structure=None, callbacks=None,
                    stall_timeout=stall.DEFAULT_TIMEOUT):
    """Runs `ds` through the stages in inference mode, as a forward-only pipeline.

    Each batch's outputs are read back once, in the caller's thread, while the stages
    work on the next batches.

    Args:
        runners: the stages' `StageRunner`s, in order.
        ds: the batches, from `predict_dataset`.
        is_dataset: whether `x` was a dataset (then `(x, y[, w])` batches give their `x`).
        pipelined: False runs the stages one after another in this thread instead.
        structure: the model's output structure (`model.output`), to return the arrays
            in it (a dict for a model with a dict of outputs, as Keras' `predict`); None
            for a list.
        callbacks: None, or a `keras.callbacks.CallbackList` whose predict-batch hooks run
            as each batch's outputs arrive (`logs={"outputs": ...}`, as Keras gives them).
        stall_timeout: see `forward_pipeline.run_forward`.

    Returns:
        The outputs of all batches concatenated along the batch axis: one NumPy array for
        a model with one output, else one array per output (in `structure`, or a list).

    Raises:
        ValueError: if `ds` yields no batch.
    """
    outputs = []

    def keep(result):
        if callbacks is not None:
            callbacks.on_predict_batch_begin(len(outputs))
        outputs.append([np.asarray(t) for t in result.outputs])
        if callbacks is not None:
            callbacks.on_predict_batch_end(len(outputs) - 1,
                                           {"outputs": one_or_list(outputs[-1])})

    _run(runners, ds, _predict_inputs(is_dataset), keep, pipelined, stall_timeout)
    if not outputs:
        raise ValueError("`x` is empty: the dataset yielded no batch.")
    joined = [np.concatenate(parts, axis=0) for parts in zip(*outputs)]
    if structure is not None and len(joined) > 1:
        return keras.tree.pack_sequence_as(structure, joined)
    return one_or_list(joined)
