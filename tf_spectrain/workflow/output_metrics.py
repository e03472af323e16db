"""The compiled metrics of a model with several outputs, and its per-output loss logs.

`OutputMetrics` is what `PipelineModel.compile` makes of `metrics` and `weighted_metrics`
for a model with several outputs, beside its `tf_spectrain.workflow.outputs.OutputLoss`;
the rules it follows (Keras' own) are listed in `tf_spectrain.workflow.outputs`.
"""

import copy as _copy

import keras
import tensorflow as tf

# Keras has no public API for how `compile` resolves a metric identifier for one output
# (the shape-dependent "accuracy" included); this function is that rule.
from keras.src.trainers.compile_utils import get_metric as _keras_get_metric

from tf_spectrain.workflow import sample_weights
from tf_spectrain.workflow.outputs import (
    check_keys,
    describe_outputs,
    per_output_weights,
    shapes_for,
)


def _as_entries(value):
    """One output's metrics entry as a list of identifiers (None: no metrics)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _flat_logs(logs):
    """Keras' logs as callbacks and `evaluate` see them: sorted by name, dicts spread out."""
    flat = {}
    for key, value in sorted(logs.items()):
        if isinstance(value, dict):
            flat.update(_flat_logs(value))
        else:
            flat[key] = float(value)
    return flat


