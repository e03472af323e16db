"""Weight-prediction probes inside window graphs: `runtime.probe` for `steps_per_execution > 1`.

A `WeightProbe` measures, for sampled passes, `|W_used - W_target|` and `|W_stale -
W_target|`, where `W_target` is the stage's weights `h` updates after the pass (its
docstring says what each is). Pass by pass, the stage thread calls the probe around each
pass. In windows there is no Python between passes, so the window graph measures:

- `ProbePlan` (pure data, part of a window graph's cache key): which passes of the window
  are probed (the first micro-batch of each mini-batch, on stages with a probe, where the
  horizon is above 0) and the mini-batch whose update on that stage reaches each pass's
  target (`EpochWindows.update_after`), and which updates of the window reach targets.
- `ProbeEmitter` (graph side): after a probed pass, keeps the weights it used and the
  stage's current weights when the pass's mini-batch is sampled (a boolean input of the
  graph: sampling does not change the graph; an unsampled pass keeps empty tensors), carried
  across windows like any other state; after the update that reaches the target, computes
  the two distances.
- `WindowProbes` (Python side): builds each window's plan and samples, gives the probed
  passes their versions, and hands each finished measurement to its `WeightProbe`
  (`WeightProbe.add_result`), as the stage thread would have.

The measurements equal the pass-by-pass ones (the weights of every pass are the same). One
difference: a pass whose target update lies in the next epoch is not measured in windows
(each epoch's windows carry nothing past its end), while pass by pass it is.
"""

import dataclasses

import tensorflow as tf

from tf_spectrain.runtime.probe import distance
from tf_spectrain.schedule import BACKWARD, FORWARD, UPDATE


@dataclasses.dataclass(frozen=True)
class ProbePlan:
    """The probed passes and target updates of one window.

    Attributes:
        passes: `(runner index, kind, i, steps, t)` of each probed pass of the window:
            its mini-batch i, the version gap its weights used (None: the forward's), and
            the mini-batch t whose update on the stage reaches its target.
        targets: `(runner index, t, kind, i)` of each measurement an update of this window
            completes (the update of t; the pass of i, in this window or an earlier one).
    """

    passes: tuple = ()
    targets: tuple = ()

    def relative(self, base):
        """The plan with mini-batches counted from `base` (for the graph cache key)."""
        return (tuple((n, kind, i - base, steps, t - base) for n, kind, i, steps, t in self.passes),
                tuple((n, t - base, kind, i - base) for n, t, kind, i in self.targets))


def probe_sample_name(pass_key, base):
    """The input name of the sampled flag of a probed pass `(runner index, kind, i)`."""
    n, kind, i = pass_key
    return f"{n}/{kind}/{i - base}"


def pass_of(name, base):
    """The pass `probe_sample_name` named."""
    n, kind, i = name.split("/")
    return int(n), kind, int(i) + base


def _any_shape(tensors):
    """`tensors` with their static shapes forgotten (ranks kept)."""
    return [tf.compat.v1.placeholder_with_default(t, [None] * t.shape.rank) for t in tensors]


def _empty_like(tensors):
    return [tf.zeros([0] * t.shape.rank, t.dtype) for t in tensors]


class ProbeEmitter:
    """Writes a window's probes into the graph being traced (see the module docstring).

    Args:
        plan: the window's `ProbePlan`.
        samples: `{(runner index, kind, i): boolean scalar tensor}`, whether each pass of
            `plan.passes` is sampled.
        live: the emitter's dict of values carried between windows (probes keep theirs
            under `("probe", k, i, 0 | 1)`).
    """

    def __init__(self, plan, samples, live):
        self.samples = samples
        self.live = live
        self._passes = {(n, kind, i): (steps, t) for n, kind, i, steps, t in plan.passes}
        self._targets = {}
        for n, t, kind, i in plan.targets:
            self._targets.setdefault((n, t), []).append((kind, i))
        self.results = []  # float64 [error, baseline] per measurement, in program order
        self.notes = []  # ("probe", runner index, kind, i) for each result

    def after_pass(self, index, runner, kind, i, used=None):
        """After stage `runner`'s pass `kind` of mini-batch i (first micro-batch): keeps
        the weights it used (`used`, or `W + steps * d` read now) and the current ones."""
        planned = self._passes.get((index, kind, i))
        if planned is None:
            return
        steps, _ = planned
        passes = runner.passes
        sampled = self.samples[(index, kind, i)]
        like = passes.tf_trainable
        with tf.device(runner.device):
            if not like:
                kept = ([], [])
            else:
                def keep():
                    weights = used if used is not None else passes.weights(steps)
                    stale = [] if steps == 0 else passes.weights(0)
                    return ([tf.identity(w) for w in weights], [tf.identity(w) for w in stale])

                def skip():
                    return _empty_like(like), ([] if steps == 0 else _empty_like(like))

                kept = tf.cond(sampled, keep, skip)
        self.live[("probe", runner.k, i, int(kind == BACKWARD))] = (sampled, kept)

    def after_update(self, index, runner, t):
        """After stage `runner`'s update of t: measures the passes whose target it is."""
        passes = runner.passes
        for kind, i in self._targets.get((index, t), ()):
            sampled, (used, stale) = self.live.pop(("probe", runner.k, i, int(kind == BACKWARD)))
            with tf.device(runner.device):
                def measure(used=used, stale=stale):
                    # An unsampled pass carries empty tensors: no static shape to check.
                    used, stale = _any_shape(used), _any_shape(stale)
                    now = passes.weights(0)
                    return tf.cast(tf.stack([distance(used, now), distance(stale or used, now)]),
                                   tf.float64)

                result = tf.cond(sampled, measure, lambda: tf.zeros((2,), tf.float64))
            self.results.append(result)
            self.notes.append(("probe", index, kind, i))

    def outputs(self):
        """The `[n, 2]` float64 tensor of the measurements (error, baseline)."""
        return tf.stack(self.results) if self.results else tf.zeros((0, 2), tf.float64)


