"""`SpecTrain(optimizer)`: any Keras optimizer, able to predict weights a few updates ahead.

The wrapper trains exactly as the optimizer it wraps (every update, slot, learning-rate
schedule, weight decay and clipping is the inner optimizer's) and adds
`predicted_weights(variables, s) = W + s * d`, with `d` the inner optimizer's next-update
estimate (`tf_spectrain.prediction.directions`; docs/SPECTRAIN.md section 6c), computed by
`prediction.formula`.
"""

import keras
import tensorflow as tf
from keras import ops

from tf_spectrain.prediction import directions
from tf_spectrain.prediction.cloning import clone_optimizer
from tf_spectrain.prediction.formula import check_steps, is_real_number, predicted_weights
from tf_spectrain.prediction.slots import add_beside

DIRECTIONS = ("auto", directions.LAST_UPDATE)
_DELEGATED = (
    "weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema", "ema_momentum",
    "ema_overwrite_frequency", "loss_scale_factor", "gradient_accumulation_steps",
)


def describe(variable):
    """A variable's path (or name) for messages."""
    return getattr(variable, "path", None) or getattr(variable, "name", repr(variable))


def unwrapped(optimizer):
    """The Keras optimizer that does the updates, inside `SpecTrain` and `LossScaleOptimizer`.

    Args:
        optimizer: a Keras optimizer, possibly wrapped (several times).

    Returns:
        The innermost optimizer (`optimizer` itself when it wraps none).
    """
    while isinstance(optimizer, (SpecTrain, keras.optimizers.LossScaleOptimizer)):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _delegate(name):
    """A property that reads and writes the inner optimizer's `name`."""

    def get(self):
        return getattr(self.inner_optimizer, name)

    def set_(self, value):
        inner = self.__dict__.get("inner_optimizer")
        if inner is not None:  # the base class' __init__ sets defaults before it exists
            setattr(inner, name, value)

    return property(get, set_, doc=f"The inner optimizer's `{name}`.")


def _resolve_inner(optimizer):
    """The Keras optimizer to wrap, from an instance, a name or a config."""
    if isinstance(optimizer, SpecTrain):
        raise ValueError(
            "`optimizer` is already a `SpecTrain` optimizer; wrap the Keras optimizer "
            f"once. Received: optimizer={optimizer.name!r}"
        )
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "Wrap the other way round: `keras.optimizers.LossScaleOptimizer("
            "tf_spectrain.SpecTrain(optimizer))` (or let `compile` scale the loss of a "
            "mixed_float16 model). Received: SpecTrain(LossScaleOptimizer(...))"
        )
    try:
        inner = keras.optimizers.get(optimizer)
    except (ValueError, TypeError):
        inner = None
    if not isinstance(inner, keras.optimizers.Optimizer):
        raise ValueError(
            "`optimizer` must be a Keras optimizer instance or name, such as "
            "keras.optimizers.AdamW(1e-3) or 'adamw'. "
            f"Received: optimizer={optimizer!r}"
        )
    return inner


