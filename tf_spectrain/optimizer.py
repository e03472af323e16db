"""`SpecTrainSGD`: momentum SGD that can also predict weights a few updates ahead.

SpecTrain (SPECTRAIN.md, sections 4 and 6) predicts the weights a pass should have used as
`W_hat = W + s * m`: the stage's last momentum step `m`, repeated `s` times. `SpecTrainSGD`
is the optimizer that owns `m`; its docstring says how it updates and predicts.
"""

import numbers

import keras
import numpy as np
import tensorflow as tf
from keras import ops

_SLOT_NAME = "momentum"


def _is_real_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_momentum(momentum):
    if not _is_real_number(momentum) or not 0 <= momentum < 1:
        raise ValueError(
            "`momentum` should be a float between [0, 1). "
            f"Received: momentum={momentum!r}"
        )
    return float(momentum)


def _check_nesterov(nesterov):
    if nesterov:
        raise ValueError(
            "`SpecTrainSGD` does not support Nesterov momentum: SpecTrain predicts "
            "weights from plain momentum (W + s * m). Use "
            "`keras.optimizers.SGD(nesterov=True)` for Nesterov momentum. "
            f"Received: nesterov={nesterov!r}"
        )


def _check_steps(steps):
    """Returns `steps` as a number or scalar tensor, or raises for anything else."""
    if _is_real_number(steps):
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


def _describe(variable):
    return getattr(variable, "path", None) or getattr(variable, "name", repr(variable))


def _device_of(variable):
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return getattr(variable, "device", None) or None


