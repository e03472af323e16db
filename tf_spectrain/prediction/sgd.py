"""`SpecTrainSGD`: `SpecTrain` around momentum SGD, with the settings of `keras.optimizers.SGD`.

It is the optimizer of the SpecTrain paper (SPECTRAIN.md sections 4 and 6): the weights
`s` updates ahead are predicted as `W + s * m`, the stage's last momentum step repeated.
"""

import keras
from keras import ops

from tf_spectrain.prediction import directions
from tf_spectrain.prediction.cloning import rebuild
from tf_spectrain.prediction.formula import is_real_number
from tf_spectrain.prediction.slots import add_beside
from tf_spectrain.prediction.wrapper import SpecTrain


def _check_momentum(momentum):
    if not is_real_number(momentum) or not 0 <= momentum < 1:
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
            "`tf_spectrain.SpecTrain(keras.optimizers.SGD(nesterov=True))`, which predicts "
            f"from the last applied update. Received: nesterov={nesterov!r}"
        )


class _KeptStepSGD(keras.optimizers.SGD):
    """Keras' SGD, whose momentum slot also holds the last step when `momentum=0`."""

    keeps_momentum = True  # `directions.direction_rule`: predict from the momentum slot

    def build(self, variables):
        """Creates one momentum slot per trainable variable, whatever the momentum."""
        if self.built:
            return
        keras.optimizers.Optimizer.build(self, variables)
        self.momentums = self.add_optimizer_variables(variables, "momentum")

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        """A slot beside its weight, also when built inside a `tf.function`."""
        return add_beside(super().add_variable_from_reference, reference_variable,
                          name=name, initializer=initializer)

    def update_step(self, gradient, variable, learning_rate):
        """Keras' momentum rule; with `momentum=0`, `m = -lr * g` and `w = w + m`."""
        if self.momentum != 0:
            return super().update_step(gradient, variable, learning_rate)
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        m = self.momentums[self._get_variable_index(variable)]
        # 0 - x is -x exactly; subtracting from zeros also turns a sparse gradient into a
        # dense step, so rows without gradient get m = 0, not a stale value.
        self.assign(m, ops.subtract(ops.zeros_like(m), ops.multiply(gradient, learning_rate)))
        self.assign_add(variable, m)


@keras.saving.register_keras_serializable(package="tf_spectrain")
class SpecTrainSGD(SpecTrain):
    """Momentum SGD with SpecTrain weight prediction: `SpecTrain` around Keras' SGD.

    The update rule is that of `keras.optimizers.SGD(momentum, nesterov=False)`:

    ```python
    m = momentum * m - learning_rate * g
    w = w + m
    ```

    so a plain `model.fit` gives the same weights as Keras' SGD. Learning-rate schedules,
    weight decay, gradient clipping, loss scaling, gradient accumulation and EMA all come
    from Keras unchanged.

    With `momentum=0` the slot still exists and holds the last step, `m = -learning_rate * g`,
    and `w = w + m` is then Keras' `w = w - learning_rate * g` exactly. (A sparse gradient,
    e.g. of an `Embedding`, is then applied densely, so `m` is 0 in rows without gradient;
    with repeated indices this can differ from Keras' sparse update by float rounding.)

    `predicted_weights(variables, s)` returns `w + s * m`: the weights after `s` more steps
    if each repeated the last momentum step (the paper's rule, SPECTRAIN.md section 4).
    Before the first update `m = 0`, so the prediction is `w`. The slot of every trainable
    variable is `momentum_of(variable)`, and `clone_for_stage()` gives each pipeline stage
    its own optimizer with the same settings. Slots are created beside their weights, also
    when the optimizer is built lazily inside a `tf.function`.

    The optimizer's variables, their order and names are those of earlier versions (its
    iteration count, learning rate, then one `momentum` slot per variable), so saved
    configs and checkpoints load.

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
            any argument Keras' SGD rejects.
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
        inner = _KeptStepSGD(
            learning_rate=learning_rate,
            momentum=_check_momentum(momentum),
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            name=name,
            **kwargs,
        )
        super().__init__(inner, name=name)

    @property
    def momentum(self):
        """The momentum coefficient."""
        return self.inner_optimizer.momentum

    @property
    def momentums(self):
        """The momentum slots, one per variable, in the order the optimizer was built with."""
        return self.inner_optimizer.momentums if self.built else []

    def momentum_of(self, variable):
        """The momentum slot `m` of `variable` (a `keras.Variable` or the `tf.Variable` it wraps).

        None for a variable marked `overwrite_with_gradient`, which the optimizer overwrites.
        Raises a ValueError if not built (or not with `variable`), a TypeError for a non-variable.
        """
        found = self._direction(variable)
        return found.slots[0] if found.rule == directions.MOMENTUM else None

    def get_config(self):
        """Returns the optimizer's config: the Keras base config plus `momentum`.

        Returns:
            A serialisable dict; `SpecTrainSGD.from_config(config)` rebuilds an equal,
            unbuilt optimizer.
        """
        config = self.inner_optimizer.get_config()
        config.pop("nesterov", None)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuilds an unbuilt optimizer from `get_config()` (or a Keras SGD config)."""
        return keras.optimizers.Optimizer.from_config.__func__(cls, config, custom_objects)

    def clone_for_stage(self):
        """A fresh, unbuilt copy for one stage (`rebuild`: schedule shared, exclusions kept)."""
        return rebuild(type(self), self.get_config(), self.inner_optimizer,
                       inner_of=lambda clone: clone.inner_optimizer)
