"""Read a Keras model's functional graph as a chain of operations and their tensors.

A functional (or built Sequential) Keras model is a DAG of operation calls. Partitioning
needs it as a *sequence*: the operations in topological order (`model.operations` for a
functional model, `model.layers` for a Sequential one), each with the tensors it consumes
and produces. A cut after position `p` splits the sequence in two, and the tensors that
**cross** it are those produced at or before `p` (model inputs count as produced before
everything, at position -1) and consumed after `p`, or returned by the model.

Nested models (a functional model or built Sequential used as a layer) are flattened into
their layers first (`tf_spectrain.partition.nested`), so a cut may name a layer inside
them. Keras' record of the graph is read through `tf_spectrain.partition.keras_nodes`.
"""

import keras

from tf_spectrain.partition.keras_nodes import (
    call_again,
    calls_by_operation,
    input_layer_names,
    model_parts,
    new_input,
    nodes_between,
    one_or_list,
)
from tf_spectrain.partition.nested import flat_model, shared_call_error


class OpCall:
    """One operation call of the model: the operation with its input and output tensors.

    Attributes:
        operation: the `keras.Operation` (usually a `keras.layers.Layer`).
        inputs: tuple of the `KerasTensor`s the call consumed.
        outputs: tuple of the `KerasTensor`s it produced.
        args, kwargs: the arguments of the call as Keras recorded them (tensors and other
            values, in their structures); what the layer takes at run time besides them,
            such as a Keras mask it reads from an input tensor, is not among them.
    """

    def __init__(self, operation, inputs, outputs, args=(), kwargs=None):
        self.operation = operation
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})

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
            Nested models are flattened: their layers are calls of the graph.
        input_layer_names: names of the model's input layers (these cannot end a stage).
        nested_models: dict from the name of each flattened nested model (at any depth)
            to the names of its layers, in the order they were flattened; empty if the
            model nests none.
    """

    def __init__(self, model, inputs, outputs, calls, input_layer_names, nested_models=None):
        self.model = model
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.calls = tuple(calls)
        self.input_layer_names = tuple(input_layer_names)
        self.nested_models = dict(nested_models or {})
        self._tensors, self._produced, self._last_use = _index_tensors(self)

    @property
    def names(self):
        """Names of the operations, in order (the valid names for a cut)."""
        return [call.name for call in self.calls]

    def produced_at(self, tensor):
        """The index into `calls` of the call that produced `tensor` (-1 for a model input).

        Raises KeyError if `tensor` is not a tensor of this graph."""
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

    def sub_model(self, inputs, outputs, name):
        """Builds a functional model from tensors of this graph, leaving the graph intact.

        The sub-model shares the graph's layers and variables. When `inputs` are all
        model inputs, or none is, it is `keras.Model(inputs, outputs)`. When they mix
        model inputs with inner tensors, Keras would keep the model inputs as they are
        but point their history at its copy of the graph, after which `model.save()` of
        the original model fails ("could not find node key"); such a sub-model is built
        instead by calling the layers between `inputs` and `outputs` again, with the
        arguments of their recorded calls, on a new `keras.Input` per input (named as
        Keras names them: a model input keeps its name, an inner tensor gets
        `"<name>CLONE"`), so the model and the sub-model both still save.

        Args:
            inputs: list of tensors of the graph (model inputs or outputs of its calls).
            outputs: list of tensors computed from `inputs` by calls of the graph, or by
                layers newly called on such tensors.
            name: the sub-model's name.

        Returns:
            A functional `keras.Model`; one input (output) is a tensor, several a list.

        Raises:
            ValueError: if an output needs a model input that is not among `inputs`.
        """
        model_inputs = {id(t) for t in self.inputs}
        if len({id(t) in model_inputs for t in inputs}) < 2:
            return keras.Model(one_or_list(list(inputs)), one_or_list(list(outputs)), name=name)
        tensors = {id(t): new_input(t, id(t) in model_inputs) for t in inputs}
        fresh = [tensors[id(t)] for t in inputs]
        for node in nodes_between(inputs, outputs, name):
            call_again(node, tensors)
        return keras.Model(one_or_list(fresh), one_or_list([tensors[id(t)] for t in outputs]),
                           name=name)


def read_graph(model):
    """Reads the functional graph of `model`, nested models flattened into their layers.

    Args:
        model: a functional `keras.Model` or a built `keras.Sequential`. Functional models
            and built Sequentials used as its layers are flattened, recursively (see the
            module docstring).

    Returns:
        A `ModelGraph`. Its `model` is `model`; its calls are those of the flat graph.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: if the model has no functional graph (a subclassed model or an
            unbuilt Sequential) or calls a layer more than once (shared layers), also
            once nested models are flattened (a nested model called twice, or a layer
            used both inside and outside a nested model); if two of the flattened
            layers have the same name; or if a nested model is called with arguments
            the flat graph cannot reproduce (a `mask`, extra call arguments, inputs
            that are not tensors of the model).
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras.Model (functional or Sequential). "
            f"Received: model={model!r} of type {type(model).__name__}"
        )
    flat, nested_models = flat_model(model)
    inputs, outputs, order = model_parts(flat)
    calls_of = calls_by_operation(inputs, outputs)
    calls = []
    for op in order:
        nodes = calls_of.pop(id(op), [])
        if not nodes:  # an input layer
            continue
        if len(nodes) > 1:
            raise shared_call_error(op, len(nodes), model.name)
        node = nodes[0]
        arguments = node.arguments
        calls.append(
            OpCall(op, node.input_tensors, node.outputs, arguments.args, arguments.kwargs)
        )
    if calls_of:  # Should not happen: Keras' order must list every operation.
        raise ValueError(
            f"Could not order the operations of model '{model.name}': some are missing "
            "from its operation list."
        )
    names = input_layer_names(inputs)
    return ModelGraph(model, inputs, outputs, calls, names, nested_models)


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
