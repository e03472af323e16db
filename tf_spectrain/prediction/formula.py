"""The SpecTrain formula in one place: the weights `s` updates ahead, `W_hat = W + s * d`.

`d` is the optimizer's next-update estimate (`directions`) and `s` the version gap
(docs/SPECTRAIN.md sections 4 and 6c). `SpecTrain.predicted_weights` and the runtime's
stage passes (`runtime.passes.StagePasses.weights`) both call `predicted_weights`, so they
compute the same float operations in the same order.
"""

import numbers

import keras
import numpy as np
import tensorflow as tf
from keras import ops


def is_real_number(value):
    """Whether `value` is a real Python/NumPy number (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_steps(steps):
    """Returns `steps` (a version gap) as a number or scalar tensor, or raises.

    Args:
        steps: a Python number >= 0, a NumPy array or a scalar tensor.

    Returns:
        `steps`, a NumPy array converted to a tensor.

    Raises:
        ValueError: a negative number or a tensor that is not a scalar.
        TypeError: anything else.
    """
    if is_real_number(steps):
        if not steps >= 0:
            raise ValueError(
                "`steps` must be >= 0 (how many updates ahead to predict). "
                f"Received: steps={steps!r}"
            )
        return steps
    if isinstance(steps, np.ndarray):
        steps = ops.convert_to_tensor(steps)
    if not ops.is_tensor(steps) and not isinstance(steps, (tf.Variable, keras.Variable)):
        raise TypeError(
            "`steps` must be a Python number or a scalar tensor. "
            f"Received: steps={steps!r} of type {type(steps).__name__}"
        )
    shape = tf.TensorShape(steps.shape)
    if shape.rank not in (None, 0):
        raise ValueError(
            "`steps` must be a scalar (one version gap for all variables). "
            f"Received: steps with shape {tuple(shape)}"
        )
    return steps


def predicted_weights(weights, directions, steps):
    """`W + steps * d` for each weight `W` and its direction `d`.

    `steps` is cast to each weight's dtype and multiplies `d`; the product is added to `W`.

    Args:
        weights: the current weights (variables or tensors).
        directions: one direction tensor `d` per weight, of its shape and dtype.
        steps: the version gap `s`, a number or a scalar tensor.

    Returns:
        A list of tensors, in the order of `weights`.
    """
    return [
        ops.add(ops.convert_to_tensor(w), ops.multiply(ops.cast(steps, w.dtype), d))
        for w, d in zip(weights, directions)
    ]
