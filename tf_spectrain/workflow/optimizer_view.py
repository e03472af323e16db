"""The wrapped Keras model's optimizer as a view of the pipeline stages' optimizer state.

`PipelineModel.compile` compiles the wrapped model with a plain Keras optimizer of the
compiled one's class and settings (`keras_optimizer`: `SpecTrain` and `SpecTrainSGD`
predict weights but train as the Keras optimizer inside them, so the model gets that one),
and `share_state` then makes that optimizer's variables the stages' own: each per-weight
slot (SGD's momentum, Adam's moments, ...) is the slot of the same weight in the stage that
holds it, and the update count and learning rate are the last stage's. So `model.save`,
`save_weights`, `ModelCheckpoint`, `BackupAndRestore`, and callbacks that read or set
`model.optimizer.learning_rate` (TensorBoard, ReduceLROnPlateau) see and change the
pipeline's own state, and a saved file holds the optimizer state Keras would have saved
(it reloads with `keras.models.load_model`, compiled, without a variable-count warning).

Keras keeps no public map from an optimizer's variables to the weights they belong to, so
this module reads and rebinds private attributes of `keras.optimizers.Optimizer` (Keras
3.15: `_variables`, `_trainable_variables`, `_get_variable_index`, `_iterations`,
`_learning_rate`, and the per-weight slot lists its subclasses keep); it is the only module
of tf_spectrain that does.
"""

import keras

from tf_spectrain import prediction
from tf_spectrain.prediction.cloning import rebuild

__all__ = ["align_iterations", "keras_optimizer", "share_state", "variable_roles"]


