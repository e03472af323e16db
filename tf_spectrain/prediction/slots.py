"""Where an optimizer's slots live: on the device of the weight each one mirrors."""

import keras
import tensorflow as tf


def device_of(variable):
    """The device a variable lives on, or None when it has none yet."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return getattr(variable, "device", None) or None


def add_beside(add, reference_variable, **kwargs):
    """Calls `add(reference_variable, **kwargs)` under the reference variable's device.

    Keras places an optimizer slot beside its weight when built eagerly, but on the
    default device when built inside a `tf.function`; this pins it in both cases. Under a
    `tf.distribute` strategy (or for a variable without a device) `add` runs as it is,
    and the strategy decides.

    Args:
        add: a Keras `add_variable_from_reference` (e.g. `super().add_variable_from_reference`).
        reference_variable: the model variable the new variable mirrors.
        **kwargs: `add`'s other arguments (`name`, `initializer`).

    Returns:
        What `add` returns: the new variable.
    """
    device = device_of(reference_variable)
    if device is None or tf.distribute.has_strategy():
        return add(reference_variable, **kwargs)
    with tf.device(device):
        return add(reference_variable, **kwargs)
