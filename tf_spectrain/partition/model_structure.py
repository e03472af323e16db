"""A Keras model's symbolic inputs and outputs, for every kind of model.

Keras' `model.input` and `model.output` read the first call of the model in a graph, so
they fail for a `keras.Sequential` (never called in a graph of its own, even when built)
and for a model not built yet. These helpers give them in their structure (a tensor, a
list, a dict) wherever the model has them.
"""

import keras

from tf_spectrain.partition.nested import runs_its_graph


def is_built(model):
    """Whether `model` has a graph of layers with known inputs (a Sequential may not yet)."""
    try:
        return bool(model.inputs)
    except (AttributeError, ValueError):  # an unbuilt Sequential
        return False


def input_structure(layer):
    """The symbolic inputs of `layer` in their structure, or None where it has none.

    Args:
        layer: a Keras layer or model.

    Returns:
        A functional model's `input` (a tensor, list or dict of `KerasTensor`s), a built
        Sequential's input tensor, else None (a layer, a subclassed model, or an
        unbuilt Sequential, which learn their inputs when first called).
    """
    if not runs_its_graph(layer) or not is_built(layer):
        return None
    if isinstance(layer, keras.Sequential):
        inputs = layer.inputs
        return inputs[0] if len(inputs) == 1 else list(inputs)
    return layer.input


def output_structure(model):
    """The symbolic outputs of a built functional or Sequential model, in their structure.

    Args:
        model: a functional model or a built `keras.Sequential`.

    Returns:
        `model.output` of a functional model; for a Sequential (whose `model.output`
        Keras only defines once it is called inside another model) its output tensor,
        or the list of them.
    """
    if isinstance(model, keras.Sequential):
        outputs = model.outputs
        return outputs[0] if len(outputs) == 1 else list(outputs)
    return model.output
