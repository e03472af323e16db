"""Resolving `compile` arguments the way `keras.Model.compile` does: loss, metrics, optimizer."""

import warnings

import keras

from tf_spectrain import messages
from tf_spectrain.workflow import sample_weights

_ACCURACY = ("accuracy", "acc")


def resolve_loss(loss):
    """Resolves a Keras loss identifier to a callable loss `loss(y_true, y_pred) -> scalar`.

    A `keras.losses.Loss` is used as it is; a per-example loss function (or a name such as
    "mse") is wrapped to average over the batch, as `keras.Model.compile` does.

    Args:
        loss: a Keras loss instance, loss function or name.

    Returns:
        A `keras.losses.Loss`.

    Raises:
        ValueError: if `loss` is None or Keras cannot resolve it.
    """
    if loss is None:
        raise ValueError(
            "`loss` is required: pass a Keras loss or its name, e.g. "
            "loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True). Received: loss=None"
        )
    try:
        resolved = keras.losses.get(loss)
    except (ValueError, TypeError) as e:
        raise ValueError(f"`loss` is not a Keras loss. Received: loss={loss!r} ({e})") from None
    if isinstance(resolved, keras.losses.Loss):
        return resolved
    # A name such as "mse" resolves to a function giving one loss per example; Keras'
    # compile wraps it to average over the batch, and so does the pipeline.
    name = getattr(resolved, "__name__", None) or str(loss)
    try:  # Keras' own wrapper also matches the ranks of labels and predictions
        from keras.src.losses.losses import LossFunctionWrapper
    except ImportError:  # pragma: no cover - a Keras without it
        return _BatchMean(resolved, name=name)
    return LossFunctionWrapper(resolved, name=name)


class _BatchMean(keras.losses.Loss):
    """A per-example loss function as a Keras `Loss` (mean over the batch)."""

    def __init__(self, fn, name):
        super().__init__(name=name)
        self.fn = fn

    def call(self, y_true, y_pred):
        """The per-example losses of the wrapped function (`Loss` averages them)."""
        return self.fn(y_true, y_pred)


def _accuracy_for(loss):
    name = getattr(loss, "name", None) or getattr(loss, "__name__", "") or ""
    name = name.lower()
    if "sparse" in name:
        return keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    if "binary" in name:
        return keras.metrics.BinaryAccuracy(name="accuracy")
    if "categorical" in name:
        return keras.metrics.CategoricalAccuracy(name="accuracy")
    return keras.metrics.SparseCategoricalAccuracy(name="accuracy")


def resolve_metrics(metrics, loss, argument="metrics"):
    """Resolves `compile`'s `metrics` argument to a list of fresh Keras metric objects.

    "accuracy" / "acc" become the accuracy that fits the loss (sparse categorical for a
    sparse categorical cross-entropy, and so on), as in `keras.Model.compile`; metric
    functions are wrapped in a `keras.metrics.MeanMetricWrapper`.

    Args:
        metrics: None, or a list or tuple of Keras metrics, metric functions or names.
        loss: the resolved loss (its name picks the accuracy metric).
        argument: how messages call `metrics` (`"weighted_metrics"` for those).

    Returns:
        A list of `keras.metrics.Metric` objects (empty for None).

    Raises:
        TypeError: if `metrics` is not None, a list or a tuple.
        ValueError: if an entry is not a Keras metric or a metric name.
    """
    if metrics is None:
        return []
    if not isinstance(metrics, (list, tuple)):
        raise TypeError(
            f"`{argument}` must be a list of Keras metrics or their names. "
            f"Received: {argument}={metrics!r}"
        )
    resolved = []
    for m in metrics:
        if isinstance(m, str) and m in _ACCURACY:
            resolved.append(_accuracy_for(loss))
            continue
        try:
            metric = None if m is None else keras.metrics.get(m)
        except (ValueError, TypeError):
            metric = None
        if metric is None or not callable(metric):
            raise ValueError(
                f"`{argument}` must hold Keras metrics or their names, such as 'accuracy' or "
                f"keras.metrics.AUC(). Received: metric {m!r} in {argument}={list(metrics)!r}"
            )
        if not isinstance(metric, keras.metrics.Metric):
            metric = keras.metrics.MeanMetricWrapper(metric, name=getattr(m, "__name__", str(m)))
        resolved.append(metric)
    return resolved


