"""One pipeline stage: its sub-model on its device, its optimizer, and its three passes.

`StageRunner` runs the forward and backward passes of SPECTRAIN.md section 5 for one stage
and hands their weight gradients to its update half (`runtime.update.StageUpdate`: the
pending gradient, its sum over replicas, clipping, loss scaling and the update);
`build_runners` makes one runner per stage. All TensorFlow work runs in `tf.function`s
placed on the stage's device.
"""

import collections
import dataclasses
import time

import tensorflow as tf

from tf_spectrain import prediction
from tf_spectrain.cluster import health
from tf_spectrain.runtime import loss_scale as loss_scale_lib
from tf_spectrain.runtime.graphs import as_list, differentiable
from tf_spectrain.runtime.memory import StageMemory
from tf_spectrain.runtime.passes import StagePasses, with_penalty
from tf_spectrain.runtime.update import StageUpdate

ACTIVATIONS = "activations"
"""`StageRunner.forward(keep=...)`: keep the forward's activations (a tape) for its backward."""
INPUTS = "inputs"
"""Keep only the inputs (and non-trainable state); the backward recomputes the forward."""
WEIGHTS = "weights"
"""Keep the inputs and a copy of the forward's weights; the backward recomputes at those."""
_KEEPS = {True: ACTIVATIONS, False: INPUTS, ACTIVATIONS: ACTIVATIONS, INPUTS: INPUTS,
          WEIGHTS: WEIGHTS}


@dataclasses.dataclass
class _InFlight:
    """What stage k keeps of one mini-batch between its forward and its backward."""

    inputs: list
    tape: object = None  # a GradientTape holding the forward's activations, when reused
    outputs: object = None  # the taped outputs (or scaled loss on the last stage)
    non_trainable: list = None  # non-trainable values the forward saw, for a recompute
    weights: list = None  # the forward's trainable weights, when kept for the recompute
    labels: object = None
    scale: float = 1.0


