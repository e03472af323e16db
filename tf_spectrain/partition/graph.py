"""Read a Keras model's functional graph as a chain of operations and their tensors.

A functional (or built Sequential) Keras model is a DAG of operation calls. Partitioning
needs it as a *sequence*: the operations in topological order (`model.operations` for a
functional model, `model.layers` for a Sequential one), each with the tensors it consumes
and produces. A cut after position `p` splits the sequence in two, and the tensors that
**cross** it are those produced at or before `p` (model inputs count as produced before
everything, at position -1) and consumed after `p`, or returned by the model.

**Nested models.** A functional model or built Sequential used as a layer of the model
(the transfer-learning shape `keras.Model(inputs, head(base(inputs)))`) is not one
operation of the chain: it is flattened into its own layers, recursively, so a cut may fall
inside it and names one of its layers (`block_3_add`, not the nested model's name). The
flat graph is a functional model with the same inputs and name, made by calling the SAME
layer objects again (variables are shared, nothing is copied), each with the arguments of
its call inside the nested model; the nested model's inputs stand for the tensors it was
called on and its outputs for what that call returned. It is built once per model and
cached. It computes what the nested model computes in every call with an explicit
`training` flag (`training=True` or `False`, as the pipeline calls its stages). As in
Keras 3 (`Functional.call` passes its own `training` on to every inner call), an explicit
`training` of the outer call overrides the one a nested model was called with:
`base(x, training=False)` inside a model called with `training=True` runs in training mode,
unless its layers are frozen (`base.trainable = False`: BatchNormalization then uses its
moving statistics). Models without nested models are read as they are. A model whose
`call` is overridden (a subclassed model) stays one operation.

Keras keeps the graph on the tensors themselves (`KerasTensor._keras_history` names the
call that produced a tensor, `Operation._inbound_nodes` lists an operation's calls). This
module is the only place in the package that reads those attributes. It walks back from
the model's outputs, so calls that are not part of this model (for instance those that
Keras adds when a sub-model is built from intermediate tensors, or those of the flat graph
of a model nesting this one) are ignored.
"""

import inspect
import weakref

import keras
from keras.src.models.functional import Functional


def one_or_list(xs):
    """Returns the only item of `xs`, or `xs` as a list when it has several (or none).

    Args:
        xs: a list or tuple.

    Returns:
        `xs[0]` if `len(xs) == 1`, else `list(xs)`.
    """
    return xs[0] if len(xs) == 1 else list(xs)


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
        tensors = {id(t): _new_input(t, id(t) in model_inputs) for t in inputs}
        fresh = [tensors[id(t)] for t in inputs]
        for node in _nodes_between(inputs, outputs, name):
            _call_again(node, tensors)
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
    flat, nested_models = _flat_model(model)
    inputs, outputs, order = _model_parts(flat)
    calls_of = _calls_by_operation(inputs, outputs)
    calls = []
    for op in order:
        nodes = calls_of.pop(id(op), [])
        if not nodes:  # an input layer
            continue
        if len(nodes) > 1:
            raise _shared_error(op, len(nodes), model.name)
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
    names = _input_layer_names(inputs)
    return ModelGraph(model, inputs, outputs, calls, names, nested_models)


def _input_layer_names(inputs):
    # Keras 3 has no public accessor for a KerasTensor's producer (here and below).
    return [t._keras_history.operation.name for t in inputs]  # noqa: SLF001


def _shared_error(op, count, where):
    if _is_graph_model(op):
        return ValueError(
            f"Model '{op.name}' is called {count} times in model '{where}' (a nested "
            "model with shared weights). Splitting a model into stages flattens nested "
            "models into their layers, and needs every layer to be called once: call "
            "the nested model once, or give each call its own copy "
            "(keras.models.clone_model)."
        )
    return ValueError(
        f"Layer '{op.name}' is called {count} times in model '{where}' (a shared "
        "layer). Splitting a model into stages needs every layer to be called once: "
        "give each call its own layer."
    )


# --- flattening nested models -------------------------------------------------------------

# Each model's flat graph, built once: calling the layers again adds nodes to them, so a
# graph built at every `read_graph` would pile up. Weak keys: the flat model holds the
# layers and tensors but not the model, so the entry goes with the model.
_FLAT_MODELS = weakref.WeakKeyDictionary()

