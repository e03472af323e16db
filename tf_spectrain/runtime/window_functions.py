"""The traced window graphs of one pipeline: what they depend on, and one per window shape.

`WindowSetup` holds what every window graph of a pipeline reads besides its program (the
stage runners, the loss and metrics, the pass counters of the stall watch); `WindowFunctions`
traces one graph per window shape (`runtime.window_graph.WindowEmitter`) and keeps it across
`fit` calls; `window_keeps` says what each forward of a window keeps for its backward.
`runtime.window_epoch` runs them.
"""

import tensorflow as tf

from tf_spectrain.runtime.graphs import FlatCalls, graph_function
from tf_spectrain.runtime.loss_scale import shares_scale
from tf_spectrain.runtime.stage import ACTIVATIONS, INPUTS, WEIGHTS
from tf_spectrain.runtime.window_graph import WindowEmitter
from tf_spectrain.schedule import BACKWARD, FORWARD


class WindowSetup:
    """What every window graph of one pipeline depends on besides its program.

    Args:
        grid: R lists of N `StageRunner`s (one list without replicas), replica 0 first.
        logs: the `runtime.bookkeeping.BatchLogs` the graphs update (loss and metrics).
        micro_batches: M.
        report_stage: the stage whose updates report mini-batches (`EpochWindows`).
        accumulate: mini-batches per applied update (mode 2bw's `A`; else 1).
    """

    def __init__(self, grid, logs, micro_batches, report_stage, accumulate=1):
        self.grid = grid
        self.logs = logs
        self.micro_batches = micro_batches
        self.report_stage = report_stage
        self.accumulate = accumulate
        self.num_stages = len(grid[0])
        self.replicas = len(grid)
        self.clip_globally = any(r.global_clipnorm for r in grid[0])
        self.shared_scale = shares_scale(grid[0])
        self.waits_for_all_stages = self.clip_globally or self.shared_scale
        self.report_fn = graph_function(self._report, autograph=False, separate=True)
        # Each runner's finished passes, counted by the window graphs on this host's CPU and
        # read by the stall watch while a window runs.
        with tf.device("/CPU:0"):
            self.counters = [tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name=f"passes_{n}") for n in range(len(self.runners))]

    def _report(self, loss, size, pairs):
        """Adds a reported mini-batch to the loss and metrics, unless its loss is not finite."""

        def update():
            self.logs.update(loss, size, pairs)
            return tf.constant(True)

        return tf.cond(tf.math.is_finite(loss), update, lambda: tf.constant(False))

    def index(self, r, k):
        """The position of replica r's stage k in `runners`."""
        return r * self.num_stages + k

    @property
    def runners(self):
        """Every runner, replica 0's stages first."""
        return [runner for runners in self.grid for runner in runners]


class WindowFunctions:
    """The traced window graphs of one pipeline, by window shape.

    Args:
        setup: the pipeline's `WindowSetup`.

    Attributes:
        calls: the `runtime.graphs.FlatCalls` that call them.
    """

    def __init__(self, setup):
        self.setup = setup
        self._cache = {}
        self.calls = FlatCalls()  # how the window graphs are called (`graphs.FlatCalls`)

    def get(self, window, keeps, with_rates, timed=False, probe_plan=None, applies=None):
        """The graph function of `window` and the trace's notes (see `WindowEmitter`).

        Returns:
            `(function, notes, base)`: `function(xs, ys, rates, carried, samples)` returns a
            dict with `carried`, `losses`, `flags`, `times` (each pass's end with `timed`,
            else empty) and `probes` (the measurements of `probe_plan`, a
            `runtime.window_probes.ProbePlan`, whose mini-batches `samples` samples);
            `applies` (mode 2bw) are the mini-batches whose updates apply; `notes` is the
            list `WindowEmitter.notes`, filled when the function is first traced, for the
            window whose first reported mini-batch is `base`.
        """
        base = window.first
        skips = tuple(r.skip_non_finite for r in self.setup.runners)
        relative = tuple(sorted(((k, i - base, j), keep) for (k, i, j), keep in keeps.items()))
        probed = None if probe_plan is None else probe_plan.relative(base)
        applying = None if applies is None else tuple(sorted(i - base for i in applies))
        # Mode 2bw: where the window starts in a group of `accumulate` mini-batches decides
        # which held gradient each update adds to (`_group_gradient`), beyond `applies`.
        phase = base % self.setup.accumulate
        key = (window.shape(), relative, with_rates, skips, timed, probed, applying, phase)
        entry = self._cache.get(key)
        if entry is None:
            notes = []

            def body(xs, ys, rates, carried, samples):
                emitter = WindowEmitter(self.setup, window, keeps, xs, ys, rates, carried,
                                        timed, probe_plan, samples, applies)
                outputs = emitter.emit()
                notes[:] = emitter.notes
                return outputs

            entry = self._cache[key] = (graph_function(body, autograph=False), notes, base)
        return entry


def window_keeps(window, rules, plans, carries=None):
    """What each forward of `window` keeps (`runtime.loop.keep_rules`), given the window.

    A forward that keeps its activations keeps them for a backward in a later window too,
    where its stage `carries` them (`runtime.split_pass`: the forward's intermediates
    leave the window). Elsewhere such a forward cannot keep its activations: it keeps its
    weights where the backward reuses them, else only its inputs (the backward recomputes).

    Args:
        window: a `schedule.windows.Window`.
        rules: one keep rule per stage (`keep((i, j))`).
        plans: each stage's `modes.PassPlan`.
        carries: per stage, whether its activations can cross windows
            (`split_pass.supports_split` of its forward); None: no stage's can.

    Returns:
        `{(k, i, j): ACTIVATIONS | INPUTS | WEIGHTS}` for the window's forwards.
    """
    backwards = {(k, op.batch, op.micro) for k, op in window.program if op.kind == BACKWARD}
    keeps = {}
    for k, op in window.program:
        if op.kind != FORWARD:
            continue
        keep = rules[k]((op.batch, op.micro))
        if (keep == ACTIVATIONS and (k, op.batch, op.micro) not in backwards
                and not (carries and carries[k])):
            keep = WEIGHTS if plans[k].reuses_forward else INPUTS
        keeps[(k, op.batch, op.micro)] = keep
    return keeps
