"""Copy a Keras layer without its config: for layers that cannot be rebuilt from one.

`keras.models.clone_model` re-creates each layer with `cls.from_config(layer.get_config())`.
That fails for many layers users write: an `__init__(self, maxlen, vocab_size, embed_dim)`
that does not take the `name`/`trainable`/`dtype` Keras' automatic config adds, a layer
given another layer or an array in `__init__` (Keras then has no automatic config), a
subclassed model used as a layer. `copy_layer` copies such a layer object instead: its
attributes deep-copied, sublayers and their variables included, so the copy computes
what the layer computes and owns new variables, created on the device in scope (a
`tf.Variable` copies itself there) and independent of the original's.

What is *not* copied is the layer's place in the model's graph: the calls (Keras
`Node`s) that connect the layer to the layers around it are left out, so the copy can be
called afresh (as `clone_model` does) without dragging the whole model along. The graphs
of functional models inside the layer (a `keras.Sequential` sublayer) are kept, with
their own calls.

Keras objects the layer holds (sublayers, metrics: `KerasSaveable`s, which `copy.deepcopy`
would pickle through Keras' saving, that is through their configs) are copied attribute by
attribute like the layer; Python modules it refers to (a seed generator's backend) are
shared, not copied. This module reads Keras internals (`KerasSaveable`,
`Operation._inbound_nodes` / `_outbound_nodes`, `Function._nodes_by_depth`, a layer's
attribute tracker and Keras' `DotNotTrackScope`): Keras 3 has no public API to copy a
layer object.
"""

import copy
import sys

import keras
from keras.src.ops.function import Function
from keras.src.saving.keras_saveable import KerasSaveable
from keras.src.utils.tracking import DotNotTrackScope

_NODE_LISTS = ("_inbound_nodes", "_outbound_nodes")
# The losses of the layer's last call (`add_loss`): tensors of that call's graph, which
# cannot be copied and which Keras clears at the next call.
_CALL_LOSSES = {"_losses": list, "_loss_ids": set}


def copy_layer(layer):
    """A copy of `layer` with new variables (on the device in scope) and no graph calls.

    Args:
        layer: a `keras.layers.Layer` (or `keras.Model`), built or not.

    Returns:
        A layer of the same class, with the same attributes, sublayers and weights; its
        variables are new ones created under the current `tf.device` scope, and it has
        not been called in any graph (its sublayers keep the graphs they run inside).

    Raises:
        TypeError: if `layer` is not a Keras layer.
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            f"`layer` must be a keras.layers.Layer. Received: layer={layer!r} of type "
            f"{type(layer).__name__}"
        )
    objects = _keras_objects_within(layer)
    internal = {
        id(node)
        for op in objects
        if isinstance(op, Function)
        for nodes in op._nodes_by_depth.values()  # noqa: SLF001
        for node in nodes
    }
    memo = {id(m): m for m in list(sys.modules.values())}  # modules are not copied
    for obj in objects:
        memo[id(obj)] = object.__new__(type(obj))
        for attr in _NODE_LISTS:
            nodes = vars(obj).get(attr)
            # A call of the graph around the layer, not of a graph inside it: left out.
            if nodes is not None and not all(id(n) in internal for n in nodes):
                memo[id(nodes)] = []
        for attr, empty in _CALL_LOSSES.items():
            if attr in vars(obj):
                memo[id(vars(obj)[attr])] = empty()
    # Rebuilding Keras' tracked lists would re-track their items into half-copied stores.
    with DotNotTrackScope():
        for obj in objects:
            vars(memo[id(obj)]).update(copy.deepcopy(vars(obj), memo))
    for obj in objects:
        _refresh_tracker(memo[id(obj)])
    return memo[id(layer)]


def _keras_objects_within(layer):
    """`layer` and every Keras object it holds, each once, `layer` first: its sublayers at
    any depth, the operations of functional graphs among them, their metrics and the like
    (Keras objects, which `copy.deepcopy` would pickle through Keras' saving)."""
    found = {}
    pending = [layer]
    while pending:
        value = pending.pop()
        if isinstance(value, KerasSaveable):
            if id(value) in found:
                continue
            found[id(value)] = value
            pending.extend(v for k, v in vars(value).items() if k not in _NODE_LISTS)
            if isinstance(value, Function):
                pending.extend(value.operations)
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending.extend(value)
    return list(found.values())


def _refresh_tracker(op):
    """Points a copied layer's attribute tracker at the copied objects it holds."""
    tracker = getattr(op, "_tracker", None)
    if tracker is None:
        return
    # The tracker finds what it already holds by id(); the copy's items are new objects.
    tracker.stored_ids = {
        name: {id(value) for value in store} for name, (_, store) in tracker.config.items()
    }
