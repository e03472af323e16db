"""A pipeline from stages split by hand: `PipelineModel([stage0, stage1, ...])`.

A model that cannot be cut automatically (a subclassed `keras.Model`, whose computation is
its Python `call`) is pipelined by splitting it by hand, as torchgpipe takes an
`nn.Sequential`: each stage is any Keras model or layer (functional, Sequential,
subclassed, a single layer), and stage `k + 1` runs on what stage `k` returns (a tensor, or
a list or dict of tensors that it takes as they are).

`chain(stages)` makes of them one Keras model that calls the stages in order, so that the
pipeline (and Keras callbacks, `save`, `evaluate`) has a model to hold, and the cuts at
the stage boundaries: the model is a functional one when the first stage knows its inputs
(a functional model or a built Sequential), else a `keras.Sequential` of the stages that
is built from the first data, as Keras builds a Sequential without an `Input`
(`tf_spectrain.workflow.deferred_build`). The stages stay the user's objects: the trained weights
are theirs. Functional and Sequential stages are cut as their layers
(`tf_spectrain.partition` flattens nested models), so each cut is the last layer of its
stage; a subclassed stage or a layer is one operation, and the cut is its own name.
"""

import keras

from tf_spectrain.partition.model_structure import input_structure
from tf_spectrain.partition.nested import runs_its_graph


def is_stage_list(value):
    """Whether `value` is a list or tuple of Keras layers (models are layers too)."""
    return isinstance(value, (list, tuple)) and all(
        isinstance(v, keras.layers.Layer) for v in value
    )


def chain(stages, cuts, num_stages):
    """One Keras model calling `stages` in order, and the cuts between them.

    Args:
        stages: a non-empty list of Keras models or layers, one per pipeline stage.
        cuts: what `PipelineModel` received as `cuts`; only the default `"auto"` is valid
            (the list fixes the cuts).
        num_stages: None, or `len(stages)`.

    Returns:
        `(model, cuts)`: a functional model (or a `keras.Sequential`, built at the first
        data when the first stage does not know its inputs) whose operations are the
        stages, and the name of the last layer of every stage but the last.

    Raises:
        TypeError: if an entry of `stages` is not a Keras layer or model.
        ValueError: for an empty list, a stage listed twice, a stage without layers, or
            `cuts` / `num_stages` that disagree with the list.
    """
    stages = list(stages)
    _check_stages(stages, cuts, num_stages)
    first = input_structure(stages[0])
    if first is None:
        model = keras.Sequential(stages)
    else:
        inputs = keras.tree.map_structure(
            lambda t: keras.Input(batch_shape=t.shape, dtype=t.dtype, name=t.name), first
        )
        outputs = inputs
        for stage in stages:
            outputs = stage(outputs)
        model = keras.Model(inputs, outputs)
    return model, [_last_layer_name(stage, k) for k, stage in enumerate(stages[:-1])]


def _check_stages(stages, cuts, num_stages):
    """Raises for a stage list `chain` cannot make a pipeline of."""
    if not stages:
        raise ValueError(
            "`model` must be a Keras model or a non-empty list of stage models. "
            "Received: model=[]"
        )
    for k, stage in enumerate(stages):
        if not isinstance(stage, keras.layers.Layer):
            raise TypeError(
                "A list passed as `model` must hold Keras models or layers, one per "
                f"stage. Received: {stage!r} of type {type(stage).__name__} at index {k}"
            )
        if any(stage is other for other in stages[:k]):
            raise ValueError(
                f"Stage {k} ('{stage.name}') is listed twice in `model`: every stage needs "
                "its own model or layer (one device holds each stage's weights)."
            )
    if not (isinstance(cuts, str) and cuts == "auto"):
        raise ValueError(
            "`cuts` must be left out when `model` is a list of stages: each entry is "
            f"one stage, so the list fixes the cuts. Received: cuts={cuts!r}"
        )
    if num_stages is not None and num_stages != len(stages):
        raise ValueError(
            f"`num_stages` must be None or the number of stages in `model` "
            f"({len(stages)}). Received: num_stages={num_stages!r}"
        )


def _last_layer_name(stage, index):
    """The name of the layer a cut after `stage` names, in the flattened graph."""
    layer = stage
    while runs_its_graph(layer):
        ops = layer.layers if isinstance(layer, keras.Sequential) else [
            op for op in layer.operations if not isinstance(op, keras.layers.InputLayer)]
        if not ops:
            raise ValueError(
                f"Stage {index} ('{stage.name}') has no layers, so it cannot be a stage "
                "of its own: leave it out or merge it into a neighbour."
            )
        layer = ops[-1]
    return layer.name
