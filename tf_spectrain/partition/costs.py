"""Per-layer costs that `default_cuts` balances: parameter counts or a compute estimate.

`"params"` balances the weights (memory, and the optimizer's work); `"macs"` balances
compute, counted in multiply-accumulates per example. The two differ a lot for
convolutional models, whose early layers have few weights but most of the compute.
"""

import math

import keras

from tf_spectrain import checks
from tf_spectrain.partition.graph import read_graph

COSTS = ("params", "macs")


def layer_costs(model, cost="params"):
    """Returns the cost of every layer of `model`, in topological order.

    `"macs"` counts, per example, `outputs * fan_in` multiply-accumulates for a
    convolution or a dense layer, 4 operations per output element for BatchNorm and 1
    for any other layer (activations, pooling, additions).

    Args:
        model: a functional `keras.Model` or a built `keras.Sequential`.
        cost: one of `COSTS`: `"params"` (each layer's parameter count) or `"macs"`.

    Returns:
        A dict from layer name to cost (a non-negative int), in the model's topological
        order, input layers left out: the layers a cut may name.

    Raises:
        TypeError: if `model` is not a Keras model.
        ValueError: if `cost` is not one of `COSTS`, or the model has no functional
            graph (see `split_model`).
    """
    checks.check_one_of("cost", cost, COSTS)
    graph = read_graph(model)
    return dict(zip(graph.names, graph_costs(graph, cost), strict=True))


def graph_costs(graph, cost):
    """Computes the costs of a `ModelGraph`'s calls (see `layer_costs` for what they count).

    Args:
        graph: a `ModelGraph`, from `read_graph`.
        cost: "params" or "macs" (not checked here: anything else counts MACs).

    Returns:
        A list of non-negative ints, one per call, in call order.
    """
    if cost == "params":
        return [call.count_params() for call in graph.calls]
    return [_macs(call) for call in graph.calls]


def _size(shape):
    """Elements per example of a tensor shape `(batch, ...)`."""
    return math.prod(int(d) for d in shape[1:])


def _macs(call):
    """The multiply-accumulate estimate of one call, per example."""
    op = call.operation
    out = sum(_size(t.shape) for t in call.outputs)
    if isinstance(op, keras.layers.Conv2D):
        return out * op.kernel_size[0] * op.kernel_size[1] * int(call.inputs[0].shape[-1])
    if isinstance(op, keras.layers.Dense):
        return out * int(call.inputs[0].shape[-1])
    if isinstance(op, keras.layers.BatchNormalization):
        return 4 * out
    return out
