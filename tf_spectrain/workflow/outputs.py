"""Models with several outputs: their losses, loss weights and metrics, as Keras compiles them.

`OutputLoss` is what `PipelineModel.compile` makes of `loss` and `loss_weights` for such a
model, and `OutputMetrics` of `metrics`. They follow `keras.Model.compile` (Keras 3.15):

- `loss` is one loss for every output, a list of one loss (or None) per output, or a dict
  of them by output name (every output named); `loss_weights` a list or dict of numbers per
  output, or one number with a single loss. The loss trained on is the sum over the outputs
  of `weight * loss`.
- `metrics` is a list of one entry per output, or a dict by output name (some outputs may be
  left out); an entry is a metric, a list of metrics, or None.
- "accuracy" / "acc" (metrics) and "crossentropy" / "ce" (losses) become the binary,
  sparse categorical or categorical kind that fits the labels' and outputs' shapes, so
  both are resolved again for the first labels seen (`OutputLoss.build`).
- Logs name each output's metrics `<output>_<metric>`, and, when more than one output has a
  loss, its unweighted loss `<output>_loss`; Keras averages those per-output losses over
  batches with equal weight (its batch size is unknown when it traces), and so does
  `OutputMetrics`. `evaluate` lists its results in Keras' order.

Output names are `model.output_names`, or the keys of a model whose outputs are a dict; the
order of outputs (of labels passed as a list, of `predict`'s arrays) is `model.outputs`'.
"""

import copy as _copy

import keras
import tensorflow as tf

# Keras has no public API for how `compile` resolves a loss or metric identifier for one
# output (the shape-dependent "accuracy" and "crossentropy" included); these two functions
# are that rule, and the only private Keras names this module uses.
from keras.src.trainers.compile_utils import get_loss as _keras_get_loss
from keras.src.trainers.compile_utils import get_metric as _keras_get_metric

from tf_spectrain.partition.model_structure import output_structure
from tf_spectrain.workflow import sample_weights


def is_multi_output(model):
    """Whether `model` has more than one output tensor."""
    return len(model.outputs) > 1


def output_names(model):
    """The names of `model`'s outputs in logs and in dicts by output name.

    Args:
        model: a Keras model with several outputs (a flat list or dict of them).

    Returns:
        A list of names in the order of `model.outputs`: the dict's keys (sorted, as Keras
        flattens a dict) for dict outputs, else `model.output_names`.

    Raises:
        ValueError: for nested outputs (a list inside the list of outputs, say).
    """
    structure = output_structure(model)  # a Sequential has no `model.output`
    if isinstance(structure, dict):
        names = sorted(structure)
    else:
        names = list(model.output_names)
    if not isinstance(structure, (list, tuple, dict)) or len(structure) != len(model.outputs):
        raise ValueError(
            f"Model '{model.name}' has nested outputs; a pipeline takes a model whose "
            "outputs are one tensor, a flat list or a flat dict of tensors. Received: "
            f"outputs {tf.nest.map_structure(lambda _: 'X', structure)}"
        )
    return names


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(names):
    return f"{len(names)} outputs {names}"


def _check_keys(argument, value, names, model_name, every=False):
    """Refuses a dict with a key that is not an output name (or, with `every`, missing one)."""
    unknown = [k for k in value if k not in names]
    missing = [n for n in names if n not in value] if every else []
    if unknown or missing:
        need = "exactly the" if every else "among the"
        extra = f"; unknown: {unknown}" if unknown else ""
        extra += f"; missing: {missing}" if missing else ""
        raise ValueError(
            f"`{argument}` is a dict, so its keys must be {need} names of the outputs of "
            f"model '{model_name}' {names}. Received keys: {list(value)}{extra}"
        )


def _per_output(argument, value, names, model_name):
    """A list or dict of `argument` (a full list, or a dict naming every output) per output."""
    if isinstance(value, dict):
        _check_keys(argument, value, names, model_name, every=True)
        return [value[n] for n in names]
    if len(value) != len(names):
        raise ValueError(
            f"`{argument}` is a {type(value).__name__} of {len(value)} items, but model "
            f"'{model_name}' has {_describe(names)}: pass one per output, in that order, or a "
            f"dict by output name. Received: {argument}={value!r}"
        )
    return list(value)


