"""Keras' record of a functional graph, read and replayed.

Keras keeps the graph on the tensors themselves (`KerasTensor._keras_history` names the
call that produced a tensor, `Operation._inbound_nodes` lists an operation's calls, a
Sequential's `_functional` its graph). This module is the only place in the package that
reads those attributes: `tf_spectrain.partition.graph` and `tf_spectrain.partition.nested`
read and rebuild models through it. Walks start from a model's outputs and stop at its
inputs, so calls that are not part of the model (for instance those that Keras adds when a
sub-model is built from intermediate tensors, or those of the flat graph of a model
nesting this one) are ignored.
"""

import keras


def one_or_list(xs):
    """`xs[0]` if `xs` has one item, else `list(xs)` (Keras takes one tensor or a list)."""
    return xs[0] if len(xs) == 1 else list(xs)


def model_parts(model):
    """The model's flat inputs and outputs and its operations in topological order."""
    if isinstance(model, keras.Sequential):
        try:
            inputs, outputs = model.inputs, model.outputs
        except (AttributeError, ValueError) as e:
            raise ValueError(
                f"Sequential model '{model.name}' is not built, so it has no graph to "
                "split yet. Start it with a keras.Input(shape) or call "
                "model.build(input_shape) first."
            ) from e
        # Its graph lists the operations Keras adds beside the layers (a mask's not_equal).
        functional = getattr(model, "_functional", None)  # noqa: SLF001 - no public one
        order = functional.operations if functional is not None else model.layers
        return list(inputs), list(outputs), list(order)
    if not hasattr(model, "operations") or getattr(model, "inputs", None) is None:
        raise ValueError(
            f"Model '{model.name}' of type {type(model).__name__} has no functional "
            "graph (a subclassed model defines its computation in `call()`), so it cannot "
            "be cut into stages. Build it with the functional API "
            "(keras.Model(inputs, outputs)) or as a keras.Sequential."
        )
    return list(model.inputs), list(model.outputs), list(model.operations)


def calls_by_operation(inputs, outputs):
    """Maps id(operation) to the list of its nodes reachable from `outputs`."""
    # The walk stops at the model's inputs, so it collects exactly the calls of the model.
    input_ids = {id(t) for t in inputs}
    calls_of = {}
    seen = set()
    stack = list(outputs)
    while stack:
        tensor = stack.pop()
        if id(tensor) in input_ids:
            continue
        op, node_index, _ = tensor._keras_history  # noqa: SLF001 - no public accessor
        node = op._inbound_nodes[node_index]  # noqa: SLF001 - Keras 3 has no public one
        if id(node) in seen:
            continue
        seen.add(id(node))
        calls_of.setdefault(id(op), []).append(node)
        stack.extend(node.input_tensors)
    return calls_of


def input_layer_names(inputs):
    """The names of the input layers that produced the model inputs `inputs`."""
    # Keras 3 has no public accessor for a KerasTensor's producer (here and below).
    return [t._keras_history.operation.name for t in inputs]  # noqa: SLF001


def new_input(tensor, is_model_input):
    """A new `keras.Input` like `tensor`, named as Keras' own sub-model copies name it."""
    op = tensor._keras_history.operation  # noqa: SLF001
    optional = isinstance(op, keras.layers.InputLayer) and op.optional
    return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype, sparse=tensor.sparse,
                       name=tensor.name if is_model_input else f"{tensor.name}CLONE",
                       optional=optional)


def nodes_between(inputs, outputs, name):
    """The calls that compute `outputs` from `inputs`, each after the calls it needs."""
    stop = {id(t) for t in inputs}
    order, done = [], set()
    stack = [(t, False) for t in reversed(list(outputs))]
    while stack:
        tensor, ready = stack.pop()
        if id(tensor) in stop:
            continue
        op, node_index, _ = tensor._keras_history  # noqa: SLF001
        node = op._inbound_nodes[node_index]  # noqa: SLF001
        if id(node) in done:
            continue
        if ready:
            done.add(id(node))
            order.append(node)
            continue
        if isinstance(op, keras.layers.InputLayer):
            raise ValueError(
                f"Sub-model '{name}' needs the model input '{op.name}', which is not among "
                "its inputs."
            )
        stack.append((tensor, True))
        stack.extend((t, False) for t in reversed(node.input_tensors))
    return order


def call_again(node, tensors, **kwargs):
    """Calls `node`'s operation again on `tensors[id(t)]` for its inputs `t`; maps its outputs."""
    args, recorded = node.arguments.fill_in(tensors)
    produced = keras.tree.flatten(node.operation(*args, **{**recorded, **kwargs}))
    for old, new in zip(node.outputs, produced, strict=True):
        tensors[id(old)] = new

