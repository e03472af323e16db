"""Nested models flattened into their layers, so a cut may fall inside them.

A functional model or built Sequential used as a layer of the model (the
transfer-learning shape `keras.Model(inputs, head(base(inputs)))`) is not one operation of
the chain `tf_spectrain.partition.graph` reads: it is flattened into its own layers,
recursively, so a cut may fall inside it and names one of its layers (`block_3_add`, not
the nested model's name). The flat graph is a functional model with the same inputs and
name, made by calling the SAME layer objects again (variables are shared, nothing is
copied), each with the arguments of its call inside the nested model; the nested model's
inputs stand for the tensors it was called on and its outputs for what that call returned.
It is built once per model and cached. It computes what the nested model computes in every
call with an explicit `training` flag (`training=True` or `False`, as the pipeline calls
its stages). As in Keras 3 (`Functional.call` passes its own `training` on to every inner
call), an explicit `training` of the outer call overrides the one a nested model was
called with: `base(x, training=False)` inside a model called with `training=True` runs in
training mode, unless its layers are frozen (`base.trainable = False`: BatchNormalization
then uses its moving statistics). Models without nested models are read as they are. A
model whose `call` is overridden (a subclassed model) stays one operation.
"""

import inspect
import weakref

import keras
from keras.src.models.functional import Functional

from tf_spectrain.partition.keras_nodes import (
    call_again,
    calls_by_operation,
    input_layer_names,
    model_parts,
    one_or_list,
)

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


def shared_call_error(op, count, where):
    """The error for `op` called `count` times in model `where` (shared layer or model)."""
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


def flat_model(model):
    """`(model, {})` if `model` nests no model, else its (cached) flat functional model
    and `{nested model name: its layer names}`."""
    inputs, outputs, order = model_parts(model)
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
    for name in input_layer_names(inputs):
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
    calls_of = calls_by_operation(inputs, outputs)
    for op in model_parts(model)[2]:
        nodes = calls_of.pop(id(op), [])
        if not nodes:  # an input layer
            continue
        if len(nodes) > 1:
            raise shared_call_error(op, len(nodes), _path(path))
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


def _build_flat(model, inputs, outputs, steps):
    """Calls the leaf layers again on the flat tensors; returns the flat functional model."""
    flat = {id(t): t for t in inputs}  # id(tensor of some model) -> tensor of the flat graph
    for step in steps:
        if isinstance(step, _Alias):
            flat[id(step.dst)] = flat[id(step.src)]
            continue
        if step.training is not None and isinstance(step.operation, keras.layers.Layer):
            call_again(step.node, flat, training=step.training)  # as Functional.call does
        else:
            call_again(step.node, flat)
    flat_outputs = [flat[id(t)] for t in outputs]
    return keras.Model(one_or_list(list(inputs)), one_or_list(flat_outputs), name=model.name)