class OutputMetrics:
    """The compiled metrics of a model with several outputs, and its per-output loss logs.

    Built (`build`) from the labels the loss was built with; then each metric sees its own
    output's labels and predictions, and a `keras.metrics.Mean` per output with a loss
    (`loss.log_names`) tracks that output's unweighted loss, one equal-weight entry per batch.

    Args:
        loss: the model's `OutputLoss`.
        metrics: None; a list or tuple of one entry per output; or a dict by output name
            (outputs may be left out). An entry is a Keras metric, metric function or name,
            a list of them, or None.
        weighted_metrics: likewise, the metrics updated with the sample weights (named
            `<output>_weighted_<metric>` where a metric already has `<output>_<metric>`).

    Raises:
        ValueError: for a list of the wrong length, a dict naming something that is not an
            output, a non-list `metrics`, or an entry Keras cannot resolve.
    """

    def __init__(self, loss, metrics, weighted_metrics=None):
        self.loss = loss
        self._identifiers = self._entries("metrics", metrics)
        self._weighted_identifiers = self._entries("weighted_metrics", weighted_metrics)
        self._metrics_argument = metrics
        self._resolve(None)  # refuses unknown metrics in `compile`
        self.entries = None  # [(log name, output index, metric)] once built
        self.loss_trackers = None

    def _entries(self, argument, metrics):
        """Each output's list of metric identifiers, from `metrics` (or `weighted_metrics`)."""
        names = self.loss.names
        if metrics is None:
            return [[] for _ in names]
        if isinstance(metrics, dict):
            check_keys(argument, metrics, names, self.loss.model_name)
            return [_as_entries(metrics.get(n)) for n in names]
        if isinstance(metrics, (list, tuple)) and len(metrics) == len(names):
            return [_as_entries(m) for m in metrics]
        raise ValueError(
            f"`{argument}` of model '{self.loss.model_name}' with {describe_outputs(names)} "
            "must be a list of one entry per output (a metric, a list of metrics or None), or a "
            f"dict by output name, e.g. {argument}={{'" + names[0] + "': ['mae']}. "
            f"Received: {argument}={metrics!r}"
        )

    def _resolve(self, labels):
        """`[(output index, metric)]`: the metrics, then the weighted metrics (marked)."""
        resolved = []
        outputs = self.loss.outputs
        for identifiers, weighted in ((self._identifiers, False),
                                      (self._weighted_identifiers, True)):
            for k, (name, ids, y, out) in enumerate(
                zip(self.loss.names, identifiers, shapes_for(labels, outputs), outputs)
            ):
                for identifier in ids:
                    metric = self._metric(name, identifier, y, out, weighted)
                    if weighted:
                        sample_weights.mark_weighted(metric)
                    resolved.append((k, metric))
        return resolved

    def _metric(self, output, identifier, y, out, weighted):
        """Keras' metric for `identifier` on one output; a clear error if it has none."""
        argument = "weighted_metrics" if weighted else "metrics"
        try:
            return _keras_get_metric(identifier, y, out)
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"`{argument}` for output '{output}' must hold Keras metrics or their "
                f"names, such as 'accuracy' or keras.metrics.AUC(). Received: "
                f"{identifier!r} in {argument}={self._metrics_argument!r} ({e})"
            ) from None

    @property
    def built(self):
        """Whether the metrics are made (for the labels the loss was built with)."""
        return self.entries is not None

    def build(self):
        """Makes the metrics for the labels the loss was built with (once).

        Raises:
            RuntimeError: if the loss was not built yet (no labels seen).
        """
        if self.built:
            return
        if not self.loss.built:
            raise RuntimeError("OutputMetrics.build: the loss has seen no labels yet")
        shapes = [tf.TensorSpec(s) for s in self.loss.label_shapes]
        self._set(self._resolve(shapes))

    def _set(self, resolved):
        """Names the metrics as Keras logs them (`<output>_<metric>`, repeats numbered)."""
        counts, self.entries = {}, []
        for k, metric in resolved:
            name = f"{self.loss.names[k]}_{metric.name}"
            if name in counts and sample_weights.is_weighted(metric):
                name = f"{self.loss.names[k]}_weighted_{metric.name}"
            if name in counts:
                index, counts[name] = counts[name], counts[name] + 1
                name = f"{name}_{index}"
            else:
                counts[name] = 1
            self.entries.append((name, k, metric))
        self.loss_trackers = [keras.metrics.Mean(name=n) for n in self.loss.log_names]

    def fresh_copy(self):
        """A built copy with fresh metrics and trackers (from their configs), same names."""
        copy = _copy.copy(self)
        copy.entries = [(n, k, sample_weights.fresh_metric(m)) for n, k, m in self.entries]
        copy.loss_trackers = [keras.metrics.Mean(name=n) for n in self.loss.log_names]
        return copy

    def reset_state(self):
        """Zeroes every metric and per-output loss tracker."""
        for _, _, m in self.entries:
            m.reset_state()
        for t in self.loss_trackers:
            t.reset_state()

    def update_state(self, parts):
        """Adds one batch: each metric per part, each output's loss once for the batch.

        Args:
            parts: `[(labels, predictions)]`, the micro-batches of one batch (one pair
                for a whole batch); labels and predictions are lists in output order.
                Each output's loss of the batch is the size-weighted mean of the parts'.
        """
        parts = [(*sample_weights.unpack(labels), predictions) for labels, predictions in parts]
        for labels, weights, predictions in parts:
            per_output = per_output_weights(weights, self.loss.names)
            for _, k, m in self.entries:
                sample_weights.update_metric(m, labels[k], predictions[k], per_output[k])
        if not self.loss_trackers:
            return
        sizes = [tf.cast(tf.shape(tf.nest.flatten(y)[0])[0], tf.float32) for y, _, _ in parts]
        total = None
        for (labels, weights, predictions), size in zip(parts, sizes):
            values = self.loss.output_values(labels, predictions, weights)
            if len(parts) > 1:  # micro-batches: each weighs its share of the batch
                share = size / tf.add_n(sizes)
                values = [v * share for v in values]
            total = values if total is None else [a + b for a, b in zip(total, values)]
        for tracker, value in zip(self.loss_trackers, total):
            tracker.update_state(value)

    def logs(self, loss_tracker):
        """The logs as Keras gives them: `loss`, the metrics and per-output losses, sorted.

        Args:
            loss_tracker: the `keras.metrics.Mean` of the total loss.

        Returns:
            A dict of floats, in Keras' (sorted) order.
        """
        logs = {"loss": loss_tracker.result()}
        for name, _, m in self.entries:
            logs[name] = m.result()
        for tracker in self.loss_trackers:
            logs[tracker.name] = tracker.result()
        return _flat_logs(logs)

    def evaluate_values(self, logs):
        """`evaluate`'s results as a list, in Keras' order (`return_dict=False`).

        Keras lists the logs named `loss`, then its metrics' own names, then the per-output
        losses, then every other log in sorted order (the `<output>_<metric>` ones).

        Args:
            logs: the dict `logs` returned.

        Returns:
            A list of floats, or the only one.
        """
        order = ["loss"] + [m.name for _, _, m in self.entries] + self.loss.log_names
        values = [logs[n] for n in order if n in logs]
        values += [logs[k] for k in sorted(logs) if k not in order]
        return values[0] if len(values) == 1 else values
