"""Mode "nesterov": each stage's optimizer in its Nesterov form (docs/SPECTRAIN.md 6e).

- `Nadam`: Keras' `Nadam` with PyTorch's `momentum_decay` (0.004: the paper's code; 1.0:
  Keras' own schedule, exactly).
- `nesterov_form(optimizer, k, num_stages)`: stage k's fresh optimizer, SGD as Nesterov SGD
  and the Adam family as `Nadam`, its momentum or `beta_1` raised by the stage's delay
  (`schedule.modes.nesterov_coefficient`).
- `check_nesterov_optimizer(optimizer)`: refuses, before anything is built, an optimizer
  that has no such form.
"""

import keras
from keras import ops

from tf_spectrain.prediction.cloning import rebuild
from tf_spectrain.prediction.formula import is_real_number
from tf_spectrain.prediction.sgd import _KeptStepSGD
from tf_spectrain.prediction.wrapper import SpecTrain
from tf_spectrain.schedule.modes import nesterov_coefficient

PAPER_MOMENTUM_DECAY = 0.004
"""PyTorch's NAdam default, which the paper's code runs with."""


@keras.saving.register_keras_serializable(package="tf_spectrain")
class Nadam(keras.optimizers.Nadam):
    """Nadam whose momentum schedule has PyTorch's `momentum_decay`.

    Keras' `Nadam` and PyTorch's `NAdam` take the same step,

    ```python
    m = m + (1 - beta_1) * (g - m)
    v = v + (1 - beta_2) * (g**2 - v)
    m_hat = mu_{t+1} * m / (1 - prod_{t+1}) + (1 - mu_t) * g / (1 - prod_t)
    w = w - lr * m_hat / (sqrt(v / (1 - beta_2**t)) + epsilon)
    ```

    with `prod_t` the product `mu_1 ... mu_t`, but not the same schedule of `mu_t`. Here it
    is `mu_t = beta_1 * (1 - 0.5 * 0.96 ** (momentum_decay * t))`. Keras' is
    `momentum_decay=1.0`, which reaches `beta_1` within about 50 updates; PyTorch's default
    (and the default here) is 0.004, which stays near `beta_1 / 2` for thousands of updates.
    With `momentum_decay=1.0` this optimizer gives exactly the weights of
    `keras.optimizers.Nadam`. Weight decay, as in every Keras optimizer, is decoupled
    (`w = w - lr * weight_decay * w` before the step), as PyTorch's
    `decoupled_weight_decay=True`.

    Example:

    ```python
    opt = tf_spectrain.prediction.Nadam(1e-3, weight_decay=0.01, momentum_decay=0.004)
    model.compile(optimizer=opt, loss="mse")
    ```

    Args:
        *args: the positional arguments of `keras.optimizers.Nadam` (`learning_rate`,
            `beta_1`, `beta_2`, `epsilon`, ...), in its order.
        momentum_decay: the factor of `t` in the schedule's exponent, a float > 0.
            Defaults to `0.004` (PyTorch's NAdam).
        **kwargs: the keyword arguments of `keras.optimizers.Nadam`.

    Raises:
        ValueError: `momentum_decay` is not a float > 0 (and as `keras.optimizers.Nadam`).

    Reference:

    - [Dozat, 2015](http://cs229.stanford.edu/proj2015/054_report.pdf).
    - [PyTorch `NAdam`](https://pytorch.org/docs/stable/generated/torch.optim.NAdam.html).
    """

    def __init__(self, *args, momentum_decay=PAPER_MOMENTUM_DECAY, **kwargs):
        super().__init__(*args, **kwargs)
        if not is_real_number(momentum_decay) or not momentum_decay > 0:
            raise ValueError(
                "`momentum_decay` must be a float > 0. "
                f"Received: momentum_decay={momentum_decay!r}"
            )
        self.momentum_decay = float(momentum_decay)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # Keras' Nadam keeps `prod_t` in one variable, `_u_product`, updated here once per
        # step before the per-variable `update_step`s (its own code, with the exponent
        # scaled). The base class' `_backend_update_step`, not Nadam's, runs them.
        dtype = self._u_product.dtype
        step = ops.cast(self.iterations + 1, dtype)
        self.assign(
            self._u_product,
            self._u_product
            * self.beta_1
            * (1.0 - 0.5 * ops.power(0.96, step * self.momentum_decay)),
        )
        super(keras.optimizers.Nadam, self)._backend_update_step(
            grads, trainable_variables, learning_rate
        )

    def update_step(self, gradient, variable, learning_rate):
        """Update step given gradient and the associated model variable."""
        # keras.optimizers.Nadam.update_step (Keras 3.15), the exponents times momentum_decay.
        var_dtype = variable.dtype
        lr = ops.cast(learning_rate, var_dtype)
        gradient = ops.cast(gradient, var_dtype)

        local_step = ops.cast(self.iterations + 1, var_dtype)
        next_step = ops.cast(self.iterations + 2, var_dtype)
        decay = ops.cast(0.96, var_dtype)
        beta_1 = ops.cast(self.beta_1, var_dtype)
        beta_2 = ops.cast(self.beta_2, var_dtype)
        u_t = beta_1 * (1.0 - 0.5 * ops.power(decay, local_step * self.momentum_decay))
        u_t_1 = beta_1 * (1.0 - 0.5 * ops.power(decay, next_step * self.momentum_decay))
        u_product_t = ops.cast(self._u_product, var_dtype)

        u_product_t_1 = u_product_t * u_t_1
        beta_2_power = ops.power(beta_2, local_step)

        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]

        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), (1 - beta_1)))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), (1 - beta_2)))
        m_hat = ops.add(
            ops.divide(ops.multiply(u_t_1, m), 1 - u_product_t_1),
            ops.divide(ops.multiply(1 - u_t, gradient), 1 - u_product_t),
        )
        v_hat = ops.divide(v, (1 - beta_2_power))

        self.assign_sub(
            variable,
            ops.divide(ops.multiply(m_hat, lr), ops.add(ops.sqrt(v_hat), self.epsilon)),
        )

    def get_config(self):
        """Returns Keras' Nadam config plus `momentum_decay`."""
        config = super().get_config()
        config["momentum_decay"] = self.momentum_decay
        return config


