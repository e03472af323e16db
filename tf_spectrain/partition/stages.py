"""Cut a functional Keras model into stage sub-models, and describe the stages.

Stage `k` runs the layers after cut `k - 1` up to and including cut `k`. Its inputs are
the tensors crossing cut `k - 1` (stage 0: the model's inputs) and its outputs are the
tensors crossing cut `k` (last stage: the model's outputs), so feeding each stage's
outputs to the next reproduces the whole model. A tensor produced before stage `k` and
needed after it (a long skip connection) is both an input and an output of stage `k`: it
*passes through*, via a `keras.layers.Identity` (Keras cannot return an input unchanged).

The stage models are built from the original model's tensors (`ModelGraph.sub_model`), so
they share its layers and variables: splitting copies no weights, training a stage trains
the model, and the model still saves. A model that nests other models (a
`keras.applications` backbone under a new head, say) is cut in its flat graph
(`graph.read_graph`): the stages are built from the tensors of that graph, whose layers are
the nested models' own.
"""

import dataclasses

import keras

from tf_spectrain.partition.cuts import resolve_cuts
from tf_spectrain.partition.graph import read_graph
from tf_spectrain.partition.masks import check_masks


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """What one stage holds and what crosses its boundaries.

    Attributes:
        index: the stage index `k`.
        layer_names: names of the stage's layers, in model order.
        input_shapes: shapes of the tensors the stage receives (batch dimension `None`),
            in the order the stage model takes them.
        output_shapes: shapes of the tensors the stage sends on, in output order.
        num_pass_through: how many of the outputs only pass through the stage.
        num_params: the stage's parameter count (all weights of its layers).
    """

    index: int
    layer_names: tuple
    input_shapes: tuple
    output_shapes: tuple
    num_pass_through: int
    num_params: int

    @property
    def num_inputs(self):
        """Number of tensors the stage receives."""
        return len(self.input_shapes)

    @property
    def num_outputs(self):
        """Number of tensors the stage sends on."""
        return len(self.output_shapes)

    def to_dict(self):
        """The spec as a plain dict (JSON-friendly), including the tensor counts."""
        spec = dataclasses.asdict(self)
        spec["layer_names"] = list(self.layer_names)
        spec["input_shapes"] = [list(s) for s in self.input_shapes]
        spec["output_shapes"] = [list(s) for s in self.output_shapes]
        spec["num_inputs"] = self.num_inputs
        spec["num_outputs"] = self.num_outputs
        return spec


class _Stage:
    """Where stage `index` starts and ends and which tensors it takes and sends on."""

    def __init__(self, graph, index, start, end, inputs, outputs):
        self.index = index
        self.calls = graph.calls[start : end + 1]
        self.inputs = inputs
        self.outputs = outputs
        self.passing = [graph.produced_at(t) < start for t in outputs]


def _plan_stages(model, cuts, keep_masks=True):
    """Reads the model, checks `cuts` (and that they keep Keras masks) and lays out every stage."""
    graph = read_graph(model)
    positions = resolve_cuts(graph, cuts)
    if keep_masks:
        check_masks(graph, cuts, positions)
    last = len(graph.calls) - 1
    bounds = [-1] + positions + [last]
    stages = []
    for k in range(len(bounds) - 1):
        inputs = list(graph.inputs) if k == 0 else graph.crossing(bounds[k])
        is_last = k == len(bounds) - 2
        outputs = list(graph.outputs) if is_last else graph.crossing(bounds[k + 1])
        stages.append(_Stage(graph, k, bounds[k] + 1, bounds[k + 1], inputs, outputs))
    return graph, stages