def keras_optimizer(optimizer):
    """The optimizer a Keras model compiled like the pipeline would have.

    Args:
        optimizer: the optimizer given to `PipelineModel.compile` (an instance).

    Returns:
        `optimizer` itself, unless it is or holds a tf_spectrain `SpecTrain` wrapper: then
        a new optimizer of the class and settings of the optimizer the wrapper trains with
        (`SpecTrainSGD` gives `keras.optimizers.SGD`; a `LossScaleOptimizer` around one is
        rebuilt around the new one), so that files saved from the model load without
        tf_spectrain.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = keras_optimizer(optimizer.inner_optimizer)
        if inner is optimizer.inner_optimizer:
            return optimizer
        config = optimizer.get_config()
        config.pop("inner_optimizer")
        return keras.optimizers.LossScaleOptimizer(inner, **config)
    if not isinstance(optimizer, prediction.SpecTrain):
        return optimizer
    inner = prediction.unwrapped(optimizer)
    cls = next(c for c in type(inner).__mro__ if not c.__module__.startswith("tf_spectrain"))
    return rebuild(cls, inner.get_config(), inner)


def share_state(optimizer, stage_optimizers, weight_pairs):
    """Makes a built optimizer of the whole model use the stages' optimizer variables.

    Every slot variable of `optimizer` (in lists of one per trainable weight, as Keras'
    optimizers keep them) is replaced by the slot of the same list of the stage optimizer
    that updates that weight; every other variable it holds as an attribute (the update
    count, a float learning rate, Nadam's `u_product`) by the last stage's. Variables
    without a counterpart (a loss scale, slots the stage optimizer has under other names)
    stay the optimizer's own. Calling it again re-points the optimizer at new stages.

    Args:
        optimizer: the model's optimizer (possibly a `LossScaleOptimizer`), built on the
            model's trainable weights.
        stage_optimizers: each stage's optimizer (possibly `SpecTrain` wrappers), built.
        weight_pairs: per stage, `(model weight, stage weight)` pairs of its trainable
            weights.

    Returns:
        The number of the model optimizer's variables now shared with a stage.
    """
    own = prediction.unwrapped(optimizer)
    if not own.built or not stage_optimizers:
        return 0
    sources = [prediction.unwrapped(o) for o in stage_optimizers]
    replaced = {}  # id(own variable) -> the stage variable that replaces it
    own_groups = _slot_lists(own)
    for source, pairs in zip(sources, weight_pairs):
        if not source.built:
            continue
        stage_groups = _slot_lists(source)
        for name, slots in own_groups.items():
            theirs = stage_groups.get(name)
            if theirs is None:
                continue
            for model_weight, stage_weight in pairs:
                i, j = _index(own, model_weight), _index(source, stage_weight)
                if i is None or j is None or not _alike(slots[i], theirs[j]):
                    continue
                replaced[id(slots[i])] = theirs[j]
                slots[i] = theirs[j]  # (Keras' TrackedList tracks appends, not items)
    last = sources[-1]
    for name, variable in _scalar_variables(own).items():
        theirs = _scalar_variables(last).get(name)
        if _alike(variable, theirs):
            replaced[id(variable)] = theirs
            object.__setattr__(own, name, theirs)  # Optimizer.__setattr__ would track it
    variables = _owned(own)
    for n, variable in enumerate(variables):
        if id(variable) in replaced:
            variables[n] = replaced[id(variable)]
    return len(replaced)


def align_iterations(stage_optimizers):
    """Sets every stage's update count to the last stage's (after the model's optimizer, which
    shares the last stage's, was loaded from a file)."""
    counts = [_scalar_variables(prediction.unwrapped(o))["_iterations"]
              for o in stage_optimizers]
    for count in counts[:-1]:
        if count is not counts[-1]:
            count.assign(counts[-1].value)


def variable_roles(optimizer):
    """What each of `optimizer.variables` is: one trainable weight's slot, or a scalar.

    A checkpoint keys the slots by weight (not by position in one stage's optimizer) with
    this, so that they can be restored into stages cut elsewhere. It looks through
    `SpecTrain` and `LossScaleOptimizer` wrappers: the innermost optimizer's attributes are
    named as they are (`"momentums"`, `"_iterations"`), a wrapper's as
    `"<class>.<attribute>"` (`"SpecTrain.last_updates"`).

    Args:
        optimizer: a built Keras optimizer, possibly wrapped.

    Returns:
        One entry per variable of `optimizer.variables`, in order: `("slot", name, weight)`
        (a slot list's entry, with the trainable weight it belongs to), `("scalar",
        name)` (a variable held alone in an attribute: the update count, a learning rate)
        or None (a variable of no role found here).
    """
    levels = [optimizer]
    while hasattr(levels[-1], "inner_optimizer"):
        levels.append(levels[-1].inner_optimizer)
    roles = {}
    for depth, level in enumerate(reversed(levels)):
        prefix = "" if depth == 0 else f"{type(level).__name__}."
        weights = list(getattr(level, "_trainable_variables", ()))
        for name, slots in _slot_lists(level).items():
            for weight, slot in zip(weights, slots):
                if slot is not None:
                    roles.setdefault(id(slot), ("slot", prefix + name, weight))
        for name, variable in _scalar_variables(level).items():
            roles.setdefault(id(variable), ("scalar", prefix + name))
    return [roles.get(id(v)) for v in optimizer.variables]


def _slot_lists(optimizer):
    """`{attribute: list}` of the optimizer's lists of one variable (or None) per weight."""
    weights = list(getattr(optimizer, "_trainable_variables", ()))
    owned = {id(v) for v in _owned(optimizer)}
    found = {}
    for name, value in vars(optimizer).items():
        if name == "_trainable_variables" or not isinstance(value, list):
            continue
        if len(value) != len(weights) or not value:
            continue
        if all(v is None or id(v) in owned for v in value) and any(v is not None for v in value):
            found[name] = value
    return found


def _owned(optimizer):
    """The optimizer's own variable list (Keras' `variables` is a copy of it)."""
    return optimizer._variables  # noqa: SLF001 - see the module docstring


def _scalar_variables(optimizer):
    """`{attribute: variable}` of the optimizer's variables held alone in an attribute."""
    owned = {id(v) for v in _owned(optimizer)}
    return {name: value for name, value in vars(optimizer).items()
            if isinstance(value, keras.Variable) and id(value) in owned}


def _index(optimizer, weight):
    """The weight's index in the optimizer's slot lists, or None if it was not built with it."""
    try:
        return optimizer._get_variable_index(weight)  # noqa: SLF001 - see the docstring
    except KeyError:
        return None


def _alike(a, b):
    """Whether two optimizer variables are interchangeable (both there, same shape and dtype)."""
    return (a is not None and b is not None and tuple(a.shape) == tuple(b.shape)
            and a.dtype == b.dtype)