def _shapes_for(labels, outputs):
    """Label shapes to resolve identifiers with: the labels', else the outputs' own."""
    if labels is None:
        return list(outputs)
    return [o if tf.TensorShape(y.shape).rank is None else y for y, o in zip(labels, outputs)]


class OutputLoss:
    """The compiled loss of a model with several outputs: `sum_k weight_k * loss_k`.

    Called as a loss, `loss(y_true, y_pred)`, on the labels and the outputs (lists in output
    order), it returns the weighted sum as a float32 scalar. It creates no variables, so the
    last stage may call it inside its `tf.function`s (forward and recomputed backward).

    Args:
        model: the wrapped Keras model (several outputs).
        loss: one loss for every output; a list or tuple of one loss (or None) per output;
            or a dict naming every output. A loss is a `keras.losses.Loss`, a loss function
            or a name.
        loss_weights: None, a list or dict of numbers per output, or (with one loss) a
            number for every output.

    Attributes:
        names: the output names, in output order. `outputs`: the model's output tensors.
        label_shapes: the shapes of the labels `build` saw (None before).
        losses: each output's resolved `keras.losses.Loss`, or None.
        weights: each output's weight, or None (not multiplied).
        log_names: the names of the per-output loss logs, `<output>_loss` for each output
            with a loss, or `[]` when only one output has a loss (Keras logs none then).

    Raises:
        ValueError: for a list of the wrong length, a dict that does not name every output
            (or names another), no loss for any output, weights that do not fit, or a
            loss Keras cannot resolve.
    """

    def __init__(self, model, loss, loss_weights=None):
        self.names = output_names(model)
        self.model_name = model.name
        self.outputs = list(model.outputs)
        self.label_shapes = None  # set by `build`
        single = not isinstance(loss, (list, tuple, dict))
        if single:
            if loss is None:
                raise ValueError(
                    "`loss` is required: pass a Keras loss for every output, a list of one "
                    "per output or a dict by output name. Received: loss=None"
                )
            self._identifiers = [loss] * len(self.names)
        else:
            self._identifiers = _per_output("loss", loss, self.names, model.name)
            nested = [x for x in self._identifiers if isinstance(x, (list, tuple, dict))]
            if nested:
                raise ValueError(
                    "Each entry of `loss` must be one Keras loss (or None for an output "
                    f"without a loss). Received: {nested[0]!r} in loss={loss!r}"
                )
            if all(x is None for x in self._identifiers):
                raise ValueError(
                    f"`loss` gives no output of model '{model.name}' a loss; at least one "
                    f"of {self.names} needs one. Received: loss={loss!r}"
                )
        self.weights = self._resolve_weights(loss_weights, single)
        self.losses = self.losses_for(None)  # resolved again by `build` for real labels
        self.built = False

    def _resolve_weights(self, loss_weights, single):
        if loss_weights is None:
            return [None] * len(self.names)
        if _is_number(loss_weights):
            if not single:
                raise ValueError(
                    "`loss_weights` must give one weight per output (a list, or a dict by "
                    f"output name) when `loss` gives one loss per output. Received: "
                    f"loss_weights={loss_weights!r}"
                )
            return [float(loss_weights)] * len(self.names)
        if single:
            raise ValueError(
                "With one `loss` for every output, `loss_weights` must be one number (it "
                "weights every output); pass a list or dict of losses to weight the outputs "
                f"differently, as Keras requires. Received: loss_weights={loss_weights!r}"
            )
        if isinstance(loss_weights, dict):
            _check_keys("loss_weights", loss_weights, self.names, self.model_name)
            weights = [loss_weights.get(n) for n in self.names]
            missing = [n for n, w, x in zip(self.names, weights, self._identifiers)
                       if w is None and x is not None]
            if missing:
                raise ValueError(
                    f"`loss_weights` has no weight for the outputs {missing}, which have a "
                    f"loss. Received: loss_weights={loss_weights!r}"
                )
        elif isinstance(loss_weights, (list, tuple)):
            weights = _per_output("loss_weights", loss_weights, self.names, self.model_name)
        else:
            raise TypeError(
                "`loss_weights` must be a list or dict of numbers per output (or one number "
                f"with one loss). Received: loss_weights={loss_weights!r} of type "
                f"{type(loss_weights).__name__}"
            )
        for n, w in zip(self.names, weights):
            if w is not None and not _is_number(w):
                raise TypeError(
                    f"`loss_weights` must hold numbers. Received: {w!r} for output '{n}' in "
                    f"loss_weights={loss_weights!r}"
                )
        return [None if w is None else float(w) for w in weights]

    def losses_for(self, labels):
        """Resolves each output's loss for labels of these shapes (nothing is kept).

        Args:
            labels: one array or TensorSpec per output (their shapes matter), or None to
                use the outputs' shapes.

        Returns:
            A list of `keras.losses.Loss` (or None) per output.

        Raises:
            ValueError: for a loss Keras cannot resolve.
        """
        resolved = []
        for name, identifier, y, out in zip(
            self.names, self._identifiers, _shapes_for(labels, self.outputs), self.outputs
        ):
            try:
                resolved.append(_keras_get_loss(identifier, y, out))
            except (ValueError, TypeError) as e:
                raise ValueError(
                    f"`loss` for output '{name}' is not a Keras loss. Received: "
                    f"{identifier!r} ({e})"
                ) from None
        return resolved

    def build(self, labels):
        """Resolves the losses for the first labels seen (later calls do nothing).

        Args:
            labels: one array or TensorSpec per output, in output order.
        """
        if not self.built:
            self.losses = self.losses_for(labels)
            self.label_shapes = [tf.TensorShape(y.shape) for y in labels]
            self.built = True

    @property
    def log_names(self):
        """`<output>_loss` per output with a loss, or `[]` when only one has a loss."""
        names = [f"{n}_loss" for n, fn in zip(self.names, self.losses) if fn is not None]
        return names if len(names) > 1 else []

    def output_values(self, y_true, y_pred, sample_weight=None):
        """The float32 loss of each output that has a loss (not multiplied by its
        `loss_weights` entry, weighted by `sample_weight` as in `__call__`), in output order."""
        dtype = keras.backend.floatx()
        return [
            tf.cast(_weighted_call(fn, y_t, y_p, w), dtype)
            for fn, y_t, y_p, w in zip(
                self.losses, y_true, y_pred, _per_output_weights(sample_weight, self.names))
            if fn is not None
        ]

    def __call__(self, y_true, y_pred, sample_weight=None):
        """The weighted sum of the outputs' losses, as `keras.Model.compile`'s loss computes it.

        Args:
            y_true: the labels, one tensor per output in output order.
            y_pred: the outputs, likewise.
            sample_weight: None, one weight per example for every output, or a list of
                one such tensor (or None) per output, as Keras takes them.

        Returns:
            A float32 scalar tensor.
        """
        total = None
        for fn, weight, y_t, y_p, w in zip(self.losses, self.weights, y_true, y_pred,
                                           _per_output_weights(sample_weight, self.names)):
            if fn is None:
                continue
            value = tf.cast(_weighted_call(fn, y_t, y_p, w), keras.backend.floatx())
            if weight is not None:
                value = value * weight
            total = value if total is None else total + value
        return total


def _per_output_weights(sample_weight, names):
    """Sample weights per output: a list or tuple as given, one tensor for every output."""
    if isinstance(sample_weight, (list, tuple)):
        return list(sample_weight)
    return [sample_weight] * len(names)


def _weighted_call(fn, y_true, y_pred, sample_weight):
    """`fn(y_true, y_pred)`, weighted by `sample_weight` unless it is None."""
    if sample_weight is None:
        return fn(y_true, y_pred)
    return fn(y_true, y_pred, sample_weight=sample_weight)


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
            _check_keys(argument, metrics, names, self.loss.model_name)
            return [_as_entries(metrics.get(n)) for n in names]
        if isinstance(metrics, (list, tuple)) and len(metrics) == len(names):
            return [_as_entries(m) for m in metrics]
        raise ValueError(
            f"`{argument}` of model '{self.loss.model_name}' with {_describe(names)} must be "
            "a list of one entry per output (a metric, a list of metrics or None), or a "
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
                zip(self.loss.names, identifiers, _shapes_for(labels, outputs), outputs)
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
            per_output = _per_output_weights(weights, self.loss.names)
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
