"""The graph-side math of one stage: its forward, vector-Jacobian product and update.

`StagePasses` computes the passes of SPECTRAIN.md section 5 for one stage as functions of
tensors, keeping nothing between calls: `runtime.stage.StageRunner` calls them pass by pass
(as graph functions), and `runtime.window_graph` puts the passes of many mini-batches of
every stage into one graph. The module's helpers (`with_penalty`, `square_norm`,
`clip_globally`) are the pieces both callers share.
"""

import functools
import re

import tensorflow as tf

from tf_spectrain.partition.keras_nodes import one_or_list
from tf_spectrain.prediction.formula import predicted_weights
from tf_spectrain.runtime import loss_scale as loss_scale_lib
from tf_spectrain.runtime.graphs import (
    all_finite,
    as_list,
    differentiable,
    graph_function,
)
from tf_spectrain.workflow import sample_weights


def with_penalty(grads_out, loss_scale=None):
    """Output gradients for `outputs + [penalty]`: the penalty enters the loss as is.

    With a `loss_scale` (the optimizer's `loss_scale_factor`, or a dynamic scale: a float32
    tensor), the loss and the penalty are scaled by it, as `keras.Model.fit` scales the
    loss; the update divides it out.

    Args:
        grads_out: the gradients received for the stage's outputs (a list), or None on
            the last stage, whose outputs are scalar parts of the loss.
        loss_scale: None, a float or a float32 scalar tensor.

    Returns:
        The output gradients for `outputs + [penalty]`, or None (last stage, no scale).
    """
    if grads_out is None:
        return None if loss_scale is None else [loss_scale, loss_scale]
    one = 1.0 if loss_scale is None else loss_scale
    return list(grads_out) + [tf.convert_to_tensor(one, tf.float32)]


def _wide_dtype(grads):
    """float64 if any of `grads` is, else float32: the dtype of their norms."""
    return tf.float64 if any(g.dtype == tf.float64 for g in grads) else tf.float32


def square_norm(grads):
    """The sum of the squares of every element of `grads` (float64 if any of them is)."""
    dtype = _wide_dtype(grads)
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, dtype))) for g in grads])


def clip_globally(grads, squares, clipnorm, loss_scale_factor):
    """Scales `grads` as Keras' `clip_by_global_norm` does, from all stages' squared norms.

    Args:
        grads: this stage's gradients.
        squares: every stage's squared gradient norm (scalar tensors).
        clipnorm: the global norm to clip to.
        loss_scale_factor: None, or the factor the gradients are scaled by.

    Returns:
        The clipped gradients (NaN everywhere when the norm is not finite, as in Keras).
    """
    dtype = _wide_dtype(grads)
    norm = tf.sqrt(tf.add_n([tf.cast(x, dtype) for x in squares]))
    if loss_scale_factor is not None:  # the gradients are scaled; Keras clips unscaled ones
        norm = norm / tf.cast(loss_scale_factor, dtype)
    scale = clipnorm * tf.minimum(1.0 / norm, 1.0 / clipnorm)
    scale = scale + (norm - norm)  # NaN when the norm is not finite, as in Keras
    return [g * tf.cast(scale, g.dtype) for g in grads]


_KINDS = {"forward": "forward", "forward_at": "forward", "snapshot": "forward",
          "recompute_vjp": "backward", "vjp_at": "backward", "rescale": "backward",
          "finite": "backward", "apply": "update", "apply_scaled": "update",
          "square": "update", "infer": "inference"}
_FUNCTION_NAME = re.compile(r"tf_spectrain_stage(\d+)_([a-z_]+?)_fn")


def function_name(k, method):
    """The name of stage k's graph function of `method` (e.g. "forward_at")."""
    return f"tf_spectrain_stage{k}_{method}_fn"


def failed_function(error):
    """`(stage, pass kind)` of the first stage graph function an error message names, or
    None: what failed inside a nested call, whose caller the message does not name."""
    for k, method in _FUNCTION_NAME.findall(str(error)):
        if method in _KINDS:
            return int(k), _KINDS[method]
    return None