# The `call`s that run a model's own graph: a model with any other `call` is a leaf.
_GRAPH_CALLS = (Functional.call, keras.Sequential.call)


def runs_its_graph(model):
    """Whether `model`'s `call` runs a graph of layers: a functional model or a Sequential
    (built or not), not a subclassed model that overrides `call`."""
    return isinstance(model, keras.Model) and type(model).call in _GRAPH_CALLS


def _is_graph_model(op):
    """Whether `op` is a model whose call runs its functional graph (so it can be flattened)."""
    if not runs_its_graph(op):
        return False
    try:
        return bool(op.inputs) and bool(op.outputs)
    except (AttributeError, ValueError):  # an unbuilt Sequential
        return False


def _flat_model(model):
    """`(model, {})` if `model` nests no model, else its (cached) flat functional model
    and `{nested model name: its layer names}`."""
    inputs, outputs, order = _model_parts(model)
    if not any(_is_graph_model(op) for op in order):
        return model, {}
    cached = _FLAT_MODELS.get(model)
    if cached is None:
        steps = _flat_steps(model, inputs, outputs)
        nested = {}
        for step in steps:
            if isinstance(step, _Call):
                for name in step.owner[1:]:
                    nested.setdefault(name, []).append(step.operation.name)
        cached = (_build_flat(model, inputs, outputs, steps), nested)
        _FLAT_MODELS[model] = cached
    return cached


class _Call:
    """A leaf call to repeat in the flat graph, with the `training` that overrides its own."""

    def __init__(self, operation, node, training, owner):
        self.operation = operation
        self.node = node
        self.training = training
        self.owner = owner  # names of the models it belongs to, e.g. ("outer", "base")


class _Alias:
    """In the flat graph, tensor `dst` (of a nested model) is tensor `src`."""

    def __init__(self, dst, src):
        self.dst = dst
        self.src = src


def _flat_steps(model, inputs, outputs):
    """The `_Call`s and `_Alias`es that rebuild `model` flat, in order, all checked.

    Everything is checked before anything is built, so a refused model gets no new nodes.
    """
    steps = []
    _plan_model(model, inputs, outputs, (model.name,), None, steps)
    calls = [s for s in steps if isinstance(s, _Call)]
    owners = {}
    for call in calls:
        owners.setdefault(call.operation.name, []).append(call)
    for name in _input_layer_names(inputs):
        if name in owners:
            raise ValueError(
                f"Layer name '{name}' is used by the input layer of model '{model.name}' and "
                f"by a layer of its nested model '{_path(owners[name][0].owner)}'. A cut names a "
                "layer, so once nested models are flattened every name must be unique: "
                "rename one of them (pass `name=` when you create it)."
            )
    for name, same in owners.items():
        if len(same) == 1:
            continue
        where = ", ".join(f"'{_path(c.owner)}'" for c in same)
        if all(c.operation is same[0].operation for c in same):
            raise ValueError(
                f"Layer '{name}' is called {len(same)} times in model '{model.name}' once "
                f"its nested models are flattened (in {where}): a layer shared between "
                "models. Splitting a model into stages needs every layer to be called "
                "once: give each call its own layer."
            )
        raise ValueError(
            f"Layer name '{name}' is used by {len(same)} different layers once the nested "
            f"models of model '{model.name}' are flattened (in {where}). A cut names a "
            "layer, so every name must be unique: rename the layers (pass `name=` when "
            "you create them), or for two copies of one architecture build each with its "
            "own names."
        )
    return steps