def split_model(model, cuts, keep_masks=True):
    """Cuts a functional or Sequential Keras model into pipeline stages.

    Each name in `cuts` ends a stage, so there are `len(cuts) + 1` stages. Stage `k` is
    a functional `keras.Model` whose inputs are the tensors crossing cut `k - 1` (stage 0:
    the model's inputs) and whose outputs are the tensors crossing cut `k` (last stage:
    the model's outputs, flattened). A tensor crosses a cut if it is produced at or before
    the cut layer, in topological order (`model.operations`; `model.layers` for a
    Sequential), and used after it or returned by the model. Crossing tensors are ordered
    by the layer that produced them (model inputs first). A stage with one input takes a
    tensor and a stage with one output returns a tensor; otherwise lists.

    The stages share the model's layers and variables (nothing is copied), and
    `stages[k](...)` chained from stage 0 to the last reproduces `model(x)`.

    Nested models (a functional model or built Sequential used as a layer, such as a
    `keras.applications` backbone under a new head) are flattened into their layers,
    recursively, so a cut may fall inside them: `cuts` name the nested layers (for
    example `"block_3_add"` of a MobileNetV2 base), not the nested model, and the
    topological order is that of the flat graph (as if the model had been built without
    nesting). Its layers are the nested model's own, so training the stages trains it
    too. The flat graph computes what the model computes when called with an explicit
    `training=True` or `training=False` (see `tf_spectrain.partition.graph`).

    Keras masks (`mask_zero=True`, `Masking`) cross a cut when the graph records them as
    arguments of the layers that use them (`LSTM(4)(x)` records `mask=`), as tensors.
    A mask that a layer after the cut (or the loss, on a model output) would read from
    its input tensor itself is not handed on with the tensor, so such cuts are refused
    (`tf_spectrain.partition.masks`), with the cuts that keep every mask.

    Args:
        model: a functional `keras.Model` or a built `keras.Sequential`, with every
            layer called once (no shared layers, no nested model called twice) and,
            once nested models are flattened, distinct layer names.
        cuts: list of layer names, in model order; each ends a stage.
        keep_masks: True (the default) refuses cuts that would lose a Keras mask; False
            allows them, for timing layers one by one (`costmodel.profile_model`): the
            stages then compute without the lost masks.

    Returns:
        A list of `len(cuts) + 1` `keras.Model`s, named `f"{model.name}_stage{k}"`.

    Raises:
        TypeError: if `model` is not a Keras model or `cuts` is not a list of strings.
        ValueError: if the model has no functional graph, has shared layers (or a
            nested model called more than once), two flattened layers with one name or
            a nested model called with a `mask`, or a cut is not a layer of the model
            (a nested model's own name is not: name one of its layers), is repeated, out
            of order, leaves a stage empty or (with `keep_masks`) would lose a Keras mask.
    """
    graph, stages = _plan_stages(model, cuts, keep_masks)
    taken = set(graph.names) | set(graph.input_layer_names)
    return [_build_stage(graph, model.name, stage, taken) for stage in stages]


def describe_stages(model, cuts):
    """Describes the stages `split_model(model, cuts)` would make, without building them.

    Args:
        model: a functional `keras.Model` or a built `keras.Sequential`.
        cuts: list of layer names, in model order; each ends a stage.

    Returns:
        A list of `StageSpec`, one per stage.

    Raises:
        TypeError, ValueError: as `split_model`.
    """
    _, stages = _plan_stages(model, cuts)
    return [
        StageSpec(
            index=stage.index,
            layer_names=tuple(call.name for call in stage.calls),
            input_shapes=tuple(tuple(t.shape) for t in stage.inputs),
            output_shapes=tuple(tuple(t.shape) for t in stage.outputs),
            num_pass_through=len({id(t) for t, p in zip(stage.outputs, stage.passing) if p}),
            num_params=sum(call.count_params() for call in stage.calls),
        )
        for stage in stages
    ]


def _build_stage(graph, model_name, stage, taken):
    """The functional sub-model of one stage, sharing the model's layers."""
    name = f"{model_name}_stage{stage.index}"
    passed = {}  # id(tensor) -> its Identity output, so a repeated output stays one tensor
    outputs = []
    for tensor, passing in zip(stage.outputs, stage.passing):
        if passing:
            if id(tensor) not in passed:
                layer_name = _unique(f"{name}_pass{len(passed)}", taken)
                passed[id(tensor)] = keras.layers.Identity(name=layer_name)(tensor)
            tensor = passed[id(tensor)]
        outputs.append(tensor)
    return graph.sub_model(stage.inputs, outputs, name)


def _unique(name, taken):
    candidate, n = name, 1
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate
