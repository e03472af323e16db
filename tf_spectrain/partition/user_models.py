"""The Keras models a user brings to `PipelineModel`: which are taken, and how.

- A functional model or a `keras.Sequential` (with or without an `Input`, built or not) is
  cut automatically. An unbuilt Sequential is built from the first data, as Keras builds
  it in its first `fit` (`tf_spectrain.workflow.deferred_build`).
- A list of Keras models or layers is a pipeline split by hand, one stage each
  (`tf_spectrain.partition.stage_list`): the way to pipeline a subclassed model.
- A subclassed `keras.Model` (its computation is its Python `call`) has no graph of layers
  to cut: `accept` refuses it, saying how to proceed.

What a model's inputs and outputs are, for every kind of model, is
`tf_spectrain.partition.model_structure`.
"""

import keras

from tf_spectrain.partition import stage_list
from tf_spectrain.partition.nested import runs_its_graph


def accept(model, cuts, num_stages):
    """The model and cuts `PipelineModel` works with, from what the user passed.

    Args:
        model: a functional model or Sequential, or a list of stage models or layers.
        cuts: `PipelineModel`'s `cuts`.
        num_stages: `PipelineModel`'s `num_stages`.

    Returns:
        `(model, cuts)`: `model` and `cuts` as given; for a list of stages, the model
        chaining them and the cuts at their boundaries (`stage_list.chain`).

    Raises:
        TypeError: if `model` is neither a Keras model nor a list of Keras layers.
        ValueError: for a subclassed model (the message says how to pipeline it), or a
            stage list `stage_list.chain` refuses.
    """
    if isinstance(model, (list, tuple)):
        return stage_list.chain(model, cuts, num_stages)
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras.Model (functional or Sequential) or a list of stage "
            f"models or layers. Received: model={model!r} of type {type(model).__name__}"
        )
    if not runs_its_graph(model):
        raise ValueError(subclassed_message(model))
    return model, cuts


def subclassed_message(model):
    """What to do with the subclassed model `model`, which cannot be cut automatically."""
    return (
        f"Model '{model.name}' is a subclassed keras.Model (class "
        f"{type(model).__name__} overrides `call()`), so it has no graph of layers that "
        "could be cut into stages automatically. To pipeline it, split it by hand into "
        "consecutive parts, each a Keras model or layer that takes what the previous one "
        "returns, and pass them as a list, one stage each: "
        "tf_spectrain.PipelineModel([stage0, stage1, ...]) (subclassed stages are fine; a "
        "list of one runs the whole model as one stage). Or build the model with the "
        "functional API (keras.Model(inputs, outputs)) or as a keras.Sequential: those can "
        "be cut after any layer."
    )
