"""Dynamic loss scaling of float16 pipelines: Keras' `LossScaleOptimizer` rule, per stage.

`resolve` decides, as `keras.Model.compile` does, whether a pipeline scales its loss and
unwraps a `LossScaleOptimizer`; `DynamicLossScale` is one stage's scale and growth counter
(device variables, updated inside the update's graph); `ScaledGradient` is a gradient
hand-off with the scale it is scaled by. The rules (one scale in sync mode, one per stage
in the asynchronous modes) are docs/SPECTRAIN.md, "Mixed precision and loss scaling".
"""

import dataclasses
import typing

import keras
import tensorflow as tf

from tf_spectrain.runtime.graphs import all_finite

# Keras' `LossScaleOptimizer` defaults, which `keras.Model.compile` uses for mixed_float16.
INITIAL_SCALE = 2.0**15
GROWTH_STEPS = 2000


@dataclasses.dataclass(frozen=True)
class LossScaleSettings:
    """How a dynamic loss scale starts and grows (`LossScaleOptimizer`'s arguments).

    Attributes:
        initial_scale: the scale before the first update.
        growth_steps: the scale doubles after this many applied updates in a row.
    """

    initial_scale: float = INITIAL_SCALE
    growth_steps: int = GROWTH_STEPS


class ScaledGradient(typing.NamedTuple):
    """A gradient hand-off from stage k to stage k-1 under loss scaling.

    Attributes:
        gradients: the gradient of the scaled loss w.r.t. stage k-1's outputs (a list, in
            the compute dtype).
        scale: the float32 scalar tensor the loss was scaled by for them (stage k's scale).
    """

    gradients: list
    scale: object


def resolve(optimizer, model, auto_scale_loss=True):
    """The optimizer each stage copies, and whether (and how) the pipeline scales its loss.

    As in `keras.Model.compile`: a `keras.optimizers.LossScaleOptimizer` scales with its
    `initial_scale` and `dynamic_growth_steps`; any other optimizer is scaled with Keras'
    defaults when `auto_scale_loss` and the model's dtype policy is `mixed_float16`. A
    scaled optimizer's own `loss_scale_factor` is not used (`LossScaleOptimizer` turns it
    off, and so do the stages).

    Args:
        optimizer: the resolved optimizer.
        model: the wrapped `keras.Model`.
        auto_scale_loss: whether a `mixed_float16` model scales its loss by default.

    Returns:
        `(optimizer, settings)`: the inner optimizer of a `LossScaleOptimizer` (else
        `optimizer`), and a `LossScaleSettings`, or None without loss scaling.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        settings = LossScaleSettings(float(optimizer.initial_scale),
                                     int(optimizer.dynamic_growth_steps))
        return optimizer.inner_optimizer, settings
    if auto_scale_loss and model.dtype_policy.name == "mixed_float16":
        return optimizer, LossScaleSettings()
    return optimizer, None


def check_replicas(settings, mode, replicas):
    """Refuses per-stage loss scales with replicas, whose copies could disagree.

    Raises:
        ValueError: loss scaling in an asynchronous mode with `replicas > 1`.
    """
    if settings is not None and mode != "sync" and replicas > 1:
        raise ValueError(
            "Dynamic loss scaling (a mixed_float16 model or a LossScaleOptimizer) with "
            f"replicas needs mode='sync': in mode={mode!r} every stage keeps its own scale, "
            "and the copies of a stage would skip different updates. Use mode='sync', "
            "replicas=1, or mixed_bfloat16 (no loss scaling). "
            f"Received: mode={mode!r}, replicas={replicas}"
        )


class DynamicLossScale:
    """One stage's dynamic loss scale S and its growth counter, variables on its device.

    After an applied update the counter counts it, and once `growth_steps` applied updates
    followed each other S doubles and the counter restarts; after a skipped update with
    `halve`, S halves and the counter restarts; after a skipped update without `halve`
    both stay as they are. With `halve` always true this is `LossScaleOptimizer`'s rule.

    Args:
        settings: a `LossScaleSettings`.
        device: the stage's device.
        shared: True in sync mode, where every stage's copy of the one scale takes the
            same decisions (from every stage's gradient); False for a per-stage scale.
    """

    def __init__(self, settings, device, shared):
        self.settings = settings
        self.shared = shared
        with tf.device(device):  # Keras variables, as the optimizer's (checkpoints read them)
            self.scale = keras.Variable(float(settings.initial_scale), dtype="float32",
                                        trainable=False, name="loss_scale")
            self.counter = keras.Variable(0, dtype="int64", trainable=False,
                                          name="loss_scale_counter")

    @property
    def variables(self):
        """`[scale, counter]`: what a checkpoint saves."""
        return [self.scale, self.counter]

    def after_update(self, applied, halve):
        """Moves the scale and counter after one update (call inside the update's graph).

        Args:
            applied: a boolean scalar tensor: the update was applied.
            halve: a boolean scalar tensor: a skipped update halves the scale.
        """
        counter = tf.convert_to_tensor(self.counter.value)
        grow = tf.logical_and(applied, tf.equal(counter, self.settings.growth_steps - 1))
        shrink = tf.logical_and(tf.logical_not(applied), halve)
        restart = tf.logical_or(grow, shrink)
        self.counter.assign(tf.where(restart, tf.zeros_like(counter),
                                     tf.where(applied, counter + 1, counter)))
        factor = tf.where(grow, 2.0, tf.where(shrink, 0.5, 1.0))
        self.scale.assign(tf.convert_to_tensor(self.scale.value) * factor)


def rescale(gradients, received_scale, scale):
    """Brings received gradients from the scale they came with to this stage's scale.

    Multiplies by `scale / received_scale` in float32 (float64 for float64 gradients) and
    casts back to each gradient's dtype; a factor of 1 changes nothing.

    Args:
        gradients: the received gradient tensors.
        received_scale: the float32 scale they are scaled by.
        scale: this stage's scale (a float32 variable or tensor).

    Returns:
        `(gradients, scale, finite)`: the rescaled gradients, this stage's scale as a
        tensor (what its backward runs at), and whether the received ones were all finite.
    """
    finite = all_finite(gradients)
    scale = tf.identity(scale)
    ratio = scale / received_scale
    out = []
    for g in gradients:
        if not g.dtype.is_floating:
            out.append(g)
            continue
        wide = tf.float64 if g.dtype == tf.float64 else tf.float32
        out.append(tf.cast(tf.cast(g, wide) * tf.cast(ratio, wide), g.dtype))
    return out, scale, finite


def attach(runners, settings, shared):
    """Gives each runner its own `DynamicLossScale` (nothing when `settings` is None).

    Args:
        runners: `StageRunner`s (every replica's).
        settings: a `LossScaleSettings`, or None.
        shared: sync mode: the copies form one scale for the whole pipeline.
    """
    if settings is None:
        return
    for runner in runners:
        runner.updater.use_loss_scale(DynamicLossScale(settings, runner.device, shared))


def shares_scale(runners):
    """True when `runners` scale their loss with one shared scale (sync mode)."""
    scale = getattr(runners[-1], "loss_scale", None)
    return scale is not None and scale.shared