def _plan_model(model, inputs, outputs, path, training, steps):
    """Appends the steps of one (possibly nested) model's graph; returns its outputs.

    `training` is the flag of the outermost enclosing nested call that has one (or None):
    Keras' `Functional.call` passes it on to every call inside, overriding their own.
    """
    calls_of = _calls_by_operation(inputs, outputs)
    for op in _model_parts(model)[2]:
        nodes = calls_of.pop(id(op), [])
        if not nodes:  # an input layer
            continue
        if len(nodes) > 1:
            raise _shared_error(op, len(nodes), _path(path))
        node = nodes[0]
        if not _is_graph_model(op):
            steps.append(_Call(op, node, training, path))
            continue
        own_training, outer_inputs = _nested_arguments(op, node, _path(path))
        steps.extend(_Alias(inner, outer) for inner, outer in zip(op.inputs, outer_inputs))
        inner_training = own_training if training is None else training
        inner_outputs = _plan_model(
            op, list(op.inputs), list(op.outputs), (*path, op.name), inner_training, steps
        )
        if len(inner_outputs) != len(node.outputs):  # Should not happen.
            raise ValueError(
                f"Nested model '{op.name}' in '{_path(path)}' returned {len(node.outputs)} tensors "
                f"but has {len(inner_outputs)} outputs, so it cannot be flattened."
            )
        steps.extend(_Alias(o, i) for o, i in zip(node.outputs, inner_outputs))
    if calls_of:  # Should not happen: Keras' order must list every operation.
        raise ValueError(
            f"Could not order the operations of model '{_path(path)}': some are missing "
            "from its operation list."
        )
    return list(outputs)


def _path(names):
    """`("outer", "base")` -> `"outer/base"`, for messages."""
    return "/".join(names)


def _nested_arguments(op, node, path):
    """The `training` flag and the flat input tensors of a nested model's call."""
    args, kwargs = node.arguments.args, node.arguments.kwargs
    bound = inspect.signature(op.call).bind(*args, **kwargs).arguments
    # Keras fills in `mask` from the inputs' masks, a structure of None for unmasked ones.
    extra = {k: v for k, v in bound.pop("kwargs", {}).items() if _given(v)}
    mask = bound.pop("mask", None)
    if _given(mask) or extra:
        what = "`mask`" if _given(mask) else f"the arguments {sorted(extra)}"
        raise ValueError(
            f"Nested model '{op.name}' in model '{path}' is called with {what}, which "
            "splitting a model into stages cannot reproduce once it flattens the nested "
            "model into its layers. Call the nested model with its inputs (and "
            "`training=`) only, or build the model without nesting."
        )
    value = bound["inputs"]
    if isinstance(value, dict) and not isinstance(op.input, dict):
        names = [t.name for t in op.inputs]
        value = [value.get(n) for n in names]  # Keras matches them by input name
    flat = keras.tree.flatten(value)
    if len(flat) != len(op.inputs) or not all(
        any(t is k for k in node.input_tensors) for t in flat
    ):
        raise ValueError(
            f"Nested model '{op.name}' in model '{path}' must be called on tensors of the "
            f"model, one per input ({len(op.inputs)}), to be flattened into its layers. "
            f"Received: {value!r}"
        )
    return bound.get("training"), flat


def _given(value):
    """Whether a call argument holds anything but None (in any nested structure)."""
    return any(v is not None for v in keras.tree.flatten(value))


def _new_input(tensor, is_model_input):
    """A new `keras.Input` like `tensor`, named as Keras' own sub-model copies name it."""
    op = tensor._keras_history.operation  # noqa: SLF001
    optional = isinstance(op, keras.layers.InputLayer) and op.optional
    return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype, sparse=tensor.sparse,
                       name=tensor.name if is_model_input else f"{tensor.name}CLONE",
                       optional=optional)


def _nodes_between(inputs, outputs, name):
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


def _call_again(node, tensors, **kwargs):
    """Calls `node`'s operation again on `tensors[id(t)]` for its inputs `t`; maps its outputs."""
    args, recorded = node.arguments.fill_in(tensors)
    produced = keras.tree.flatten(node.operation(*args, **{**recorded, **kwargs}))
    for old, new in zip(node.outputs, produced, strict=True):
        tensors[id(old)] = new


def _build_flat(model, inputs, outputs, steps):
    """Calls the leaf layers again on the flat tensors; returns the flat functional model."""
    flat = {id(t): t for t in inputs}  # id(tensor of some model) -> tensor of the flat graph
    for step in steps:
        if isinstance(step, _Alias):
            flat[id(step.dst)] = flat[id(step.src)]
            continue
        if step.training is not None and isinstance(step.operation, keras.layers.Layer):
            _call_again(step.node, flat, training=step.training)  # as Functional.call does
        else:
            _call_again(step.node, flat)
    flat_outputs = [flat[id(t)] for t in outputs]
    return keras.Model(one_or_list(list(inputs)), one_or_list(flat_outputs), name=model.name)


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
