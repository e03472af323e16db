"""One window of a pipeline epoch as one graph: every stage's passes, hand-offs inside it.

`WindowEmitter` writes a `schedule.windows.Window` into the graph being traced: each pass on
its stage's device (through the stage's `runtime.passes.StagePasses` graph functions, called
nested, so a window traces each stage's math once), activations and gradients handed from
stage to stage as tensors, the loss and metrics of each reported mini-batch updated inside
the graph. TensorFlow's executor then runs every op as soon as its inputs exist, so the
stages work side by side with no Python between passes.

Which weights each pass uses does not depend on how the epoch is cut: TensorFlow runs the
reads and writes of one variable in program order (automatic control dependencies), and the
program keeps each stage's own order (SPECTRAIN.md section 3). A forward that keeps its
activations for a backward in a later window runs as TensorFlow's forward function, whose
intermediates leave the window for the backward function there (`runtime.split_pass`,
SPECTRAIN.md section 3a). Where that cannot be (an XLA stage), or where the backward
recomputes anyway, the forward keeps its inputs and non-trainable state (and, where the
backward reuses the forward's weights, those weights), which leave the window as tensors,
and the backward recomputes the forward from them with the same weights and random state
(SPECTRAIN.md section 5).

Everything that crosses a window boundary is a dict of named tensors (`carried`): names
count mini-batches from the first one the next window reports, so that every window of the
same shape has the same inputs and outputs and reuses one traced graph
(`runtime.window_carried`, which also hands on, outside the graph, what a window holds
without computing it).
"""

import tensorflow as tf

from tf_spectrain.runtime.feed import batch_size, split_parts
from tf_spectrain.runtime.graphs import (
    add_gradients,
    as_list,
    differentiable,
    divided_gradient,
)
from tf_spectrain.runtime.loss_scale import ScaledGradient
from tf_spectrain.runtime.memory import per_example_bytes, tensor_bytes
from tf_spectrain.runtime.passes import with_penalty
from tf_spectrain.runtime.split_pass import stage_backward, stage_forward
from tf_spectrain.runtime.stage import ACTIVATIONS, WEIGHTS
from tf_spectrain.runtime.window_carried import arrivals, decode, outgoing
from tf_spectrain.runtime.window_errors import pass_name
from tf_spectrain.runtime.window_probes import ProbeEmitter, pass_of
from tf_spectrain.runtime.window_watch import PassMarks
from tf_spectrain.schedule import BACKWARD, FORWARD, UPDATE


