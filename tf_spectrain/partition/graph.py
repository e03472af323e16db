"""Read a Keras model's functional graph as a chain of operations and their tensors.

A functional (or built Sequential) Keras model is a DAG of operation calls. Partitioning
needs it as a *sequence*: the operations in topological order (`model.operations` for a
functional model, `model.layers` for a Sequential one), each with the tensors it consumes
and produces. A cut after position `p` splits the sequence in two, and the tensors that
**cross** it are those produced at or before `p` (model inputs count as produced before
everything, at position -1) and consumed after `p`, or returned by the model.

Keras keeps the graph on the tensors themselves (`KerasTensor._keras_history` names the
call that produced a tensor, `Operation._inbound_nodes` lists an operation's calls). This
module is the only place in the package that reads those attributes. It walks back from
the model's outputs, so calls that are not part of this model (for instance those that
Keras adds when a sub-model is built from intermediate tensors) are ignored.
"""

import keras


class OpCall:
    """One operation call of the model: the operation with its input and output tensors.

    Attributes:
        operation: the `keras.Operation` (usually a `keras.layers.Layer`).
        inputs: tuple of the `KerasTensor`s the call consumed.
        outputs: tuple of the `KerasTensor`s it produced.
    """

    def __init__(self, operation, inputs, outputs):
        self.operation = operation
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)

    @property
    def name(self):
        """The operation's name."""
        return self.operation.name

    def count_params(self):
        """Number of weights of the operation (0 for weightless operations)."""
        if isinstance(self.operation, keras.layers.Layer) and self.operation.built:
            return int(self.operation.count_params())
        return 0


class ModelGraph:
    """A functional model seen as a chain of operation calls in topological order.

    Build it with `read_graph(model)`.

    Attributes:
        model: the model that was read.
        inputs: tuple of the model's input tensors (flattened).
        outputs: tuple of the model's output tensors (flattened).
        calls: tuple of `OpCall`, in topological order; input layers are not included.
        input_layer_names: names of the model's input layers (these cannot end a stage).
    """

    def __init__(self, model, inputs, outputs, calls, input_layer_names):
        self.model = model
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.calls = tuple(calls)
        self.input_layer_names = tuple(input_layer_names)
        self._tensors, self._produced, self._last_use = _index_tensors(self)

    @property
    def names(self):
        """Names of the operations, in order (the valid names for a cut)."""
        return [call.name for call in self.calls]

    def produced_at(self, tensor):
        """Gives the position of the call that produced `tensor`.

        Args:
            tensor: a tensor of the graph (an input, or an output of one of its calls).

        Returns:
            The index into `calls`, or -1 for a model input.

        Raises:
            KeyError: if `tensor` is not a tensor of this graph.
        """
        return self._produced[id(tensor)]

    def crossing(self, position):
        """Tensors crossing a cut after `position`, in a deterministic order.

        Args:
            position: int in `[-1, len(calls) - 1]`; -1 is the cut before every call.

        Returns:
            A list of `KerasTensor`s produced at or before `position` and consumed after
            it or returned by the model, ordered by the position that produced them (model
            inputs first, in `model.inputs` order), then by output index.
        """
        return [
            t
            for t in self._tensors
            if self._produced[id(t)] <= position < self._last_use[id(t)]
        ]


def read_graph(model):
    """Reads the functional graph of `model`.

    Args:
        model: a functional `keras.Model` or a built `keras.Sequential`.

    Returns:
        A `ModelGraph`.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: if the model has no functional graph (a subclassed model or an
            unbuilt Sequential) or calls a layer more than once (shared layers).
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras.Model (functional or Sequential). "
            f"Received: model={model!r} of type {type(model).__name__}"
        )
    inputs, outputs, order = _model_parts(model)
    calls_of = _calls_by_operation(inputs, outputs)
    calls = []
    for op in order:
        nodes = calls_of.pop(id(op), [])
        if not nodes:  # an input layer
            continue
        if len(nodes) > 1:
            raise ValueError(
                f"Layer '{op.name}' is called {len(nodes)} times in model "
                f"'{model.name}' (a shared layer). Splitting a model into stages needs "
                "every layer to be called once: give each call its own layer."
            )
        node = nodes[0]
        calls.append(OpCall(op, node.input_tensors, node.outputs))
    if calls_of:  # Should not happen: Keras' order must list every operation.
        raise ValueError(
            f"Could not order the operations of model '{model.name}': some are missing "
            "from its operation list."
        )
    # Keras 3 has no public accessor for a KerasTensor's producer (here and below).
    input_layer_names = [t._keras_history.operation.name for t in inputs]  # noqa: SLF001
    return ModelGraph(model, inputs, outputs, calls, input_layer_names)


def _model_parts(model):
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
        return list(inputs), list(outputs), list(model.layers)
    if not hasattr(model, "operations") or getattr(model, "inputs", None) is None:
        raise ValueError(
            f"Model '{model.name}' of type {type(model).__name__} has no functional "
            "graph (a subclassed model defines its computation in `call()`), so it cannot "
            "be cut into stages. Build it with the functional API "
            "(keras.Model(inputs, outputs)) or as a keras.Sequential."
        )
    return list(model.inputs), list(model.outputs), list(model.operations)


def _calls_by_operation(inputs, outputs):
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


def _index_tensors(graph):
    """All tensors in production order, with their producer and last-consumer positions."""
    # Model outputs get `len(calls)` as last use, so they cross every cut after they exist.
    tensors, produced, last_use = [], {}, {}

    def add(tensor, position):
        if id(tensor) not in produced:
            tensors.append(tensor)
            produced[id(tensor)] = position
            last_use[id(tensor)] = position  # not consumed (yet)

    for t in graph.inputs:
        add(t, -1)
    for position, call in enumerate(graph.calls):
        for t in call.inputs:
            last_use[id(t)] = max(last_use[id(t)], position)
        for t in call.outputs:
            add(t, position)
    for t in graph.outputs:
        last_use[id(t)] = len(graph.calls)
    return tensors, produced, last_use