def _on_device(function, device):
    """`function` called under `tf.device(device)`: an XLA function runs, as one program,
    where it is called (the stage's variables are on `device`). `__wrapped__` is the
    function itself."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        with tf.device(device):
            return function(*args, **kwargs)

    return call


class StagePasses:
    """One stage's passes as TensorFlow functions of tensors (SPECTRAIN.md section 5).

    Each method runs inside a graph; the `*_fn` attributes are the same methods as graph
    functions (traced once per input signature), which a pass-by-pass caller calls eagerly
    and a window's graph calls nested, so that a window traces each stage's math once.

    Args:
        k: the stage index.
        model: the stage's placed sub-model (its variables live on `device`).
        device: a device name such as `"/GPU:1"`.
        optimizer: the stage's own optimizer, built on `device`; predictions need
            `update_directions` (a `tf_spectrain.SpecTrain`).
        loss: on the last stage, the loss function `loss(y_true, y_pred)`; else None.

    Attributes:
        loss_scale_factor: Keras' static `loss_scale_factor` of the optimizer (None: off).
        loss_scale: a dynamic `loss_scale.DynamicLossScale`, or None.
        global_clipnorm: sync mode's global clipping norm over all stages, or None.
        skipped: an int64 variable on the device counting the updates left out because
            their gradient was not finite.
    """

    def __init__(self, k, model, device, optimizer, loss=None):
        self.k = k
        self.model = model
        self.device = device
        self.optimizer = optimizer
        self.loss = loss
        self.is_last = loss is not None
        self.trainable = list(model.trainable_variables)
        self.non_trainable = list(model.non_trainable_variables)
        self.tf_trainable = [v.value for v in self.trainable]
        factor = getattr(optimizer, "loss_scale_factor", None)
        self.loss_scale_factor = None if factor is None else float(factor)
        self.loss_scale = None
        self.global_clipnorm = None
        with tf.device(device):
            self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped")
        self.jit_compile = False
        self._make_functions()

    def use_xla(self, jit_compile):
        """Compiles the stage's math passes (forwards, backwards, updates, inference) with
        XLA (`jit_compile=True`) or without; the small checks stay TensorFlow graphs."""
        if bool(jit_compile) != self.jit_compile:
            self.jit_compile = bool(jit_compile)
            self._make_functions()

    def _make_functions(self):
        """Sets the `*_fn` graph functions, named after the stage and pass
        (`function_name`), as errors from inside show them."""
        for attribute, method, math in (
            ("forward_fn", self.forward, True), ("forward_at_fn", self.forward_at, True),
            ("recompute_vjp_fn", self.recompute_vjp, True), ("vjp_at_fn", self.vjp_at, True),
            ("snapshot_fn", self.snapshot, True), ("apply_fn", self.apply, True),
            ("apply_scaled_fn", self.apply_scaled, True), ("infer_fn", self.infer, True),
            ("finite_fn", all_finite, False), ("square_fn", square_norm, False),
            ("rescale_fn", loss_scale_lib.rescale, False),
        ):
            name = function_name(self.k, attribute[: -len("_fn")])
            jit = self.jit_compile and math
            function = graph_function(method, autograph=False, name=name, separate=True,
                                      jit_compile=jit)
            setattr(self, attribute, _on_device(function, self.device) if jit else function)

    def weights(self, steps):
        """The trainable weights `W + steps * d` as tensors (the current ones for 0)."""
        if not steps:
            return [tf.convert_to_tensor(v) for v in self.tf_trainable]
        ds = self.optimizer.update_directions(self.trainable)
        return predicted_weights(self.tf_trainable, ds, steps)

    def input_targets(self, inputs):
        """The inputs whose gradient the previous stage needs (none on stage 0)."""
        return list(inputs) if self.k > 0 else []

    def run(self, weights, non_trainable, inputs, labels, scale):
        """The stage at `weights`: `(outputs, penalty, new_state, logits)`.

        `outputs` is the list of tensors to hand on (the last stage: `[loss * scale]`),
        `penalty` the stage's own layer losses (weight regularizers, `add_loss`) times
        `scale`, which `model.fit` adds to the loss, and `logits` the model output on the
        last stage (else None).
        """
        outputs, new_state, losses = self.model.stateless_call(
            weights, non_trainable, one_or_list(inputs), training=True, return_losses=True
        )
        penalty = tf.add_n([tf.cast(x, tf.float32) for x in losses]) if losses else 0.0
        penalty = tf.convert_to_tensor(penalty, tf.float32) * scale
        if not self.is_last:
            return as_list(outputs), penalty, new_state, None
        loss = sample_weights.loss_value(self.loss, labels, outputs)
        return [loss * tf.cast(scale, loss.dtype)], penalty, new_state, outputs

    def forward_at(self, weights, inputs, labels, scale):
        """The forward at `weights`; writes the new non-trainable state (BatchNorm).

        Returns:
            `(outputs, penalty, logits, finite)`. A pass that produced a non-finite value
            leaves the state as it was, so that on_nan="skip" keeps the model usable.
        """
        with tf.device(self.device):
            state = [v.value for v in self.non_trainable]
            outputs, penalty, new_state, logits = self.run(weights, state, inputs, labels, scale)
            finite = all_finite(outputs + [penalty] + list(new_state))
            for v, value in zip(self.non_trainable, new_state):
                v.assign(tf.where(finite, value, v.value))
            return outputs, penalty, logits, finite

    def forward(self, inputs, labels, scale, steps):
        """The forward at the weights `W + steps * d` (see `forward_at`)."""
        with tf.device(self.device):
            return self.forward_at(self.weights(steps), inputs, labels, scale)

    def recompute_vjp(self, inputs, output_grads, non_trainable, labels, scale, steps):
        """`vjp_at` the weights `W + steps * d` as they are now."""
        with tf.device(self.device):
            return self.vjp_at(inputs, output_grads, non_trainable, labels, scale,
                               self.weights(steps))

    def snapshot(self, steps):
        """A copy of the weights `W + steps * d`, for a backward that reuses them later."""
        with tf.device(self.device):
            return [tf.identity(w) for w in self.weights(steps)]

    def vjp_at(self, inputs, output_grads, non_trainable, labels, scale, weights):
        """The stage's forward recomputed at `weights`, and its vector-Jacobian product.

        Returns:
            `(weight gradients, input gradients)`, two lists.
        """
        with tf.device(self.device):
            with tf.GradientTape() as tape:
                tape.watch(differentiable(self.input_targets(inputs)))
                weights = [tf.convert_to_tensor(w) for w in weights]
                tape.watch(weights)
                outputs, penalty, _, _ = self.run(weights, non_trainable, inputs, labels, scale)
            grads = tape.gradient(
                outputs + [penalty],
                weights + self.input_targets(inputs),
                output_gradients=output_grads,
                unconnected_gradients=tf.UnconnectedGradients.ZERO,
            )
            return grads[: len(weights)], grads[len(weights) :]

    def apply(self, grads, squares, skip):
        """Clips by the global norm (given `squares`), then applies, or skips if not finite."""
        with tf.device(self.device):
            if squares:
                grads = clip_globally(grads, squares, self.global_clipnorm,
                                      self.optimizer.loss_scale_factor)
            if not skip:
                self.optimizer.apply_gradients(zip(grads, self.trainable))
                return tf.constant(True)
            finite = all_finite(grads)

            def apply():
                self.optimizer.apply_gradients(zip(grads, self.trainable))
                return tf.constant(True)

            done = tf.cond(finite, apply, lambda: tf.constant(False))
            self.skipped.assign_add(tf.cast(tf.logical_not(done), tf.int64))
            return done

    def apply_scaled(self, grads, squares, scale, flags, finite):
        """Under a dynamic loss scale: unscales and applies, or skips; then moves the scale.

        `flags` are (received finite, own finite) of the backwards; `finite` every stage's
        pending gradient's flag in sync mode, where all stages decide together.
        """
        with tf.device(self.device):
            if self.loss_scale.shared:
                applied = tf.reduce_all(tf.stack(finite)) if finite else all_finite(grads)
                halve = tf.constant(True)
            else:
                applied = tf.logical_and(flags[1], all_finite(grads))
                halve = flags[0]  # an overflow that came from downstream halved there

            def apply():
                unscaled = [g / tf.cast(scale, g.dtype) for g in grads]
                if squares:  # the squares are of the scaled gradients
                    unscaled = clip_globally(unscaled, squares, self.global_clipnorm, scale)
                self.optimizer.apply_gradients(zip(unscaled, self.trainable))
                return tf.constant(True)

            done = tf.cond(applied, apply, lambda: tf.constant(False)) if grads else applied
            self.loss_scale.after_update(done, halve)
            self.skipped.assign_add(tf.cast(tf.logical_not(done), tf.int64))
            return done

    def infer(self, inputs):
        """Inference forward: `(outputs as a list, the layer losses as a scalar)`."""
        with tf.device(self.device):
            outputs = as_list(self.model(one_or_list(inputs), training=False))
            losses = [tf.cast(x, tf.float32) for x in self.model.losses]
            return outputs, tf.add_n(losses) if losses else tf.zeros((), tf.float32)

    def received(self, grads_out):
        """`(output gradients, the scale they are at, whether they came finite)`.

        With a dynamic scale, the received gradient is brought to this stage's scale, so
        that the backward runs at it (docs/SPECTRAIN.md, "Mixed precision"); without one
        the scale is the static `loss_scale_factor` and the flag None.

        Args:
            grads_out: the received gradients (a list, or a `loss_scale.ScaledGradient`
                under a dynamic scale), or None on the last stage.
        """
        if self.loss_scale is None:
            return (None if grads_out is None else as_list(grads_out)), self.loss_scale_factor, None
        if grads_out is None:  # the last stage scales its loss by its own scale
            return None, tf.identity(self.loss_scale.scale.value), tf.constant(True)
        gradients, received_scale = grads_out
        return self.rescale_fn(as_list(gradients), received_scale, self.loss_scale.scale.value)