@keras.saving.register_keras_serializable(package="tf_spectrain")
class SpecTrain(keras.optimizers.Optimizer):
    """Wraps a Keras optimizer so that it can also predict weights `s` updates ahead.

    Training is the inner optimizer's, unchanged: `model.fit` with
    `SpecTrain(keras.optimizers.AdamW(3e-3))` gives the weights `AdamW(3e-3)` gives. Its
    learning rate, schedule, weight decay, clipping, loss scale factor, gradient
    accumulation and EMA are the inner optimizer's (read and set through the wrapper).

    `predicted_weights(variables, s)` returns `W + s * d`, where `d` is the optimizer's own
    estimate of its next update, computed from its state as it stands (nothing changes):

    - momentum SGD (no Nesterov): `d = m`, its momentum slot (the paper's rule);
    - Adam, AdamW: `d = -lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + eps)
      - lr * wd * W` at the current update count `t` and learning rate (the last step
      Keras' Adam took, re-evaluated now), and `d = 0` before the first update;
    - any other optimizer (RMSprop, Lion, Nadam, Nesterov SGD, ...), or
      `direction="last_update"`: the update it applied last, kept in one slot per
      variable (0 before the first update).

    `PipelineModel.compile` wraps an unwrapped optimizer in `mode="spectrain"`, so
    `compile(optimizer="adamw")` or `compile(optimizer=keras.optimizers.AdamW(3e-3))`
    works as it is. For loss scaling wrap this one:
    `keras.optimizers.LossScaleOptimizer(SpecTrain(...))`.

    Example:

    ```python
    opt = tf_spectrain.SpecTrain(keras.optimizers.AdamW(3e-3, weight_decay=0.01))
    opt.build(model.trainable_variables)
    w_hat = opt.predicted_weights(model.trainable_variables, steps=2)
    ```

    Args:
        optimizer: a Keras optimizer instance, or a name or config Keras resolves
            (`"adamw"`). Not a `LossScaleOptimizer` (wrap it around this instead).
        direction: `"auto"` (the rule of the optimizer, above) or `"last_update"`.
        name: the wrapper's name. Defaults to `"spectrain_" + optimizer.name`.

    Raises:
        ValueError: an optimizer Keras cannot resolve, a `LossScaleOptimizer` or an
            already wrapped one, or a bad `direction`.
    """

    def __init__(self, optimizer, direction="auto", name=None, **kwargs):
        inner = _resolve_inner(optimizer)
        if direction not in DIRECTIONS:
            raise ValueError(
                f"`direction` must be one of {list(DIRECTIONS)}. Received: "
                f"direction={direction!r}"
            )
        for key in list(kwargs):
            if key in _DELEGATED and kwargs[key] in (None, False, 0.99):
                kwargs.pop(key)  # base-class defaults in a config
        if kwargs:
            raise ValueError(
                f"`SpecTrain` takes no optimizer settings ({', '.join(sorted(kwargs))}): "
                "set them on the optimizer it wraps, e.g. "
                "SpecTrain(keras.optimizers.AdamW(1e-3, clipnorm=1.0))."
            )
        super().__init__(learning_rate=0.0, name=name or f"spectrain_{inner.name}")
        self.inner_optimizer = inner
        self.direction = direction
        self.last_updates = []
        self._directions = {}

    # --- state --------------------------------------------------------------------------

    @property
    def rule(self):
        """The rule of `d`: `"momentum"`, `"adam"` or `"last_update"`."""
        if self.direction == directions.LAST_UPDATE:
            return directions.LAST_UPDATE
        return directions.direction_rule(self.inner_optimizer)

    @property
    def variables(self):
        """The inner optimizer's variables, then the wrapper's last-update slots (if any)."""
        return list(self.inner_optimizer.variables) + list(self.last_updates)

    @property
    def iterations(self):
        """The inner optimizer's update count."""
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        """The inner optimizer's current learning rate."""
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        inner = self.__dict__.get("inner_optimizer")
        if inner is not None:
            inner.learning_rate = learning_rate

    def build(self, variables):
        """Builds the inner optimizer and, for the last-update rule, one slot per variable.

        Build eagerly under the stage's device (`with tf.device(d): opt.build(vars)`); the
        wrapper's slots are placed beside their weights either way.

        Args:
            variables: the trainable variables this optimizer will update.
        """
        if self.built:
            return
        variables = list(variables)
        self.inner_optimizer.build(variables)
        # Not the base class' build: it would add EMA averages or gradient accumulators
        # of the wrapper's own, beside the inner optimizer's.
        self._trainable_variables = variables[:]
        self._trainable_variables_indices = {self._var_key(v): i for i, v in enumerate(variables)}
        self.built = True
        if self.rule == directions.LAST_UPDATE:
            self.last_updates = [
                self.add_variable_from_reference(v, name="last_update") for v in variables
            ]
        self._directions = {}
        for i, v in enumerate(variables):
            slot = self.last_updates[i] if self.last_updates else None
            self._directions[self._var_key(v)] = directions.Direction(
                self.inner_optimizer, v, self.rule, last_update=slot
            )

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        """Adds a wrapper variable (`name`, zeros by default) beside `reference_variable`."""
        return add_beside(super().add_variable_from_reference, reference_variable,
                          name=name, initializer=initializer)

    # --- update -------------------------------------------------------------------------

    def apply(self, grads, trainable_variables=None):
        """Applies the inner optimizer's update (and records it for the last-update rule).

        Args:
            grads: the gradients, one per variable.
            trainable_variables: the variables (optional once built).
        """
        if not self.built:
            self.build(trainable_variables)
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(self._trainable_variables))
        kept = [(d.slots[0], v) for d, v in ((self._direction(v), v) for v in variables)
                if d.rule == directions.LAST_UPDATE]
        if not kept:
            self.inner_optimizer.apply(grads, trainable_variables)
            return
        count = ops.copy(ops.convert_to_tensor(self.inner_optimizer.iterations))
        before = [ops.copy(ops.convert_to_tensor(v)) for _, v in kept]
        self.inner_optimizer.apply(grads, trainable_variables)
        # A call that only accumulates a gradient (`gradient_accumulation_steps`) leaves
        # the update count, and so the last update, as they were.
        updated = ops.greater(ops.convert_to_tensor(self.inner_optimizer.iterations), count)
        for (slot, v), w in zip(kept, before):
            slot.assign(ops.where(updated, ops.subtract(v, w), slot))

    def apply_gradients(self, grads_and_vars):
        """Applies `(gradient, variable)` pairs, as Keras optimizers do.

        Args:
            grads_and_vars: an iterable of `(gradient, variable)` pairs.

        Returns:
            The inner optimizer's iteration count.
        """
        grads, variables = zip(*grads_and_vars)
        self.apply(grads, variables)
        return self.iterations

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Excludes variables from the inner optimizer's weight decay (as in Keras).

        Args:
            var_list: variables to exclude.
            var_names: names (substrings) of variables to exclude.
        """
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    def scale_loss(self, loss):
        """Scales the loss by the inner optimizer's `loss_scale_factor` (as Keras does)."""
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        """Lets the inner optimizer finish (its EMA), as at the end of `fit`."""
        self.inner_optimizer.finalize_variable_values(var_list)

    # --- prediction ---------------------------------------------------------------------

    def _direction(self, variable):
        """The `Direction` of `variable`, or a clear error."""
        if not isinstance(variable, (keras.Variable, tf.Variable)):
            raise TypeError(
                "`variable` must be a `keras.Variable` (or a `tf.Variable`). "
                f"Received: variable={variable!r} of type {type(variable).__name__}"
            )
        if not self.built:
            raise ValueError(
                f"Optimizer '{self.name}' is not built yet, so it cannot predict "
                f"'{describe(variable)}'. Call `optimizer.build(trainable_variables)` "
                "first (eagerly, under the stage's device)."
            )
        found = self._directions.get(self._var_key(variable))
        if found is None:
            raise ValueError(
                f"Unknown variable '{describe(variable)}': optimizer '{self.name}' was "
                f"built with {len(self._directions)} other variables and predicts only "
                "those. Pass one of the variables it was built with, or use a new "
                "optimizer (e.g. `clone_for_stage()`) for another set of variables."
            )
        return found

    def update_directions(self, variables):
        """Computes `d` for each variable (see the class docstring); changes no state.

        Args:
            variables: a list of trainable variables the optimizer was built with.

        Returns:
            A list of tensors, one per variable, each of its shape and dtype.

        Raises:
            TypeError, ValueError: see `predicted_weights`.
        """
        if isinstance(variables, (keras.Variable, tf.Variable)):
            raise TypeError(
                "`variables` must be a list of variables, not a single variable. "
                f"Received: variables={describe(variables)}; pass [variable] instead."
            )
        return [self._direction(v).value() for v in variables]

    def predicted_weights(self, variables, steps):
        """Predicts the weights `steps` updates ahead: `W + steps * d` for each variable.

        Reads each variable and the optimizer's state as they stand and changes nothing
        (no variable, no slot, not `iterations`). Works eagerly and inside `tf.function`.

        Args:
            variables: a list of trainable variables the optimizer was built with.
                Non-trainable state (BatchNorm moving statistics) is never predicted.
            steps: the version gap `s`, a Python number >= 0 or a scalar tensor.
                `steps=0` returns the current values.

        Returns:
            A list of tensors, one per variable, in the order of `variables`.

        Raises:
            TypeError: `variables` is a single variable, or `steps` is not a number or a
                tensor.
            ValueError: `steps` is negative or not a scalar, the optimizer is not built,
                or a variable is unknown to it.
        """
        steps = check_steps(steps)
        ds = self.update_directions(variables)
        if is_real_number(steps) and steps == 0:
            return [ops.convert_to_tensor(v) for v in variables]
        return predicted_weights(variables, ds, steps)

    # --- configuration ------------------------------------------------------------------

    def get_config(self):
        """Returns `{"name", "optimizer" (the inner one, serialised), "direction"}`."""
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "direction": self.direction,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuilds an unbuilt wrapper (and its inner optimizer) from `get_config()`."""
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)

    def clone_for_stage(self):
        """A new, unbuilt `SpecTrain` around a `clone_optimizer` of the inner optimizer."""
        return type(self)(clone_optimizer(self.inner_optimizer), direction=self.direction,
                          name=self.name)


for _name in _DELEGATED:
    setattr(SpecTrain, _name, _delegate(_name))
del _name
