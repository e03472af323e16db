"""Measures how far the weights a pass used are from the weights it aimed at.

`WeightProbe`, attached to a stage by `attach_probes` (which the `Telemetry` callback calls
through `PipelineState.attach_probes`), samples passes and compares their weights with the
weights the stage really reaches later; its docstring says what is measured.
"""

import threading
import time

import tensorflow as tf

from tf_spectrain.runtime.graphs import graph_function
from tf_spectrain.schedule import modes

__all__ = ["WeightProbe", "attach_probes", "detach_probes"]


def distance(a, b):
    """The Euclidean distance between two lists of tensors (0 for a weightless stage)."""
    squares = [tf.reduce_sum(tf.square(x - y)) for x, y in zip(a, b)]
    if not squares:
        return tf.zeros((), tf.float32)
    return tf.sqrt(tf.add_n(squares))


class WeightProbe:
    """Samples passes of one stage and measures their weight error.

    SpecTrain predicts, for a pass of mini-batch i on stage k, the weights the stage will hold
    `h` updates later (`W_hat = W + s * m`). Whether the prediction is good can only be seen
    later: when the stage has really applied those `h` updates, the probe compares

        error    = |W_used  - W_target|     (the weights the pass computed with)
        baseline = |W_stale - W_target|     (the stage's weights at the time of the pass,
                                             which naive pipelining would have used)

    with `|.|` the L2 norm over all the stage's trainable weights, and reports
    `ratio = error / baseline` (below 1: the prediction beats using stale weights; 0: perfect).
    For vanilla and stash, which do not predict, `W_used == W_stale` and the distance is the
    staleness itself. The horizon `h` of each pass comes from `modes.probe_horizons`.

    The probe runs in the stage's own thread, on sampled mini-batches only: it copies the used
    and the current weights on the stage's device when the pass runs (one copy where they are
    the same) and computes the two norms right after the update that reaches the target
    version, in `tf.function`s, without waiting for the results: the main thread reads them
    when it takes the results. `seconds` counts the time the probe adds to the stage's thread.

    Args:
        runner: the stage's `StageRunner` (weights, device, plan, update count).
        horizons: `(h_forward, h_backward)` from `modes.probe_horizons`.
        every: measure mini-batches `i` with `i % every == 0` (in each epoch).
        max_pending: at most this many measurements wait for their target at once;
            further samples are skipped until older ones complete (bounds memory).
    """

    def __init__(self, runner, horizons, every, max_pending=4):
        self.runner = runner
        self.horizons = horizons
        self.every = every
        self.max_pending = max_pending
        self._pending = []  # dicts waiting for their target version
        self._stash = {}  # key -> forward weights (for a backward that reuses them)
        self._lock = threading.Lock()
        self._results = []
        self.epoch = 0  # set by the caller at each epoch start: recorded with each pass
        self.offset = 0  # mini-batches of the epoch done before this fit (resumed runs)
        self.seconds = 0.0
        self._copy_fn = graph_function(self._copy, reduce_retracing=False)
        self._distances_fn = graph_function(self._distances, reduce_retracing=False)

    def sampled(self, key):
        """Whether the pass of `key = (i, j)` is measured (the first micro-batch of every
        `every`-th mini-batch, counted from the epoch's start)."""
        return key[1] == 0 and (key[0] + self.offset) % self.every == 0

    def _copy(self, steps):
        with tf.device(self.runner.device):
            return [tf.identity(w) for w in self.runner.current_weights(steps)]

    def _distances(self, used, stale):
        with tf.device(self.runner.device):
            target = self.runner.current_weights(0)  # the weights now
            return distance(used, target), distance(stale, target)

    def _snapshot(self, steps):
        return self._copy_fn(steps)

    def _watch(self, kind, key, used, horizon, stale=None):
        if len(self._pending) >= self.max_pending:
            return
        version = self.runner.updates
        self._pending.append(
            {
                "pass": kind,
                "epoch": self.epoch,
                "batch": key[0] + self.offset,
                "used": used,
                "stale": self._snapshot(0) if stale is None else stale,
                "version": version,
                "target": version + horizon,
            }
        )

    def after_forward(self, key, steps):
        """Called by the stage after the forward of `key`: snapshots the weights it used.

        Only the first micro-batch of sampled mini-batches is measured.

        Args:
            key: `(i, j)` of the pass.
            steps: the forward's version gap: it used `W + steps * m`.
        """
        if not self.sampled(key):
            return
        h_f, h_b = self.horizons
        needs_stash = self.runner.plan.reuses_forward and h_b > 0
        if h_f <= 0 and not needs_stash:
            return
        start = time.perf_counter()
        used = self._snapshot(steps)
        if needs_stash:
            self._stash[key] = used
        if h_f > 0:
            self._watch("forward", key, used, h_f, stale=used if steps == 0 else None)
        self.seconds += time.perf_counter() - start

    def after_backward(self, key, steps):
        """Called by the stage after the backward of `key`: snapshots the weights it used.

        Args:
            key: `(i, j)` of the pass.
            steps: the backward's version gap, or None when it reused the forward's weights
                (then the snapshot `after_forward` stashed is used).
        """
        if not self.sampled(key):
            return
        h_b = self.horizons[1]
        if h_b <= 0:
            self._stash.pop(key, None)
            return
        start = time.perf_counter()
        if steps is None:
            used, stale = self._stash.pop(key, None), None
        else:
            used = self._snapshot(steps)
            stale = used if steps == 0 else None
        if used is not None:
            self._watch("backward", key, used, h_b, stale=stale)
        self.seconds += time.perf_counter() - start

    def after_update(self):
        """Called after each update: completes the measurements whose target is reached."""
        version = self.runner.updates
        done = [p for p in self._pending if p["target"] == version]
        if not done:
            return
        start = time.perf_counter()
        self._pending = [p for p in self._pending if p["target"] != version]
        for p in done:
            error, baseline = self._distances_fn(p["used"], p["stale"])
            result = {
                "stage": self.runner.k,
                "pass": p["pass"],
                "epoch": p["epoch"],
                "batch": p["batch"],
                "used_version": p["version"],
                "target_version": p["target"],
                "error": error,  # tensors until take_results
                "baseline": baseline,
            }
            with self._lock:
                self._results.append(result)
        self.seconds += time.perf_counter() - start

    def add_result(self, kind, record, error, baseline):
        """Adds a measurement made elsewhere (in a window's graph, `runtime.window_probes`).

        Args:
            kind: "forward" or "backward".
            record: `epoch`, `batch`, `used_version`, `target_version` of the pass.
            error, baseline: the two distances (floats).
        """
        result = {"stage": self.runner.k, "pass": kind, "error": error, "baseline": baseline}
        result.update({name: record[name] for name in
                       ("epoch", "batch", "used_version", "target_version")})
        with self._lock:
            self._results.append(result)

    def take_results(self):
        """Returns and forgets the completed measurements (thread-safe).

        Returns:
            A list of dicts: `stage`, `pass` ("forward" or "backward"), `epoch` and `batch` of
            the measured pass, `used_version` (the stage's updates when the pass ran),
            `target_version`, `error`, `baseline` (floats) and `ratio` (NaN when `baseline`
            is 0).
        """
        with self._lock:
            results, self._results = self._results, []
        for r in results:
            r["error"], r["baseline"] = float(r["error"]), float(r["baseline"])
            r["ratio"] = r["error"] / r["baseline"] if r["baseline"] > 0 else float("nan")
        return results

    def reset(self):
        """Drops measurements still waiting (e.g. after an aborted epoch)."""
        self._pending.clear()
        self._stash.clear()


def attach_probes(runners, mode, target, every):
    """Gives each stage whose passes aim at later weights a `WeightProbe` (`runner.probe`).

    A stage whose horizons (`modes.probe_horizons`) are both 0 has nothing to measure and
    keeps its probe (None, unless one was attached before); so does a one-stage pipeline.

    Args:
        runners: the pipeline's `StageRunner`s, stage 0 first.
        mode: the pipeline mode.
        target: SpecTrain's target, "paper" or "consistent".
        every: measure mini-batches `0, every, 2 * every, ...` of each epoch.
    """
    num_stages = len(runners)
    if num_stages < 2:
        return
    for runner in runners:
        horizons = modes.probe_horizons(mode, runner.k, num_stages, target)
        if max(horizons) > 0:
            runner.probe = WeightProbe(runner, horizons, every)


def detach_probes(runners):
    """Removes the stages' probes: their passes are no longer measured."""
    for runner in runners:
        runner.probe = None
