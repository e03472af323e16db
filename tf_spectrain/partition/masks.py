"""Keras masks at pipeline cuts: find the cuts that would lose one, so they can be refused.

Keras hands a mask (made by `Embedding(mask_zero=True)` or `Masking`, passed on by layers
such as `Dense` or `Dropout`) to a layer in one of two ways. Either the graph records it
as an argument of the call (`LSTM(4)(x)` and `GlobalAveragePooling1D()(x)` record
`mask=`; so does any explicit `mask=`): then it is a tensor of the graph, and it crosses
a cut like any other. Or the layer reads it from its input tensor at run time: a layer
called with several tensors or with keyword arguments (`MultiHeadAttention()(q, v)`
reads the masks of both), `MultiHeadAttention` its query's mask in any case, `Minimum`,
`Maximum` and `Multiply` their inputs' masks, and the loss and metrics the mask of the
model's output. A stage receives its inputs as plain tensors, without the masks Keras
attached to them, so a mask read the second way is lost at a cut in front of the reader,
and the stages would compute something else than the model, silently.

`find_mask_loss` walks from a cut through the layers after it: a tensor whose mask is
lost passes the loss on through layers that only pass masks on (their outputs lose
theirs too), stops at layers that get their mask as a recorded argument or ignore masks
(`supports_masking` False, as in the whole model), and is a loss at a layer that would
read it, or at a model output. `check_masks` refuses such cuts; `positions_keeping_masks`
lists the others (`cuts_keeping_masks` by name). This module is the only place in the
package that reads Keras' `_keras_mask` attribute.
"""

import dataclasses
import inspect

import keras

from tf_spectrain.partition.graph import read_graph

# Layers that read their inputs' masks in `call`, not only to set their output's mask.
_READ_IN_CALL = (keras.layers.Minimum, keras.layers.Maximum, keras.layers.Multiply)

_IGNORES, _TAKES, _PASSES, _READS = "ignores", "takes", "passes", "reads"


@dataclasses.dataclass(frozen=True)
class MaskLoss:
    """A Keras mask that a cut would lose.

    Attributes:
        position: the cut's position (it follows `graph.calls[position]`).
        tensor: the tensor crossing the cut whose mask would be lost.
        reader: the `OpCall` that would read the lost mask, or None when the loss and
            metrics would (the mask of a model output).
    """

    position: int
    tensor: object
    reader: object


def mask_of(tensor):
    """The Keras mask attached to a symbolic tensor of the graph, or None."""
    return getattr(tensor, "_keras_mask", None)  # Keras 3 has no public accessor


def has_masks(graph):
    """Whether any tensor of `graph` (a `ModelGraph`) carries a Keras mask."""
    return any(mask_of(t) is not None for call in graph.calls for t in call.outputs)


def find_mask_loss(graph, position):
    """Finds the first Keras mask that a cut after `position` would lose.

    Args:
        graph: a `ModelGraph` from `read_graph`.
        position: the cut's position, an int in `[0, len(graph.calls) - 1)`.

    Returns:
        A `MaskLoss`, or None if the cut keeps every mask (always for a model without
        masks).
    """
    lost = {id(t): t for t in graph.crossing(position) if mask_of(t) is not None}
    source = dict(lost)  # id(tensor whose mask is lost) -> the crossing tensor it came from
    for call in graph.calls[position + 1 :] if lost else ():
        hit = [t for t in call.inputs if id(t) in lost]
        if not hit:
            continue
        use = _mask_use(call, {id(t) for t in hit})
        if use == _READS:
            return MaskLoss(position, source[id(hit[0])], call)
        if use == _PASSES:
            for out in call.outputs:
                if mask_of(out) is not None:
                    lost[id(out)] = out
                    source[id(out)] = source[id(hit[0])]
    for out in graph.outputs:
        if id(out) in lost:
            return MaskLoss(position, source[id(out)], None)
    return None


def positions_keeping_masks(graph):
    """The positions after which a cut keeps every Keras mask.

    Args:
        graph: a `ModelGraph` from `read_graph`.

    Returns:
        A sorted list of positions in `[0, len(graph.calls) - 1)`: all of them for a
        model without masks.
    """
    positions = range(len(graph.calls) - 1)
    if not has_masks(graph):
        return list(positions)
    return [p for p in positions if find_mask_loss(graph, p) is None]