class WindowEmitter:
    """Writes one window's program into the graph being traced (see the module docstring).

    Args:
        setup: the `runtime.window_functions.WindowSetup` (runners, keep rules, logs).
        window: the `schedule.windows.Window`.
        keeps: `{(k, i, j): keep}` for the window's forwards (what each keeps).
        xs, ys: `{name: batch}` of the fed inputs and the reported labels.
        rates: `{name: learning rate}` of the mini-batches updated here, or None.
        carried: `{name: value}` carried in from the previous window.
        timed: whether the graph also returns when each pass ended (`times`, `PassMarks`).
        probe_plan, samples: the window's `runtime.window_probes.ProbePlan` and
            `{name: bool}` of its sampled passes (`probe_sample_name`), or None and `{}`.
        applies: mode 2bw: the mini-batches whose updates in this window apply their
            group's gradient (the others hold theirs); None: every update applies.
    """

    def __init__(self, setup, window, keeps, xs, ys, rates, carried, timed=False,
                 probe_plan=None, samples=None, applies=None):
        self.setup = setup
        self.window = window
        self.keeps = keeps
        self.base = window.first
        self.rates = rates
        self.applies = applies
        self.live = {decode(name, self.base): value for name, value in carried.items()}
        self._arrived = arrivals(carried)
        self.tapes = {}
        self._backwards = {(k, op.batch, op.micro) for k, op in window.program
                           if op.kind == BACKWARD}
        self.flags = []  # (runner index, kind, (i, j), finite) in program order
        self.losses = []
        self.deferred = {}  # i -> stages whose update waits for every stage's backward of i
        # What each forward keeps and each backward frees, for `runtime.memory`:
        # ("kept", runner index, (i, j), bytes per example, fixed bytes, weight copy bytes
        # or None, whether a tape holds its activations) and ("released", index, (i, j));
        # also `window_carried.outgoing`'s ("through", ...) notes.
        self.notes = []
        self.finished = None  # a tensor computed once the pass just emitted is
        self.marks = PassMarks(setup, timed)  # the stall watch's counts, the passes' ends
        self.probes = None if probe_plan is None else ProbeEmitter(
            probe_plan, {pass_of(name, self.base): v for name, v in (samples or {}).items()},
            self.live)
        parts = setup.replicas * setup.micro_batches
        self.inputs = {int(n) + self.base: split_parts(x, parts) for n, x in xs.items()}
        self.labels = {int(n) + self.base: (split_parts(y, parts), batch_size(y))
                       for n, y in ys.items()}

    def emit(self):
        """Emits the whole program; returns the window graph's outputs."""
        for k, op in self.window.program:
            for r in range(self.setup.replicas) if op.kind != UPDATE else [0]:
                with tf.name_scope(pass_name(k, op.kind, op.batch - self.base, op.micro, r)):
                    if op.kind == FORWARD:
                        self._forward(k, op.batch, op.micro, r)
                    elif op.kind == BACKWARD:
                        self._backward(k, op.batch, op.micro, r)
                    else:
                        self._update(k, op.batch)
                        self.marks.time_update(k, op.batch)
                        continue
                    self.marks.count(self.finished, self.setup.index(r, k), op.kind,
                                     (op.batch, op.micro))
        if self.tapes:
            raise RuntimeError(f"tapes left in a window: {sorted(self.tapes)}")
        # Named from the next window's first mini-batch, which reads them.
        carried = outgoing(self.live, self._arrived, self.window.stop, self.notes)
        losses = tf.stack(self.losses) if self.losses else tf.zeros((0,), tf.float32)
        flags = tf.stack([f for *_, f in self.flags]) if self.flags else tf.zeros((0,), tf.bool)
        times = self.marks.times()
        self.notes += self.marks.notes
        probes = tf.zeros((0, 2), tf.float64)
        if self.probes is not None:
            probes = self.probes.outputs()
            self.notes += self.probes.notes
        return {"carried": carried, "losses": losses, "flags": flags, "times": times,
                "probes": probes}

    # --- passes ---------------------------------------------------------------------------

    def _part(self, i, j, r):
        return self.setup.micro_batches * r + j

    def _forward(self, k, i, j, r):
        setup = self.setup
        runner = setup.grid[r][k]
        passes, last = runner.passes, k == setup.num_stages - 1
        if k == 0:
            x, share = self.inputs[i][self._part(i, j, r)]
        else:
            x, share = self.live.pop(("act", k, i, j, r))
        inputs = as_list(x)
        labels = None
        if last:
            labels = self.labels[i][0][self._part(i, j, r)][0]
        keep = self.keeps[(k, i, j)]
        with tf.device(runner.device):
            labels_t = labels if labels is not None else tf.zeros((), tf.float32)
            record = {"inputs": inputs, "scale": share}
            if keep == WEIGHTS:
                stash = ("stash", k, i, r)
                if stash not in self.live:
                    self.live[stash] = passes.snapshot_fn(runner.plan.forward_steps)
                weights = self.live[stash]
            else:
                weights = passes.weights(runner.plan.forward_steps)
            if keep == ACTIVATIONS and (k, i, j) not in self._backwards:
                # Its backward comes in a later window: the intermediates go there.
                (outputs, penalty, logits, finite), self.live[("split", k, i, j, r)] = (
                    stage_forward(passes, (weights, inputs, labels_t, share)))
            elif keep == ACTIVATIONS:
                tape = tf.GradientTape(watch_accessed_variables=False, persistent=False)
                with tape:
                    tape.watch(differentiable(passes.input_targets(inputs)))
                    tape.watch(weights)
                    outputs, penalty, logits, finite = passes.forward_at_fn(
                        weights, inputs, labels_t, share)
                self.tapes[(k, i, j, r)] = (tape, outputs + [penalty], weights, inputs)
            else:
                record["non_trainable"] = [tf.identity(v.value) for v in passes.non_trainable]
                if labels is not None:
                    record["labels"] = labels
                outputs, penalty, logits, finite = passes.forward_at_fn(
                    weights, inputs, labels_t, share)
                # "recw": a record whose backward recomputes at the stashed weights.
                self.live[("recw" if keep == WEIGHTS else "rec", k, i, j, r)] = record
        self.live[("pen", k, i, j, r)] = penalty
        self.flags.append((setup.index(r, k), FORWARD, (i, j), finite))
        self.finished = finite  # all_finite of every output: computed once all are
        kept = inputs + ([] if labels is None else tf.nest.flatten(labels))
        self.notes.append((
            "kept", setup.index(r, k), (i, j), per_example_bytes(kept),
            tensor_bytes(record.get("non_trainable", [])),
            tensor_bytes(weights) if keep == WEIGHTS else None, keep == ACTIVATIONS,
        ))
        if self.probes is not None and r == 0 and j == 0:
            self.probes.after_pass(k, runner, FORWARD, i, used=weights)
        if last:
            self.live[("out", k, i, j, r)] = {"loss": outputs[0], "logits": logits,
                                              "labels": labels}
        else:
            self.live[("act", k + 1, i, j, r)] = (outputs, share)

    def _backward(self, k, i, j, r):
        setup = self.setup
        runner = setup.grid[r][k]
        passes = runner.passes
        received = None if k == setup.num_stages - 1 else self.live.pop(("grad", k, i, j, r))
        with tf.device(runner.device):
            grads_out, out_scale, came_finite = passes.received(received)
            output_grads = with_penalty(grads_out, out_scale)
            taped = self.tapes.pop((k, i, j, r), None)
            split = self.live.pop(("split", k, i, j, r), None)
            used = None  # the weights the backward used, where not recomputed from the plan
            if split is not None:
                used, grads_w, grads_x = stage_backward(passes, split, output_grads)
            elif taped is not None:
                tape, targets, weights, inputs = taped
                used = weights
                grads = tape.gradient(
                    targets, list(weights) + passes.input_targets(inputs),
                    output_gradients=output_grads,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
                n = len(weights)
                grads_w, grads_x = grads[:n], grads[n:]
            else:
                stashed = ("recw", k, i, j, r) in self.live
                record = self.live.pop(("recw" if stashed else "rec", k, i, j, r))
                labels = record.get("labels", tf.zeros((), tf.float32))
                args = (record["inputs"], output_grads, record["non_trainable"], labels,
                        record["scale"])
                if stashed:
                    used = self.live[("stash", k, i, r)]
                    grads_w, grads_x = passes.vjp_at_fn(*args, used)
                else:
                    steps = runner.plan.backward_steps
                    steps = runner.plan.forward_steps if steps is None else steps
                    grads_w, grads_x = passes.recompute_vjp_fn(*args, steps)
            if j == setup.micro_batches - 1:
                self.live.pop(("stash", k, i, r), None)  # the last micro-batch of i
            grads_w = list(grads_w)
            finite = passes.finite_fn(grads_w + list(grads_x))  # this micro-batch's own
            pending = ("pend", k, i, r)
            if pending in self.live:
                grads_w = [add_gradients(a, g) for a, g in zip(self.live[pending], grads_w)]
            self.live[pending] = grads_w
            if passes.loss_scale is not None:
                _note_scaled(self.live, ("scaled", k, i, r), out_scale, came_finite, finite)
        if self.probes is not None and r == 0 and j == 0:
            self.probes.after_pass(k, runner, BACKWARD, i, used=used)
        self.flags.append((setup.index(r, k), BACKWARD, (i, j), finite))
        self.finished = finite  # likewise, of every gradient
        self.notes.append(("released", setup.index(r, k), (i, j)))
        if k > 0:
            sent = list(grads_x)
            if passes.loss_scale is not None:
                sent = ScaledGradient(sent, out_scale)
            self.live[("grad", k - 1, i, j, r)] = sent

    # --- updates and reports ----------------------------------------------------------------

    def _update(self, k, i):
        setup = self.setup
        if not setup.waits_for_all_stages:
            self._apply(k, i, squares=None, finite=None)
            if k == setup.report_stage:
                self._report(i)
            return
        # Sync mode's global clipping or one loss scale: every stage's update of i needs
        # every stage's gradient of i, so they all run once the last one is ready.
        waiting = self.deferred.setdefault(i, [])
        waiting.append(k)
        if len(waiting) < setup.num_stages:
            return
        del self.deferred[i]
        squares = finite = None
        if setup.clip_globally:
            squares = [[self._square(r, s, i) for s in range(setup.num_stages)]
                       for r in range(setup.replicas)]
        if setup.shared_scale:
            finite = [[self._pending_finite(r, s, i) for s in range(setup.num_stages)]
                      for r in range(setup.replicas)]
        for s in sorted(waiting):
            self._apply(s, i, squares, finite)
        self._report(i)

    def _square(self, r, k, i):
        runner = self.setup.grid[r][k]
        pending = self._reduced(k, i)[r]
        with tf.device(runner.device):
            return runner.passes.square_fn(pending) if pending else tf.zeros(())

    def _pending_finite(self, r, k, i):
        runner = self.setup.grid[r][k]
        pending = self._reduced(k, i)[r]
        with tf.device(runner.device):
            return runner.passes.finite_fn(pending) if pending else tf.constant(True)

    def _reduced(self, k, i):
        """Every replica's pending gradient of stage k for i, summed over the replicas."""
        setup = self.setup
        key = ("sum", k, i)
        if key not in self.live:
            pendings = [self.live.pop(("pend", k, i, r)) for r in range(setup.replicas)]
            if setup.replicas == 1 or not pendings[0]:
                summed = pendings
            else:
                summed = []
                for r in range(setup.replicas):
                    with tf.device(setup.grid[r][k].device):
                        summed.append([tf.add_n([p[n] for p in pendings])
                                       for n in range(len(pendings[0]))])
            self.live[key] = summed
        return self.live[key]

    def _apply(self, k, i, squares, finite):
        setup = self.setup
        summed = self._reduced(k, i)
        del self.live[("sum", k, i)]
        if self.applies is not None:
            summed = group_gradient(setup, self.live, self.applies, k, i, summed)
            if summed is None:
                return  # held for the group's last update
        rate = None if self.rates is None else self.rates[str(i - self.base)]
        for r in range(setup.replicas):
            runner = setup.grid[r][k]
            passes = runner.passes
            with tf.device(runner.device):
                if rate is not None:
                    runner.optimizer.learning_rate = rate
                row = [] if squares is None else squares[r]
                if passes.loss_scale is not None:
                    scaled = self.live.pop(("scaled", k, i, r))
                    flags = (scaled["received"], scaled["finite"])
                    passes.apply_scaled_fn(summed[r], row, scaled["scale"], flags,
                                           [] if finite is None else finite[r])
                elif runner.trainable:
                    passes.apply_fn(summed[r], row, runner.skip_non_finite)
            if self.probes is not None and r == 0:
                self.probes.after_update(k, runner, i)

    def _report(self, i):
        """The loss of mini-batch i (layer losses included) and its metrics update."""
        setup = self.setup
        parts, penalties = [], []
        for r in range(setup.replicas):
            for j in range(setup.micro_batches):
                parts.append(self.live.pop(("out", setup.num_stages - 1, i, j, r)))
                for k in range(setup.num_stages):
                    penalties.append(self.live.pop(("pen", k, i, j, r)))
        loss = tf.add_n([tf.cast(p["loss"], tf.float32) for p in parts] + penalties)
        self.losses.append(loss)
        pairs = [(p["labels"], p["logits"]) for p in parts]
        setup.report_fn(loss, self.labels[i][1], pairs)


def _note_scaled(live, key, scale, received, finite):
    """Adds a micro-batch's loss-scale flags to its mini-batch's, under `key` in `live`."""
    if key not in live:
        live[key] = {"scale": scale, "received": received, "finite": finite}
    else:
        before = live[key]
        before["received"] = tf.logical_and(before["received"], received)
        before["finite"] = tf.logical_and(before["finite"], finite)


def group_gradient(setup, live, applies, k, i, summed):
    """Mode 2bw (SPECTRAIN.md 6e): adds mini-batch i's gradient (per replica, `summed`) to
    its group's in `live` (the group of `accumulate` mini-batches from `i - i % accumulate`,
    carried between windows); returns the group's mean where U(i) applies (i in
    `applies`), else None (held)."""
    first = i - i % setup.accumulate
    grouped = []
    for r in range(setup.replicas):
        held = live.pop(("held", k, first, r), None)
        with tf.device(setup.grid[r][k].device):
            grouped.append(summed[r] if held is None else
                           [add_gradients(a, g) for a, g in zip(held, summed[r])])
    if i not in applies:
        for r, grads in enumerate(grouped):
            live[("held", k, first, r)] = grads
        return None
    count = i - first + 1
    if count == 1:
        return grouped
    out = []
    for r, grads in enumerate(grouped):
        with tf.device(setup.grid[r][k].device):
            out.append([divided_gradient(g, count) for g in grads])
    return out

