"""Models with several outputs: their losses, loss weights and metrics, as Keras compiles them.

`OutputLoss` (here) is what `PipelineModel.compile` makes of `loss` and `loss_weights` for
such a model, and `OutputMetrics` (`tf_spectrain.workflow.output_metrics`) of `metrics`.
They follow `keras.Model.compile` (Keras 3.15):

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

import keras
import tensorflow as tf

# Keras has no public API for how `compile` resolves a loss or metric identifier for one
# output (the shape-dependent "accuracy" and "crossentropy" included); these two functions
# are that rule (`get_metric` in `tf_spectrain.workflow.output_metrics`).
from keras.src.trainers.compile_utils import get_loss as _keras_get_loss

from tf_spectrain.partition.model_structure import output_structure


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
    """Whether `value` is an int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def describe_outputs(names):
    """`"<n> outputs [names]"`, for messages."""
    return f"{len(names)} outputs {names}"


def check_keys(argument, value, names, model_name, every=False):
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
        check_keys(argument, value, names, model_name, every=True)
        return [value[n] for n in names]
    if len(value) != len(names):
        raise ValueError(
            f"`{argument}` is a {type(value).__name__} of {len(value)} items, but model "
            f"'{model_name}' has {describe_outputs(names)}: pass one per output, in that "
            f"order, or a dict by output name. Received: {argument}={value!r}"
        )
    return list(value)


def shapes_for(labels, outputs):
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
            check_keys("loss_weights", loss_weights, self.names, self.model_name)
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
            self.names, self._identifiers, shapes_for(labels, self.outputs), self.outputs
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
                self.losses, y_true, y_pred, per_output_weights(sample_weight, self.names))
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
                                           per_output_weights(sample_weight, self.names)):
            if fn is None:
                continue
            value = tf.cast(_weighted_call(fn, y_t, y_p, w), keras.backend.floatx())
            if weight is not None:
                value = value * weight
            total = value if total is None else total + value
        return total


def per_output_weights(sample_weight, names):
    """Sample weights per output: a list or tuple as given, one tensor for every output."""
    if isinstance(sample_weight, (list, tuple)):
        return list(sample_weight)
    return [sample_weight] * len(names)


def _weighted_call(fn, y_true, y_pred, sample_weight):
    """`fn(y_true, y_pred)`, weighted by `sample_weight` unless it is None."""
    if sample_weight is None:
        return fn(y_true, y_pred)
    return fn(y_true, y_pred, sample_weight=sample_weight)