class WindowProbes:
    """The Python side of the probes of one windowed epoch (see the module docstring).

    Args:
        setup: the `runtime.window_functions.WindowSetup`.
        windows: the epoch's `schedule.windows.EpochWindows`.
        applies: `applies(i)`, whether U(i) applies (mode 2bw holds the others: a version
            is an applied update).
    """

    def __init__(self, setup, windows, applies):
        self.runners = setup.grid[0]  # probes measure replica 0's stages
        self.windows = windows
        self.applies = applies
        self._pending = {}  # (runner index, kind, i) -> the result being made (sampled)
        self._carried = {}  # (runner index, kind, i) -> t, of every probed pass in flight

    @property
    def active(self):
        """Whether any stage has a probe attached."""
        return any(r.probe is not None for r in self.runners)

    def plan(self, window):
        """The window's `ProbePlan` and samples `{(runner index, kind, i): bool}` (None, {}
        without probes).

        A pass is sampled as the stage threads sample it (`WeightProbe.sampled`), and left
        out while its stage has `max_pending` measurements waiting for their targets
        (counted in program order, which is each stage's own order). A sampled pass whose
        target lies past the epoch keeps its place until the epoch's end (pass by pass it
        waits into the next epoch, which windows do not follow).
        """
        if not self.active:
            return None, {}
        applies = self.applies
        passes, samples = [], {}
        waiting = {}  # runner index -> targets of its sampled measurements still waiting
        for (n, _, _), record in self._pending.items():
            waiting.setdefault(n, []).append(record["t"])
        for k, op in window.program:
            probe = self.runners[k].probe
            if probe is None or op.micro != 0:
                continue
            if op.kind == UPDATE:
                if applies(op.batch):
                    waiting[k] = [t for t in waiting.get(k, []) if t != op.batch]
                continue
            h_f, h_b = probe.horizons
            plan = self.runners[k].plan
            # As the stage threads tell their probe: the backward's gap None where it
            # reuses the forward's weights.
            if op.kind == FORWARD:
                horizon, steps = h_f, plan.forward_steps or 0
            else:
                horizon, steps = h_b, plan.backward_steps
            if horizon <= 0:
                continue
            t = self.windows.update_after(k, op, horizon, applies)
            sampled = (probe.sampled((op.batch, 0))
                       and len(waiting.get(k, [])) < probe.max_pending)
            if sampled:
                waiting.setdefault(k, []).append(t)
            if t is None:
                continue
            passes.append((k, op.kind, op.batch, steps, t))
            samples[(k, op.kind, op.batch)] = sampled
        updates = {(k, op.batch) for k, op in window.program
                   if op.kind == UPDATE and applies(op.batch)}
        # Every probed pass, sampled or not (an unsampled one carries empty tensors): the
        # plan, and so the window's graph, does not depend on which passes are sampled.
        earlier = [(n, t, kind, i) for (n, kind, i), t in self._carried.items()
                   if (n, t) in updates]
        here = [(k, t, kind, i) for k, kind, i, _, t in passes if (k, t) in updates]
        for n, _, kind, i in earlier:
            del self._carried[(n, kind, i)]
        self._carried.update({(k, kind, i): t for k, kind, i, _, t in passes
                              if (k, t) not in updates})
        return ProbePlan(tuple(passes), tuple(earlier + here)), samples

    def record(self, window, plan, samples, results, notes, shift):
        """After a window: starts the results of its sampled passes (their versions), then
        completes those its updates measured (`notes` traced `shift` mini-batches earlier)."""
        if plan is None:
            return
        done = {k: self.runners[k].updates for k in range(len(self.runners))}
        position = {}  # the stage's updates in this window before each of its passes
        counts = [0] * len(self.runners)
        for k, op in window.program:
            if op.kind == UPDATE:
                counts[k] += int(self.applies(op.batch))
            else:
                position[(k, op.kind, op.batch, op.micro)] = counts[k]
        for k, kind, i, _, t in plan.passes:
            if not samples[(k, kind, i)]:
                continue
            probe = self.runners[k].probe
            version = done[k] + position[(k, kind, i, 0)]
            horizon = probe.horizons[0 if kind == FORWARD else 1]
            self._pending[(k, kind, i)] = {
                "t": t, "epoch": probe.epoch, "batch": i + probe.offset,
                "used_version": version, "target_version": version + horizon}
        for (_, n, kind, i), (error, baseline) in zip(notes, results, strict=True):
            record = self._pending.pop((n, kind, i + shift), None)
            if record is None:  # not sampled
                continue
            probe = self.runners[n].probe
            probe.add_result(kind, record, float(error), float(baseline))