_SGD = (keras.optimizers.SGD, _KeptStepSGD)  # _KeptStepSGD: SpecTrainSGD's, Keras' step
_ADAM = (keras.optimizers.Adam, keras.optimizers.AdamW)
_NADAM = (keras.optimizers.Nadam, Nadam)


def _inner(optimizer):
    """The optimizer inside `SpecTrain` wrappers (a `LossScaleOptimizer` is not unwrapped)."""
    while isinstance(optimizer, SpecTrain):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _refuse(received):
    raise ValueError(
        "mode 'nesterov' takes SGD, Adam, AdamW or Nadam (keras.optimizers, or "
        "tf_spectrain.prediction.Nadam): it uses their Nesterov form, SPECTRAIN.md 6e. "
        f"Received: optimizer={received}"
    )


def check_nesterov_optimizer(optimizer):
    """Raises unless `optimizer` has a Nesterov form (`nesterov_form`); builds nothing.

    Args:
        optimizer: a Keras optimizer, possibly inside `SpecTrain` wrappers.

    Returns:
        The optimizer whose form `nesterov_form` builds (a wrapper's inner one).

    Raises:
        ValueError: for any optimizer but exactly `keras.optimizers.SGD`, `Adam` or `AdamW`
            (without amsgrad), `Nadam`, or `tf_spectrain.prediction.Nadam` (subclasses may
            change the step, and a `LossScaleOptimizer` is refused too), or a `momentum` or
            `beta_1` that is not a float in [0, 1).
    """
    inner = _inner(optimizer)
    kind = type(inner)
    if not isinstance(inner, keras.optimizers.Optimizer):
        _refuse(repr(optimizer))
    if kind not in _SGD + _ADAM + _NADAM:
        _refuse(kind.__name__)
    if kind in _ADAM and inner.amsgrad:
        _refuse(f"{kind.__name__} with amsgrad=True")
    name = "momentum" if kind in _SGD else "beta_1"
    base = getattr(inner, name)
    if not is_real_number(base) or not 0 <= base < 1:
        raise ValueError(
            f"mode 'nesterov' raises each stage's `{name}` by its delay, so it must be a "
            f"float in [0, 1). Received: {name}={base!r} ({kind.__name__})"
        )
    return inner


def nesterov_form(optimizer, k, num_stages):
    """A fresh, unbuilt optimizer for stage k of mode "nesterov" (SPECTRAIN.md 6e).

    - `keras.optimizers.SGD` becomes `SGD(nesterov=True)` with
      `momentum = nesterov_coefficient(momentum, k, num_stages)`;
    - `Adam`, `AdamW` and Keras' `Nadam` become `Nadam` (this module's) with
      `beta_1 = nesterov_coefficient(beta_1, k, num_stages)` and `momentum_decay` 0.004
      (the paper's) for Adam and AdamW, 1.0 (its own schedule) for Keras' Nadam;
      a `tf_spectrain.prediction.Nadam` keeps its `momentum_decay`.

    Everything else is kept: the learning rate (a schedule object is shared, not
    serialised), `beta_2`, `epsilon`, weight decay and its exclusions, clipping, loss scale
    factor, gradient accumulation, EMA and the name.

    Args:
        optimizer: a Keras optimizer, possibly inside `SpecTrain` wrappers (not changed).
        k: the stage index, `0 <= k < num_stages`.
        num_stages: the number of stages `N`, an int >= 1.

    Returns:
        A new, unbuilt Keras optimizer.

    Raises:
        ValueError: as `check_nesterov_optimizer`, or `k`, `num_stages` out of range.
    """
    inner = check_nesterov_optimizer(optimizer)
    config = inner.get_config()
    if type(inner) in _SGD:
        config["momentum"] = nesterov_coefficient(inner.momentum, k, num_stages)
        config["nesterov"] = True
        return rebuild(keras.optimizers.SGD, config, inner)
    config["beta_1"] = nesterov_coefficient(inner.beta_1, k, num_stages)
    config.pop("amsgrad", None)
    if type(inner) in _ADAM:
        config["momentum_decay"] = PAPER_MOMENTUM_DECAY
    elif type(inner) is keras.optimizers.Nadam:
        config["momentum_decay"] = 1.0
    return rebuild(Nadam, config, inner)