def resolve_weighted_metrics(weighted_metrics, metrics, loss):
    """Resolves `compile`'s `weighted_metrics` (one output), named as Keras logs them.

    Each becomes a metric updated with the sample weights (`sample_weights.is_weighted`);
    one whose name a metric of `metrics` already has is renamed `weighted_<name>`, as
    Keras names its log.

    Args:
        weighted_metrics: None, or a list of Keras metrics, metric functions or names.
        metrics: the resolved `metrics` (their names are taken).
        loss: the resolved loss.

    Returns:
        A list of Keras metrics.

    Raises:
        TypeError, ValueError: as `resolve_metrics`.
    """
    taken = {m.name for m in metrics}
    resolved = []
    for metric in resolve_metrics(weighted_metrics, loss, argument="weighted_metrics"):
        if metric.name in taken:
            metric.name = f"weighted_{metric.name}"  # a fresh object, made by resolve_metrics
        taken.add(metric.name)
        resolved.append(sample_weights.mark_weighted(metric))
    return resolved


def resolve_optimizer(optimizer):
    """Resolves a Keras optimizer from an instance or a name.

    Args:
        optimizer: a Keras optimizer instance, or a name Keras knows (e.g. "sgd").

    Returns:
        A Keras optimizer.

    Raises:
        ValueError: if `optimizer` is None or Keras cannot resolve it.
    """
    if optimizer is None:
        raise ValueError(
            "`optimizer` is required, e.g. optimizer=tf_spectrain.SpecTrainSGD("
            "learning_rate=0.01, momentum=0.9). Received: optimizer=None"
        )
    try:
        return keras.optimizers.get(optimizer)
    except (ValueError, TypeError):
        raise ValueError(
            "`optimizer` must be a Keras optimizer instance or name, such as "
            "keras.optimizers.AdamW(1e-3), 'adamw', 'sgd' or "
            "tf_spectrain.SpecTrainSGD(0.01, momentum=0.9). "
            f"Received: optimizer={optimizer!r}"
        ) from None


def check_clipping(optimizer, mode):
    """Refuses `global_clipnorm` outside sync mode, saying why and what to use instead.

    Args:
        optimizer: the resolved optimizer.
        mode: the pipeline's mode.

    Raises:
        ValueError: `global_clipnorm` with an asynchronous mode.
    """
    if optimizer.global_clipnorm and mode != "sync":
        raise ValueError(
            f"`global_clipnorm` clips the gradient of the whole model by its norm, but in "
            f"mode={mode!r} there is no such gradient: each stage updates at its own time, "
            "from gradients of different mini-batches. Use `clipnorm` (each variable's "
            "gradient clipped to that norm) or `clipvalue`, which work in every mode, or "
            f"mode='sync'. Received: global_clipnorm={optimizer.global_clipnorm}, "
            f"mode={mode!r}"
        )


def warn_graph_options(run_eagerly):
    """Warns what `compile`'s `run_eagerly=True` does and does not do."""
    if run_eagerly not in (False, None):
        warnings.warn(
            f"`run_eagerly={run_eagerly!r}`: the pipeline runs pass by pass, each pass its own "
            "call from its stage's thread (slower; an error names its stage, pass and "
            "mini-batch), but each pass still runs as a TensorFlow graph function, so "
            "Python inside a layer's `call` runs only while it is traced.",
            stacklevel=messages.user_stacklevel())


def warn_layers_without_xla(model, jit_compile):
    """Warns, for `jit_compile=True`, naming the layers that say XLA cannot compile them
    (`supports_jit = False`): Keras then trains the whole model without XLA, and so do the
    stages."""
    if jit_compile is not True:
        return
    layers = [layer.name for layer in model._flatten_layers()  # noqa: SLF001 (as Keras)
              if not getattr(layer, "supports_jit", True)]
    if layers:
        warnings.warn(
            f"`jit_compile=True`: layers {layers} do not support XLA (`supports_jit` is "
            "False), so, as in Keras, no stage is compiled with XLA. Remove them, or pass "
            "`jit_compile=False` (or \"auto\") to silence this warning.",
            stacklevel=messages.user_stacklevel())
