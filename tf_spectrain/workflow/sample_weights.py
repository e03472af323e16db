"""Sample weights inside the pipeline: labels that carry their examples' weights.

Keras weights each example's loss by `fit(sample_weight=...)`, by `class_weight` (turned into
sample weights), or by the third part of a dataset's `(x, y, sample_weight)` batches, and
updates the `weighted_metrics` of `compile` with the same weights (the other metrics ignore
them). A mini-batch's labels travel to the last stage as one nest, split with it into
micro-batches and replicas; with weights, that nest is `{LABELS: y, WEIGHTS: w}` (`pack`),
which the loss (`loss_value`) and the metrics (`unpack`) take apart again. Without weights
the labels are left as they are, so nothing else changes.

The loss is Keras' own with its `sample_weight` argument: with the default reduction a
mini-batch's loss is `sum(w * loss) / examples`, so micro-batches and replicas, which weigh
their parts by their share of the examples, give Keras' loss of the whole batch.
"""

LABELS = "tf_spectrain_labels"
WEIGHTS = "tf_spectrain_sample_weight"
WEIGHTED = "_tf_spectrain_weighted"  # set on a metric object that `weighted_metrics` made


def pack(y, sample_weight):
    """The labels a mini-batch carries: `y`, or `{LABELS: y, WEIGHTS: sample_weight}`."""
    if sample_weight is None:
        return y
    return {LABELS: y, WEIGHTS: sample_weight}


def unpack(labels):
    """`(y, sample_weight)` from labels that `pack` made (`sample_weight` None if none)."""
    if isinstance(labels, dict) and set(labels) == {LABELS, WEIGHTS}:
        return labels[LABELS], labels[WEIGHTS]
    return labels, None


def loss_value(loss, labels, outputs):
    """The compiled `loss` of `outputs`, weighted by the weights `labels` carry (if any)."""
    y, weights = unpack(labels)
    if weights is None:
        return loss(y, outputs)
    return loss(y, outputs, sample_weight=weights)


def mark_weighted(metric):
    """Marks `metric` as one of `weighted_metrics` (it is updated with the sample weights)."""
    setattr(metric, WEIGHTED, True)
    return metric


def is_weighted(metric):
    """Whether `metric` was made from `compile`'s `weighted_metrics`."""
    return getattr(metric, WEIGHTED, False)


def fresh_metric(metric):
    """A copy of a compiled metric with fresh state (from its config), weighted if it is."""
    copy = metric.__class__.from_config(metric.get_config())
    return mark_weighted(copy) if is_weighted(metric) else copy


def update_metric(metric, y, predictions, sample_weight):
    """Updates `metric` as Keras does: a weighted metric with the weights, others without."""
    if sample_weight is not None and is_weighted(metric):
        metric.update_state(y, predictions, sample_weight=sample_weight)
    else:
        metric.update_state(y, predictions)
