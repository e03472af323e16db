"""Update directions `d`: what an optimizer's next update is estimated to add to a weight.

SpecTrain predicts `W_hat = W + s * d` (docs/SPECTRAIN.md, sections 4 and 6c). Which `d`
depends on the optimizer; `direction_rule(optimizer)` names the rule and `Direction` computes
`d` for one variable from the optimizer's state as it stands, changing nothing:

- `"momentum"`: SGD with momentum (not Nesterov): `d = m`, the momentum slot (SpecTrain's
  own rule).
- `"adam"`: Adam and AdamW: `d = -lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + eps)
  - lr * wd * W`, with `t` the optimizer's update count, `m`, `v` its slots (`v_hat` with
  amsgrad) and `wd` its weight decay for that variable; `d = 0` while `t = 0`.
- `"last_update"`: any other optimizer: the update it applied last, kept by the
  `SpecTrain` wrapper in one slot per variable.

Slots are found among the optimizer's public `variables` by their path, which Keras derives
from the weight's path (`adam/dense_kernel_momentum` for `dense/kernel`).
"""

import keras
from keras import ops

MOMENTUM = "momentum"
ADAM = "adam"
LAST_UPDATE = "last_update"
RULES = (MOMENTUM, ADAM, LAST_UPDATE)


def _uses_update_step_of(optimizer, cls):
    """Whether `optimizer` updates with `cls`'s own `update_step` (not a subclass' own)."""
    return isinstance(optimizer, cls) and type(optimizer).update_step is cls.update_step


def direction_rule(optimizer):
    """Names the rule that estimates `optimizer`'s next update.

    Args:
        optimizer: a Keras optimizer (not a wrapper such as `LossScaleOptimizer`).

    Returns:
        `"momentum"` for momentum SGD without Nesterov (Keras' own update rule),
        `"adam"` for Adam and AdamW (Keras' own update rule), else `"last_update"`. A
        subclass that overrides `update_step` gets `"last_update"`, as its rule is its own.
    """
    keeps_momentum = getattr(optimizer, "keeps_momentum", None)
    if keeps_momentum is not None:  # an optimizer that says it keeps SGD's momentum slot
        return MOMENTUM if keeps_momentum else LAST_UPDATE
    sgd = keras.optimizers.SGD
    if _uses_update_step_of(optimizer, sgd) and optimizer.momentum and not optimizer.nesterov:
        return MOMENTUM
    if _uses_update_step_of(optimizer, keras.optimizers.Adam):
        return ADAM
    return LAST_UPDATE


def slot_name(variable, slot):
    """The name Keras gives the slot `slot` of `variable` (`dense_kernel_momentum`)."""
    path = getattr(variable, "path", None) or variable.name
    return f"{path.replace('/', '_')}_{slot}"


def find_slot(optimizer, variable, slot):
    """Returns `optimizer`'s slot `slot` of `variable`, found among its variables by path.

    Args:
        optimizer: a built Keras optimizer.
        variable: one of the variables it was built with.
        slot: the slot's name suffix, such as `"momentum"` or `"velocity"`.

    Returns:
        The optimizer's `keras.Variable`.

    Raises:
        ValueError: no optimizer variable, or more than one, has that name and shape.
    """
    name = slot_name(variable, slot)
    found = [
        v for v in optimizer.variables
        if v.path.rsplit("/", 1)[-1] == name and tuple(v.shape) == tuple(variable.shape)
    ]
    if len(found) != 1:
        raise ValueError(
            f"Optimizer '{optimizer.name}' has {len(found)} variables named '{name}' "
            f"(its {slot} slot of '{variable.path}'), so SpecTrain cannot read the slot. "
            "Every weight needs a distinct path (give the layers distinct names), and the "
            "optimizer must be built with the weights it predicts."
        )
    return found[0]


class Direction:
    """Computes one variable's update direction `d` under a rule (see the module docstring).

    Args:
        optimizer: the built Keras optimizer whose updates are estimated.
        variable: the weight (a `keras.Variable`).
        rule: one of `RULES`.
        last_update: with `"last_update"`, the slot holding the last applied update.
    """

    def __init__(self, optimizer, variable, rule, last_update=None):
        self.variable = variable
        self.optimizer = optimizer
        if getattr(variable, "overwrite_with_gradient", False):
            rule = None  # overwritten, not updated: predicted as it is
        self.rule = rule
        if rule is None:
            self.slots = (None,)
        elif rule == MOMENTUM:
            self.slots = (find_slot(optimizer, variable, "momentum"),)
        elif rule == ADAM:
            velocity = "velocity_hat" if optimizer.amsgrad else "velocity"
            self.slots = (find_slot(optimizer, variable, "momentum"),
                          find_slot(optimizer, variable, velocity))
            self.decays = bool(optimizer.weight_decay) and _decays(optimizer, variable)
        else:
            self.slots = (last_update,)

    def value(self):
        """The direction `d` as a tensor of the variable's shape and dtype (reads only).

        `d` is a constant to differentiation: a gradient taken at `W + s * d` (through a
        tape watching `W`) is the gradient at those weights, not through AdamW's decay term.
        """
        if self.rule is None:
            return ops.zeros_like(self.variable)
        if self.rule != ADAM:
            return ops.stop_gradient(ops.convert_to_tensor(self.slots[0]))
        return ops.stop_gradient(self._adam())

    def _adam(self):
        """Adam's last step re-evaluated at the current count and weights."""
        opt, dtype = self.optimizer, self.variable.dtype
        m, v = (ops.convert_to_tensor(s) for s in self.slots)
        lr = ops.cast(opt.learning_rate, dtype)
        t = ops.cast(opt.iterations, dtype)
        started = ops.cast(ops.greater(t, 0), dtype)
        beta_1_power = ops.power(ops.cast(opt.beta_1, dtype), t)
        beta_2_power = ops.power(ops.cast(opt.beta_2, dtype), t)
        # t = 0 gives 0 / 0 below; `started` zeroes it and the denominator is kept positive.
        alpha = lr * ops.sqrt(1 - beta_2_power) / ops.maximum(1 - beta_1_power, 1e-30)
        step = ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), opt.epsilon))
        d = ops.negative(step)
        if self.decays:
            wd = ops.cast(opt.weight_decay, dtype)
            d = ops.subtract(d, ops.convert_to_tensor(self.variable) * (wd * lr))
        return d * started


def _decays(optimizer, variable):
    """Whether Keras' weight decay applies to `variable` (its exclusion lists)."""
    use = getattr(optimizer, "_use_weight_decay", None)  # Keras has no public form
    return True if use is None else bool(use(variable))