@keras.saving.register_keras_serializable(package="tf_spectrain")
class SpecTrainSGD(keras.optimizers.Optimizer):
    """Momentum SGD with SpecTrain weight prediction.

    The update rule is that of `keras.optimizers.SGD(momentum, nesterov=False)`:

    ```python
    m = momentum * m - learning_rate * g
    w = w + m
    ```

    so a plain `model.fit` gives the same weights as Keras' SGD. Learning-rate schedules,
    weight decay, gradient clipping, loss scaling, gradient accumulation and EMA all come
    from the Keras base class unchanged.

    With `momentum=0` the slot still exists and holds the last step, `m = -learning_rate * g`,
    and `w = w + m` is then Keras' `w = w - learning_rate * g` exactly. (A sparse gradient,
    e.g. of an `Embedding`, is then applied densely, so `m` is 0 in rows without gradient;
    with repeated indices this can differ from Keras' sparse update by float rounding.)

    On top of that, `predicted_weights(variables, s)` returns `w + s * m`: the weights after
    `s` more steps if each repeated the last momentum step (the paper's rule, SPECTRAIN.md
    section 4). Before the first update `m = 0`, so the prediction is `w`. The slot of every
    trainable variable is looked up with `momentum_of(variable)`, and `clone_for_stage()`
    gives each pipeline stage its own optimizer with the same settings.

    Momentum slots are created beside their weights: on the variable's own device, also
    when the optimizer is built lazily inside a `tf.function` (outside a `tf.distribute`
    strategy, where the strategy places them).

    Example:

    ```python
    opt = SpecTrainSGD(learning_rate=0.01, momentum=0.9)
    with tf.device("/CPU:1"):
        opt.build(stage.trainable_variables)
    w_hat = opt.predicted_weights(stage.trainable_variables, steps=2)
    ```

    Args:
        learning_rate: a float, a `keras.optimizers.schedules.LearningRateSchedule`, or a
            callable taking no arguments and returning the learning rate. Defaults to 0.01.
        momentum: a float in [0, 1). Defaults to 0.9 (SpecTrain needs momentum to predict).
        weight_decay: as in Keras: if set, `w = w - w * weight_decay * lr` before the step.
        clipnorm: as in Keras: clip each gradient to this norm.
        clipvalue: as in Keras: clip each gradient element to [-clipvalue, clipvalue].
        global_clipnorm: as in Keras: clip all gradients together to this global norm.
        name: the optimizer's name, used for its variables. Defaults to "spectrain_sgd".
        **kwargs: other `keras.optimizers.Optimizer` arguments (`use_ema`,
            `ema_momentum`, `ema_overwrite_frequency`, `loss_scale_factor`,
            `gradient_accumulation_steps`). `nesterov=False` is accepted (and ignored)
            so that a `keras.optimizers.SGD` config loads.

    Raises:
        ValueError: if `momentum` is not a float in [0, 1), if `nesterov=True`, or for
            any argument the Keras base class rejects.
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum=0.9,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        name="spectrain_sgd",
        **kwargs,
    ):
        _check_nesterov(kwargs.pop("nesterov", False))
        momentum = _check_momentum(momentum)
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            name=name,
            **kwargs,
        )
        self.momentum = momentum
        self.momentums = []
        self._momentum_index = {}

    # --- slots --------------------------------------------------------------------------

    def build(self, variables):
        """Creates one momentum slot per trainable variable.

        Build eagerly under the stage's device (`with tf.device(d): opt.build(vars)`) or let
        `apply_gradients` build it; either way each slot lives on its variable's device.

        Args:
            variables: the trainable variables this optimizer will update. Non-trainable
                state (e.g. BatchNorm moving statistics) must not be passed.
        """
        if self.built:
            return
        variables = list(variables)
        super().build(variables)
        self.momentums = self.add_optimizer_variables(variables, _SLOT_NAME)
        self._momentum_index = {self._key(v): i for i, v in enumerate(variables)}

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        """Adds an optimizer variable shaped like `reference_variable`, on its device.

        Keras places slots beside their weights when built eagerly, but on the default
        device when built inside a `tf.function`; this override pins the device in both
        cases. Under a `tf.distribute` strategy the strategy decides placement.

        Args:
            reference_variable: the model variable the new variable mirrors.
            name: the name suffix of the new variable.
            initializer: its initializer. Defaults to zeros.

        Returns:
            The new optimizer variable, a `keras.Variable`.
        """
        device = _device_of(reference_variable)
        if device is None or tf.distribute.has_strategy():
            return super().add_variable_from_reference(
                reference_variable, name=name, initializer=initializer
            )
        with tf.device(device):
            return super().add_variable_from_reference(
                reference_variable, name=name, initializer=initializer
            )

    def _key(self, variable):
        # The backend's own notion of variable identity: it maps a `keras.Variable`, the
        # `tf.Variable` it wraps (what `update_step` receives on TensorFlow) and a
        # distributed variable's components to one key.
        return self._var_key(variable)

    def momentum_of(self, variable):
        """Returns the momentum slot `m` of `variable`.

        Args:
            variable: one of the trainable variables the optimizer was built with (a
                `keras.Variable` or the `tf.Variable` it wraps).

        Returns:
            The `keras.Variable` holding `m` for `variable`; `None` for a variable marked
            `overwrite_with_gradient`, which the optimizer overwrites instead of updating.

        Raises:
            ValueError: if the optimizer is not built yet, or was not built with `variable`.
            TypeError: if `variable` is not a variable.
        """
        if not isinstance(variable, (keras.Variable, tf.Variable)):
            raise TypeError(
                "`variable` must be a `keras.Variable` (or a `tf.Variable`). "
                f"Received: variable={variable!r} of type {type(variable).__name__}"
            )
        if not self.built:
            raise ValueError(
                f"Optimizer '{self.name}' is not built yet, so it has no momentum for "
                f"'{_describe(variable)}'. Call `optimizer.build(trainable_variables)` "
                "first (eagerly, under the stage's device)."
            )
        index = self._momentum_index.get(self._key(variable))
        if index is None:
            raise ValueError(
                f"Unknown variable '{_describe(variable)}': optimizer '{self.name}' was "
                f"built with {len(self.momentums)} other variables and keeps momentum only "
                "for those. Pass one of the variables it was built with, or use a new "
                "optimizer (e.g. `clone_for_stage()`) for another set of variables."
            )
        return self.momentums[index]

    # --- update and prediction ----------------------------------------------------------

    def update_step(self, gradient, variable, learning_rate):
        """Applies one momentum-SGD step to `variable` (Keras' SGD rule, no Nesterov).

        Called by `apply_gradients` after clipping and weight decay.

        Args:
            gradient: the (possibly clipped) gradient of `variable`.
            variable: the variable to update; its momentum slot is updated first.
            learning_rate: the learning rate of this iteration.
        """
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        m = self.momentum_of(variable)
        step = ops.multiply(gradient, learning_rate)
        if self.momentum == 0:
            # 0 - x is -x exactly; subtracting from zeros also turns a sparse gradient
            # into a dense step, so rows without gradient get m = 0, not a stale value.
            new_m = ops.subtract(ops.zeros_like(m), step)
        else:
            new_m = ops.subtract(ops.multiply(m, ops.cast(self.momentum, variable.dtype)), step)
        self.assign(m, new_m)
        self.assign_add(variable, m)

    def predicted_weights(self, variables, steps):
        """Predicts the weights `steps` updates ahead: `W + steps * m` for each variable.

        Reads each variable and its momentum as they stand and changes no state (no
        variable, no slot, not `iterations`). Works eagerly and inside `tf.function`.

        Args:
            variables: a list of trainable variables the optimizer was built with.
                Non-trainable state (BatchNorm moving statistics) is never predicted and
                must not be passed.
            steps: the version gap `s`, a Python int/float >= 0 or a scalar tensor.
                `steps=0` returns the current values.

        Returns:
            A list of tensors, one per variable, in the order of `variables`. A variable
            marked `overwrite_with_gradient` (no momentum) is returned unchanged.

        Raises:
            TypeError: if `variables` is a single variable or `steps` is not a number or
                a tensor.
            ValueError: if `steps` is negative or not a scalar, or a variable is unknown
                to this optimizer (see `momentum_of`).
        """
        if isinstance(variables, (keras.Variable, tf.Variable)):
            raise TypeError(
                "`variables` must be a list of variables, not a single variable. "
                f"Received: variables={_describe(variables)}; pass [variable] instead."
            )
        steps = _check_steps(steps)
        predictions = []
        for variable in variables:
            m = self.momentum_of(variable)
            current = ops.convert_to_tensor(variable)
            if m is None or (_is_real_number(steps) and steps == 0):
                predictions.append(current)
                continue
            gap = ops.cast(steps, variable.dtype)
            predictions.append(ops.add(current, ops.multiply(gap, m)))
        return predictions

    # --- configuration ------------------------------------------------------------------

    def get_config(self):
        """Returns the optimizer's config: the Keras base config plus `momentum`.

        Returns:
            A serialisable dict; `SpecTrainSGD.from_config(config)` rebuilds an equal,
            unbuilt optimizer.
        """
        config = super().get_config()
        config["momentum"] = self.momentum
        return config

    def clone_for_stage(self):
        """Returns a fresh, unbuilt optimizer with this one's settings, for one stage.

        Each pipeline stage gets its own optimizer: its own slots, iteration count and
        (for a schedule) learning-rate position. A learning-rate schedule or callable is
        shared, not copied (schedules are stateless). Exclusions from weight decay set
        with `exclude_from_weight_decay` carry over.

        Returns:
            A new `SpecTrainSGD` (or subclass) with the same config.
        """
        config = self.get_config()
        if not isinstance(self._learning_rate, keras.Variable):
            config["learning_rate"] = self._learning_rate
        clone = type(self).from_config(config)
        # Keras' exclude_from_weight_decay() keeps its choices in these attributes of the
        # base optimizer, and get_config() does not carry them.
        for attr in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
            if hasattr(self, attr):
                setattr(clone, attr, getattr(self, attr))
        return clone
