"""Fresh copies of an optimizer, one per pipeline stage, with what a config round trip loses.

A config round trip would lose a callable or unregistered learning-rate schedule and the
choices of `exclude_from_weight_decay`; `clone_optimizer` and `rebuild` keep them (a
schedule is shared, not copied: schedules are stateless).
"""

import keras


def clone_optimizer(optimizer):
    """Builds a fresh, unbuilt optimizer with `optimizer`'s settings (each stage gets one).

    Args:
        optimizer: a Keras optimizer (one with `clone_for_stage`, such as a `SpecTrain`,
            clones itself).

    Returns:
        A new, unbuilt optimizer of the same class and configuration.
    """
    if hasattr(optimizer, "clone_for_stage"):
        return optimizer.clone_for_stage()
    return rebuild(type(optimizer), optimizer.get_config(), optimizer)


def rebuild(cls, config, settings_of, inner_of=lambda optimizer: optimizer):
    """`cls.from_config(config)` with the schedule and weight-decay choices of `settings_of`.

    Args:
        cls: the optimizer class to build.
        config: its config (changed in place).
        settings_of: the Keras optimizer whose learning rate object and weight-decay
            exclusions the new one takes.
        inner_of: where in the new optimizer those exclusions go (a wrapper's inner one).

    Returns:
        The new optimizer.
    """
    rate = getattr(settings_of, "_learning_rate", None)  # Keras keeps the schedule here
    if rate is not None and not isinstance(rate, keras.Variable):
        config["learning_rate"] = rate
    clone = cls.from_config(config)
    # Keras' exclude_from_weight_decay() keeps its choices in these attributes of the base
    # optimizer, and get_config() does not carry them.
    for attr in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(settings_of, attr):
            setattr(inner_of(clone), attr, getattr(settings_of, attr))
    return clone