class StageRunner:
    """Runs the passes of one stage (SPECTRAIN.md section 5).

    `forward(key, x)` runs the stage at the weights its `PassPlan` prescribes and keeps what
    the backward needs: its activations (a tape) when the backward uses the same weights,
    else only the input and non-trainable state, for a recompute. `backward(key, d)` is the
    exact vector-Jacobian product at the backward weights; its weight gradient waits in
    `updater` (a `runtime.update.StageUpdate`) for `update()`, which applies it with the
    optimizer.

    The last stage computes the loss in its forward (its `d` is the loss itself). `key` is
    `(i, j)`: mini-batch i, micro-batch j.

    Args:
        k: the stage index.
        model: the stage's placed sub-model (its variables live on `device`).
        device: a device name such as `"/GPU:1"`.
        optimizer: the stage's own optimizer, already built on `device` for the model's
            trainable variables. Predictions (`s > 0`) need a `tf_spectrain.SpecTrain`.
        plan: the stage's `modes.PassPlan`.
        loss: on the last stage, the loss function `loss(y_true, y_pred)`; else None.

    Layer losses (regularizers, `add_loss`) join the stage's objective, as in `model.fit`;
    `penalties[i]` keeps them per mini-batch for the reported loss. Each pass also flags,
    on the device and without a wait, whether its values are finite (in `events`, which
    `runtime.bookkeeping` reads); with `skip_non_finite`, `update` skips, and counts in `skipped`, a
    non-finite gradient. `probe` (a `runtime.probe.WeightProbe`, or None) measures
    prediction errors.
    """

    def __init__(self, k, model, device, optimizer, plan, loss=None):
        self.k = k
        self.model = model
        self.device = device
        self.optimizer = optimizer
        self.plan = plan
        self.loss = loss
        self.is_last = loss is not None
        if (plan.forward_steps or plan.backward_steps) and not hasattr(
                optimizer, "update_directions"):
            raise TypeError(
                f"Stage {k} predicts weights and needs a `tf_spectrain.SpecTrain` optimizer "
                f"(any Keras optimizer, wrapped). Received: {type(optimizer).__name__}"
            )
        self.passes = StagePasses(k, model, device, optimizer, loss)
        self.trainable = self.passes.trainable
        self.non_trainable = self.passes.non_trainable
        self.updater = StageUpdate(k, device, optimizer, self.passes)
        self._inflight = {}
        self._stashed = (None, None)  # (version, weights): the copy the forwards at it share
        self.penalties = {}  # i -> the stage's scaled layer losses of mini-batch i
        self.timeline = []  # (kind, key, start, end) of every pass, perf_counter seconds
        self.events = collections.deque(maxlen=64)  # (end, kind, key, finite flag tensor)
        self.probe = None
        self.memory = StageMemory(model, optimizer, device)  # what the stage keeps alive
        self._remote = health.task_of(device) is not None  # on a worker of a cluster

    @property
    def global_clipnorm(self):
        """Sync mode's global clipping norm over all stages (`clip_globally`), or None."""
        return self.passes.global_clipnorm

    @property
    def loss_scale(self):
        """The stage's `loss_scale.DynamicLossScale` (`StageUpdate.use_loss_scale`), or None."""
        return self.passes.loss_scale

    # --- passes -------------------------------------------------------------------------

    def _call_forward(self, inputs, labels, scale):
        """`passes.forward_fn` at the plan's forward weights (see the comment on a worker)."""
        if not self._remote:
            return self.passes.forward_fn(inputs, labels, scale, self.plan.forward_steps)
        # On a worker, called outside the stage's device scope (`_forward` places its ops
        # on the device itself). A graph function called under a remote device scope
        # returns before the worker has run it, and a GradientTape recording the call then
        # waits for the outputs' shapes holding Python's GIL: every thread of the trainer
        # (the workers' watchdog too) stalls for the pass, and for ever on a hung worker.
        # Called from here, the call itself waits, with the GIL released.
        with tf.device(None):
            return self.passes.forward_fn(inputs, labels, scale, self.plan.forward_steps)

    def forward(self, key, inputs, keep, labels=None, scale=1.0):
        """Forward pass of `key`, at the weights `W + s_f * m` of the stage's plan.

        Args:
            key: `(i, j)`.
            inputs: the stage's input tensors (a tensor or a list).
            keep: what to keep for the backward (`runtime.loop.keep_rules` decides):
                `ACTIVATIONS` (or True) when the backward uses the same weights as this
                forward, so its activations serve it; `INPUTS` (or False) to keep only the
                inputs and non-trainable state, the backward recomputing the forward at its
                own weights (the plan's `s_b`, or `s_f` where it reuses the forward's with
                no update in between); `WEIGHTS` to keep a copy of this forward's weights
                too, at which the backward recomputes (one copy per mini-batch, shared by
                its micro-batches).
            labels: on the last stage, the labels; else None.
            scale: the micro-batch's share of the mini-batch: the factor the stage's layer
                losses (and, on the last stage, the loss) are multiplied by.

        Returns:
            The output tensors to hand to the next stage (a list); on the last stage
            `(scaled_loss, logits)` instead.
        """
        start = time.perf_counter()
        inputs = as_list(inputs)
        record = _InFlight(inputs=inputs, labels=labels, scale=scale)
        keep = _KEEPS[keep]
        with tf.device(self.device):
            scale_t = tf.constant(scale, tf.float32)
            labels_t = labels if labels is not None else tf.zeros((), tf.float32)
            if keep == WEIGHTS:
                record.weights = self._stash_for(key[0])
            if keep == ACTIVATIONS:
                tape = tf.GradientTape(watch_accessed_variables=False, persistent=False)
                with tape:
                    tape.watch(differentiable(self.passes.input_targets(inputs)))
                    tape.watch(self.passes.tf_trainable)
                    outputs, penalty, logits, finite = self._call_forward(
                        inputs, labels_t, scale_t
                    )
                record.tape, record.outputs = tape, outputs + [penalty]
            else:
                record.non_trainable = [tf.identity(v.value) for v in self.non_trainable]
                outputs, penalty, logits, finite = self._call_forward(inputs, labels_t, scale_t)
        self._inflight[key] = record
        examples = int(inputs[0].shape[0] or 0) if record.tape is not None and inputs else 0
        kept = inputs + ([] if labels is None else tf.nest.flatten(labels))
        self.memory.kept(key, kept, examples, record.non_trainable or (), record.weights,
                         current=not self.plan.forward_steps)
        self.penalties.setdefault(key[0], []).append(penalty)
        end = time.perf_counter()
        self.timeline.append(("forward", key, start, end))
        self.events.append((end, "forward", key, finite))
        if self.probe is not None:
            self.probe.after_forward(key, self.plan.forward_steps)
        if self.is_last:
            return outputs[0], logits
        return outputs

    def backward(self, key, grads_out=None):
        """Backward pass of `key`: adds its weight gradient to the stage's pending gradient.

        Args:
            key: `(i, j)`, whose forward has run.
            grads_out: the gradient of the loss w.r.t. this stage's outputs (a list);
                None on the last stage. With a dynamic loss scale, a
                `loss_scale.ScaledGradient` (or None on the last stage).

        Returns:
            The gradient for the previous stage's outputs (a list); an empty list on stage 0,
            which computes no input gradient. With a dynamic loss scale, a
            `loss_scale.ScaledGradient` of it and the stage's scale.

        Raises:
            KeyError: if the forward of `key` has not run (or its backward already has).
        """
        start = time.perf_counter()
        record = self._inflight.pop(key)
        self.memory.released(key)
        with tf.device(self.device):
            grads_out, out_scale, received = self.passes.received(grads_out)
            output_grads = with_penalty(grads_out, out_scale)
            if record.tape is not None:
                grads = record.tape.gradient(
                    record.outputs,
                    self.passes.tf_trainable + self.passes.input_targets(record.inputs),
                    output_gradients=output_grads,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
                n = len(self.passes.tf_trainable)
                grads_w, grads_x = grads[:n], grads[n:]
            else:
                labels = record.labels if record.labels is not None else tf.zeros((), tf.float32)
                args = (record.inputs, output_grads, record.non_trainable, labels,
                        tf.constant(record.scale, tf.float32))
                if record.weights is not None:
                    grads_w, grads_x = self.passes.vjp_at_fn(*args, record.weights)
                else:
                    steps = self.plan.backward_steps
                    steps = self.plan.forward_steps if steps is None else steps
                    grads_w, grads_x = self.passes.recompute_vjp_fn(*args, steps)
            self.updater.add(grads_w)
            finite = self.passes.finite_fn(list(grads_w) + list(grads_x))
            if self.loss_scale is not None:
                self.updater.note_scaled(out_scale, received, finite)
        held = self._stashed[1]
        if held is not None and not any(r.weights is held for r in self._inflight.values()):
            self._stashed = (None, None)  # the last pass using the copy: it goes
        end = time.perf_counter()
        self.timeline.append(("backward", key, start, end))
        self.events.append((end, "backward", key, finite))
        if self.probe is not None:
            self.probe.after_backward(key, self.plan.backward_steps)
        if self.loss_scale is not None:
            return loss_scale_lib.ScaledGradient(list(grads_x), out_scale)
        return list(grads_x)

    def _stash_for(self, i):
        """The copy of mini-batch i's forward weights: one per weight version, made by the
        first forward at it and shared by the passes that follow until the next update."""
        version = (self.updater.attempts, i if self.plan.forward_steps else None)
        held, weights = self._stashed
        if held != version:
            weights = self.passes.snapshot_fn(self.plan.forward_steps)
            self._stashed = (version, weights)
        return weights

    # --- the update half (`runtime.update.StageUpdate`) ---------------------------------

    def update(self, learning_rate=None, squares=None, finite=None, apply=True):
        """Applies the pending gradient (`StageUpdate.update`), on the stage's timeline."""
        start = time.perf_counter()
        if self.updater.update(learning_rate, squares, finite, apply):  # 2bw may hold it
            self._updated(start)

    def flush(self):
        """Applies the held gradients of an unfinished 2bw group (`StageUpdate.flush`)."""
        start = time.perf_counter()
        if self.updater.flush():
            self._updated(start)

    def _updated(self, start):
        """After an applied update: the memory count, the timeline and the probe."""
        self.memory.updated()
        self.timeline.append(("update", None, start, time.perf_counter()))
        if self.probe is not None:
            self.probe.after_update()

    @property
    def skip_non_finite(self):
        """Whether `update` skips (and counts in `skipped`) a non-finite gradient."""
        return self.updater.skip_non_finite

    @skip_non_finite.setter
    def skip_non_finite(self, skip):
        self.updater.skip_non_finite = skip

    @property
    def pending_gradient(self):
        """The gradient waiting for `update` (a list of tensors), or None."""
        return self.updater.gradient

    def note_updates(self, count):
        """Counts `count` updates run outside `update` (`StageUpdate.note_updates`)."""
        self.updater.note_updates(count)

    def reduce_pending(self, gathered):
        """Sums the pending gradient over the stage's replicas (`StageUpdate.reduce_pending`)."""
        self.updater.reduce_pending(gathered)

    def clip_globally(self, clipnorm):
        """Clips by the global norm over all stages (sync mode; `StageUpdate.clip_globally`)."""
        self.updater.clip_globally(clipnorm)

    def pending_finite(self):
        """Whether the pending gradient is all finite (`StageUpdate.pending_finite`)."""
        return self.updater.pending_finite()

    def pending_square_norm(self):
        """The pending gradient's squared norm (`StageUpdate.pending_square_norm`)."""
        return self.updater.pending_square_norm()

    @property
    def skipped(self):
        """Updates left out because their gradient was not finite (reads the device)."""
        return self.updater.skipped

    @property
    def updates(self):
        """Updates applied so far (reads the device once an update could be skipped)."""
        return self.updater.updates

    # --- inference and state --------------------------------------------------------------

    def infer(self, inputs):
        """Inference forward at the current weights: `(outputs as a list, layer losses)`."""
        return self.passes.infer_fn(as_list(inputs))

    def current_weights(self, steps=0):
        """The trainable weights `W + steps * d` on the stage's device (`steps` > 0: SpecTrain)."""
        with tf.device(self.device):
            return self.passes.weights(steps)

    def reset(self):
        """Forgets in-flight state (after an aborted epoch)."""
        self._inflight.clear()
        self.memory.clear()
        self._stashed = (None, None)
        self.updater.reset()
        self.penalties.clear()
        if self.probe is not None:
            self.probe.reset()

    @property
    def in_flight(self):
        """How many micro-batches `(i, j)` have run their forward but not their backward."""
        return len(self._inflight)


def build_runners(stages, devices, plans, optimizer, loss, nesterov=False):
    """Builds one `StageRunner` per stage, each with its own copy of `optimizer` on its device.

    The last stage gets the loss.

    Args:
        stages: the placed stage sub-models, in order.
        devices: each stage's device name.
        plans: each stage's `modes.PassPlan`.
        optimizer: the compiled optimizer (cloned per stage, see
            `prediction.clone_optimizer`).
        loss: the compiled loss.
        nesterov: mode "nesterov": stage k gets the Nesterov form of `optimizer` with its
            delay's momentum (`prediction.nesterov_form`, SPECTRAIN.md section 6e).

    Returns:
        A list of `StageRunner`s, stage 0 first.
    """
    runners = []
    for k, (stage, device, plan) in enumerate(zip(stages, devices, plans)):
        with tf.device(device):
            stage_optimizer = (prediction.nesterov_form(optimizer, k, len(stages)) if nesterov
                               else prediction.clone_optimizer(optimizer))
            stage_optimizer.build(stage.trainable_variables)
        last_loss = loss if k == len(stages) - 1 else None
        runners.append(StageRunner(k, stage, device, stage_optimizer, plan, loss=last_loss))
    return runners
