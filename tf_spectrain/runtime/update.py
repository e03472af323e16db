"""The update half of one stage: the gradient its backwards add up, and the update that applies it.

`StageUpdate` keeps a stage's pending gradient from its backwards to its update (SPECTRAIN.md
section 5), sums it over the stage's replicas (`replicas.sum_over_replicas`) and applies it
with the stage's optimizer through the stage's `runtime.passes.StagePasses` graph functions:
clipped by the global norm over all stages (`clip_globally`), and under a dynamic loss scale
unscaled and skipped when not finite (`use_loss_scale`). Nothing is read back to the host
but the count of skipped updates, and only when asked for (`skipped`, `updates`).
"""

import tensorflow as tf

from tf_spectrain.runtime import replicas
from tf_spectrain.runtime.graphs import add_gradients, divided_gradient


class StageUpdate:
    """One stage's pending gradient and its update; `runtime.stage.StageRunner` owns one.

    Args:
        k: the stage index.
        device: the stage's device name.
        optimizer: the stage's own optimizer, built on `device`.
        passes: the stage's `runtime.passes.StagePasses`.

    Attributes:
        gradient: the pending gradient (a list of tensors), or None since the last update.
        skip_non_finite: whether `update` skips (and counts in `skipped`) a non-finite
            gradient.
        reducer: a `replicas.GradientReducer` summing the gradient over the stage's
            replicas with one collective all-reduce, or None.
    """

    def __init__(self, k, device, optimizer, passes):
        self.k = k
        self.device = device
        self.optimizer = optimizer
        self.passes = passes
        self.gradient = None
        self.skip_non_finite = False
        self.reducer = None
        self._held = None  # mode 2bw: the sum of the group's gradients so far
        self._count = 0  # ... over this many mini-batches
        self._scale = None  # with a dynamic loss scale: the pending gradient's scale
        self._flags = None  # ... and (received finite, own finite) of its backwards
        self._attempts = 0  # updates asked for (applied or skipped)
        self._ever_skipping = False  # whether `skipped` may be above 0

    def add(self, grads):
        """Adds one backward's weight gradient to the pending gradient."""
        if self.gradient is None:
            self.gradient = list(grads)
        else:
            self.gradient = [add_gradients(a, g) for a, g in zip(self.gradient, grads)]

    def note_scaled(self, scale, received, finite):
        """Keeps the pending gradient's scale and finite flags, over its micro-batches."""
        if self._flags is None:
            self._scale, self._flags = scale, (received, finite)
        else:
            before = self._flags
            self._flags = (tf.logical_and(before[0], received),
                           tf.logical_and(before[1], finite))

    def update(self, learning_rate=None, squares=None, finite=None, apply=True):
        """Applies the pending gradient with the optimizer (one update of the stage).

        Nothing is read back to the host: with `skip_non_finite` (or a dynamic loss
        scale), the update's own graph checks the gradient and skips (and counts in
        `skipped`) one that is not finite.

        Args:
            learning_rate: the learning rate of this update (a float), or None to keep the
                optimizer's (a schedule, or a value no callback changed).
            squares: with `clip_globally`, every stage's squared gradient norm of this
                mini-batch (scalar tensors, from `pending_square_norm`); else None.
            finite: with a shared (sync mode) dynamic loss scale, every stage's
                `pending_finite()` of this mini-batch; else None.
            apply: False to hold this mini-batch's gradient (summed over the replicas
                already) for a later update (mode "2bw", SPECTRAIN.md section 6e); an
                applied update applies the mean over the mini-batches held and its own.

        Returns:
            Whether an update was applied (or, when not finite, skipped): `apply`.

        Raises:
            RuntimeError: if no backward ran since the last update.
        """
        if self.gradient is None:
            raise RuntimeError(f"stage {self.k}: update without a backward before it")
        pending, self.gradient = self.gradient, None
        if learning_rate is not None:
            self.optimizer.learning_rate = learning_rate
        with tf.device(self.device):
            if self._held is not None:  # mode 2bw: the group's earlier mini-batches
                pending = [add_gradients(a, g) for a, g in zip(self._held, pending)]
            self._count += 1
            if not apply:
                self._held = pending
                return False
            count, self._held, self._count = self._count, None, 0
            if count > 1:
                pending = [divided_gradient(g, count) for g in pending]
        self._attempts += 1
        self._ever_skipping = self._ever_skipping or self.skip_non_finite
        squares = list(squares or [])
        if self.passes.loss_scale is not None:  # even without weights: the scale follows its rule
            scale, flags = self._scale, self._flags
            self._scale = self._flags = None
            self.passes.apply_scaled_fn(pending, squares, scale, flags, list(finite or []))
        elif self.passes.trainable:  # a stage without weights (e.g. only padding) has no update
            self.passes.apply_fn(pending, squares, self.skip_non_finite)
        return True

    def flush(self):
        """Applies the held gradients of an unfinished 2bw group (an epoch stopped early).

        Returns:
            Whether there was anything to apply.
        """
        if self._held is None:
            return False
        self.gradient, self._held, self._count = self._held, None, self._count - 1
        return self.update()

    def note_updates(self, count):
        """Counts `count` updates run outside `update` (in a window's graph)."""
        self._attempts += count
        self._ever_skipping = (self._ever_skipping or self.skip_non_finite
                               or self.passes.loss_scale is not None)

    def use_loss_scale(self, scale):
        """Turns on dynamic loss scaling (docs/SPECTRAIN.md, "Mixed precision").

        The last stage's backward scales the loss by the stage's scale; every backward
        brings its received gradient to the stage's scale and sends its input gradient
        with it (a `loss_scale.ScaledGradient`); `update` divides the gradient by it and
        skips (counting in `skipped`) a non-finite one, whatever `skip_non_finite` says.
        The optimizer's own `loss_scale_factor` is turned off, as `LossScaleOptimizer` does.

        Args:
            scale: the stage's `loss_scale.DynamicLossScale` (shared: sync mode's rule).
        """
        self.passes.loss_scale = scale
        self.passes.loss_scale_factor = None
        self.optimizer.loss_scale_factor = None
        self._ever_skipping = True

    def clip_globally(self, clipnorm):
        """Clips the updates to the norm `clipnorm` over all stages' gradients (sync mode).

        The optimizer stops clipping on its own; `update` scales the gradient from every
        stage's squared norm as Keras' `global_clipnorm` does over the whole model.
        """
        self.passes.global_clipnorm = float(clipnorm)
        self.optimizer.global_clipnorm = None

    def reduce_pending(self, gathered):
        """Replaces the pending gradient by its sum over the stage's replicas.

        Every copy must call it once per update, before `pending_square_norm` and `update`.

        Args:
            gathered: every replica's pending gradient of this update, replica 0 first
                (used without a `reducer`, see `replicas.sum_over_replicas`).
        """
        if self.gradient:
            self.gradient = replicas.sum_over_replicas(self.gradient, gathered, self.reducer,
                                                       self.device)

    def pending_finite(self):
        """Whether the pending gradient is all finite: a boolean tensor on the stage's device.

        Raises:
            RuntimeError: if no backward ran since the last update.
        """
        if self.gradient is None:
            raise RuntimeError(f"stage {self.k}: no pending gradient")
        with tf.device(self.device):
            return self.passes.finite_fn(self.gradient) if self.gradient else tf.constant(True)

    def pending_square_norm(self):
        """The squared L2 norm of the pending gradient, a scalar tensor on the stage's device.

        Returns:
            A float32 scalar tensor (0 for a stage without weights).

        Raises:
            RuntimeError: if no backward ran since the last update.
        """
        if self.gradient is None:
            raise RuntimeError(f"stage {self.k}: no pending gradient")
        with tf.device(self.device):
            return self.passes.square_fn(self.gradient) if self.gradient else tf.zeros(())

    @property
    def skipped(self):
        """Updates left out because their gradient was not finite (reads the device)."""
        return int(self.passes.skipped.numpy())

    @property
    def attempts(self):
        """Updates asked for so far, applied or skipped (no device read)."""
        return self._attempts

    @property
    def updates(self):
        """Updates applied so far (reads the device once an update could be skipped)."""
        return self._attempts - (self.skipped if self._ever_skipping else 0)

    def reset(self):
        """Forgets the pending gradient and its scale (after an aborted epoch)."""
        self.gradient = self._held = None
        self._count = 0
        self._scale = self._flags = None