def cuts_keeping_masks(model):
    """The names of the layers after which a cut keeps every Keras mask of `model`, in order.

    Raises TypeError or ValueError if the model cannot be split (see `read_graph`)."""
    graph = read_graph(model)
    return [graph.names[p] for p in positions_keeping_masks(graph)]


def check_masks(graph, cuts, positions):
    """Refuses cuts that would lose a Keras mask (see the module docstring).

    Args:
        graph: a `ModelGraph` from `read_graph`.
        cuts: the cut layer names, as the user gave them (for the message).
        positions: their positions in `graph.calls`.

    Raises:
        ValueError: for the first cut that would lose a mask; the message names the cut,
            the masked tensor and what reads its mask, and lists cuts that keep every
            mask.
    """
    if not positions or not has_masks(graph):
        return
    for name, position in zip(cuts, positions):
        loss = find_mask_loss(graph, position)
        if loss is not None:
            raise ValueError(_message(graph, cuts, name, loss))


def _mask_use(call, lost_ids):
    """How `call` treats the masks of its inputs `lost_ids` (one of the four verdicts)."""
    op = call.operation
    if not isinstance(op, keras.layers.Layer):
        return _IGNORES  # a Keras operation (`keras.ops.*`) neither reads nor passes masks
    signature = inspect.signature(op.call)
    parameters = signature.parameters
    if any(n == "mask" or n.endswith("_mask") for n in parameters):
        bound = _bind(signature, call)
        if bound is None:
            return _READS
        if "mask" in parameters:  # one mask argument, Keras' `mask=`
            return _TAKES if _given(bound.get("mask")) else _READS
        for name, value in bound.items():  # a `<name>_mask` per tensor argument
            if not any(id(t) in lost_ids for t in _tensors(value)):
                continue
            if isinstance(op, keras.layers.MultiHeadAttention) and name == "query":
                return _READS  # it reads the query's mask from the tensor, never `query_mask`
            if not _given(bound.get(f"{name}_mask")):
                return _READS
        return _TAKES
    if not op.supports_masking:
        return _IGNORES  # Keras drops the mask here in the whole model too
    if isinstance(op, _READ_IN_CALL):
        return _READS
    return _PASSES


def _bind(signature, call):
    """The call's recorded arguments by parameter name, or None if they do not bind."""
    parameters = signature.parameters
    open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    kwargs = {k: v for k, v in call.kwargs.items() if open_kwargs or k in parameters}
    try:
        return signature.bind(*call.args, **kwargs).arguments
    except TypeError:
        return None


def _tensors(value):
    return [v for v in keras.tree.flatten(value) if isinstance(v, keras.KerasTensor)]


def _given(value):
    return any(v is not None for v in keras.tree.flatten(value))


def _message(graph, cuts, name, loss):
    """The error for a cut that would lose a mask: what is lost, who reads it, where to cut."""
    producer = graph.produced_at(loss.tensor)
    what = (
        f"the output of layer '{graph.calls[producer].name}'"
        if producer >= 0
        else f"model input '{loss.tensor.name}'"
    )
    if loss.reader is None:
        reader = "the loss and metrics read from the model's output"
        fix = ""
    else:
        layer = f"'{loss.reader.name}' ({type(loss.reader.operation).__name__})"
        reader = f"layer {layer} reads from the tensor itself"
        fix = (
            f"; or pass the mask to {layer} as an argument (`mask=`, `value_mask=`, ...): "
            "an argument crosses a cut as a tensor"
        )
    keeping = [graph.names[p] for p in positions_keeping_masks(graph)]
    shown = keeping if len(keeping) <= 8 else keeping[:8] + [f"... ({len(keeping) - 8} more)"]
    return (
        f"`cuts` must not cut a Keras mask off from its reader, but the cut after '{name}' "
        f"does: {what} carries a mask (from `mask_zero=True`, a `Masking` layer or a layer "
        f"passing one on) that {reader}, and a mask attached to a tensor does not cross a "
        f"cut. Cut where every mask is kept, after one of {shown}{fix}. "
        f"Received: cuts={list(cuts)}"
    )
