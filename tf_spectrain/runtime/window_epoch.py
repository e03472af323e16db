"""Runs one epoch of a pipeline as windows: one graph call per K mini-batches.

`WindowedEpoch` is `runtime.executor.EpochRun`'s counterpart for `steps_per_execution = K`
(`PipelineModel.compile`): it cuts the epoch with `schedule.windows.EpochWindows`, feeds
each window its mini-batches, calls the window's graph (`runtime.window_graph`, traced once
per window shape and kept in `WindowFunctions`), and reports each window to the caller,
which runs the Keras callbacks once per window, as `keras.Model.fit` does with
`steps_per_execution`. Losses, metrics and non-finite flags are read once per window.
"""

import threading
import time

import tensorflow as tf

from tf_spectrain.cluster import watchdog as watchdog_lib
from tf_spectrain.runtime import stall
from tf_spectrain.runtime.feed import check_split, ran_out
from tf_spectrain.runtime.graphs import unoptimized_calls
from tf_spectrain.runtime.handoff import watched_call
from tf_spectrain.runtime.split_pass import supports_split
from tf_spectrain.runtime.window_carried import hand_on
from tf_spectrain.runtime.window_errors import failed_op
from tf_spectrain.runtime.window_functions import window_keeps
from tf_spectrain.runtime.window_probes import WindowProbes, probe_sample_name
from tf_spectrain.runtime.window_watch import WindowWatch
from tf_spectrain.schedule import BACKWARD, FORWARD, UPDATE, modes

_WAIT_SLICE = 0.05


class WindowedEpoch:
    """One epoch of a pipeline, run window by window (see the module docstring).

    Each window's data reads and graph call run in a helper thread, watched: when no stage
    finishes a pass for `stall_timeout` seconds (the graphs count each runner's passes in
    `WindowSetup.counters`; the clock stops while the caller runs callbacks and while a
    window is traced), the epoch stops with a `runtime.stall.PipelineStalledError` and the
    helper thread is left behind inside the graph (TensorFlow cannot stop it).

    Args:
        functions: the pipeline's `WindowFunctions`.
        windows: the epoch's `schedule.windows.EpochWindows`.
        batches: an iterator of `(x, y)` mini-batches.
        rules: each stage's keep rule (`runtime.loop.keep_rules`).
        label: names the epoch in error notes, e.g. "epoch 3".
        stall_timeout: seconds, or None never to stop.
        timed: whether the window graphs time each pass, for the runners' timelines
            (`_timelines`; a trace asks for them), as the stage threads do.
    """

    def __init__(self, functions, windows, batches, rules, label=None,
                 stall_timeout=stall.DEFAULT_TIMEOUT, timed=False):
        self.functions = functions
        self.setup = functions.setup
        self.windows = windows
        self.batches = batches
        self.rules = rules
        self.label = label
        self.stop = threading.Event()
        self.sizes = {}  # i -> examples of fed mini-batch i
        self._labels = {}  # i -> labels of a fed mini-batch until its window
        self._rates = {}  # i -> the learning rate of mini-batch i's updates (or None)
        self._watchdog = None
        self._passes = 0  # passes reported so far (orders `runner.events`)
        self.watch = WindowWatch(self.setup, stall_timeout, label)
        self.timed = timed
        self.probes = WindowProbes(self.setup, windows, self.applies)

    @property
    def fed(self):
        """Mini-batches fed so far."""
        return self.windows.fed

    def request_stop(self):
        """Feeds no further mini-batch; the epoch ends once those fed are done."""
        self.stop.set()

    def run(self, on_window, on_begin=None):
        """Runs the epoch; calls `on_window(window, losses)` after each window.

        `on_begin(i)` (if given) runs before each window that reports mini-batches, with
        its first one; it returns the learning rate of those mini-batches' updates on every
        stage (a float), or None to leave each stage's optimizer as it is.

        Raises:
            ValueError: if the data runs out, or a mini-batch is too small to split.
            tf_spectrain.cluster.watchdog.WorkerLostError: if a worker holding stages
                stopped answering.
            PipelineStalledError: no stage finished a pass for `stall_timeout`, or a
                thread of an earlier stalled run of these stages is still inside a pass.
            BaseException: whatever a window or `on_window` raised.
        """
        setup = self.setup
        stall.refuse_if_left_behind(setup.runners)
        self._watchdog = watchdog_lib.watch(
            [runner.device for runner in setup.runners], lambda error: None, label=self.label,
            num_stages=setup.num_stages if setup.replicas > 1 else None,
        )
        try:
            carried = {}
            with self.watch.watching(self._watchdog):
                while True:
                    if self.stop.is_set():  # asked before this window: feed no more
                        self.windows.stop()
                    window = next(self.windows, None)
                    if window is None:
                        break
                    carried = self._run_window(window, carried, on_window, on_begin)
        except BaseException:
            for runner in setup.runners:
                runner.reset()
            raise
        finally:
            if self._watchdog is not None:
                self._watchdog.stop()

    def _run_window(self, window, carried, on_window, on_begin):
        base = window.first
        if on_begin is not None and window.stop > window.first:
            with self.watch.progress.paused():  # the caller's work stops the stall clock
                rate = on_begin(window.first)
            for i in window.reported:
                self._rates[i] = rate
        updated = sorted({op.batch for k, op in window.program if op.kind == UPDATE})
        with_rates = on_begin is not None and any(self._rates.get(i) is not None
                                                  for i in updated)
        rates = None
        if with_rates:
            rates = {str(i - base): tf.constant(self._rates[i], tf.float64) for i in updated}
        stages = self.setup.grid[0]
        keeps = window_keeps(window, self.rules, [r.plan for r in stages],
                             [supports_split(r.passes.forward_at_fn) for r in stages])
        plan, samples = self.probes.plan(window)
        applies = None
        if self.setup.accumulate > 1:  # mode 2bw: which updates apply their group's gradient
            applies = {op.batch for k, op in window.program
                       if op.kind == UPDATE and self.applies(op.batch)}
        function, notes, traced_base = self.functions.get(window, keeps, with_rates, self.timed,
                                                          plan, applies)
        flags = {probe_sample_name(key, base): tf.constant(v) for key, v in samples.items()}
        started = []

        def work():
            xs = {str(i - base): self._feed(i) for i in window.fed}
            ys = {str(i - base): self._labels.pop(i) for i in window.reported}
            args = (xs, ys, rates, carried, flags)
            # Traced with the stage functions' own options, run without optimising the
            # window's graph again (`unoptimized_calls`).
            calls = self.functions.calls
            prepared, inputs = calls.prepare(function, args)
            started.append(time.perf_counter())
            with unoptimized_calls():
                return _read(calls.call(prepared, inputs))

        try:
            outputs = self.watch.call(window, work)
        except tf.errors.OpError as error:
            self._add_note(error, window)
            raise
        self.probes.record(window, plan, samples, outputs["probes"],
                           [n for n in notes if n[0] == "probe"], base - traced_base)
        self._note(window, outputs["flags"], notes, base - traced_base)
        if self.timed:
            self._timelines(notes, outputs["times"], base - traced_base, started[0])
        for k, op in window.program:
            if k == 0 and op.kind == UPDATE:  # mini-batch i's last update
                self._rates.pop(op.batch, None)
        with self.watch.progress.paused():
            on_window(window, outputs["losses"])
        return hand_on(outputs["carried"], notes, carried)

    def applies(self, i):
        """Whether U(i) applies the stage's gradient (`modes.applies_update`; mode 2bw holds
        the others), in the epoch as cut so far (a stop makes it shorter)."""
        return modes.applies_update(i, self.windows.num_batches, self.setup.accumulate)

    def _add_note(self, error, window):
        """Names the stage of a failed window's op (and its pass and mini-batch where the
        error shows them), as the stage threads do (`runtime.executor`)."""
        setup = self.setup
        if not hasattr(error, "add_note"):
            return
        where = f" of {self.label}" if self.label else ""
        if isinstance(error, tf.errors.CancelledError):
            # A stage's pass function that fails cancels the window's other work, and
            # TensorFlow may report that cancellation first: the pass it names is a victim.
            error.add_note(
                f"(tf_spectrain: an op failed in a pass of {window.span}{where}, and "
                "TensorFlow reported the cancellation of the window's other passes instead "
                "of that error, which is in TensorFlow's log (with TF_CPP_MIN_LOG_LEVEL "
                "below 2). "
                "compile(run_eagerly=True) runs each pass on its own and raises the "
                "error itself, naming its stage, pass and mini-batch.)")
            return
        layers = [[layer.name for layer in runner.model.layers] for runner in setup.grid[0]]
        failed = failed_op(error, layers)
        if failed is None:
            return
        k, kind, relative, r, layer = failed
        copy = f" of replica {r}" if r is not None and setup.replicas > 1 else ""
        device = setup.grid[r or 0][k].device
        if relative is not None:
            what = f"the {kind} pass of mini-batch {window.first + relative}{where}"
        else:
            what = f"a {kind} pass" if kind else f"a pass (in layer '{layer}')"
            what += (f", in {window.span}{where} (steps_per_execution={self.windows.size}; "
                     "with compile(run_eagerly=True) this note names the pass and mini-batch)")
        error.add_note(f"(tf_spectrain: stage {k}{copy} on {device} failed in {what})")

    def _feed(self, i):
        """Reads mini-batch i: its inputs for this window, its labels for its report."""
        with self.watch.reading(i):
            try:
                x, y = next(self.batches)
            except StopIteration:
                raise ran_out(i, self.windows.num_batches) from None
        n = int(tf.nest.flatten(x)[0].shape[0])
        setup = self.setup
        check_split(n, setup.replicas * setup.micro_batches, setup.replicas,
                    setup.micro_batches)
        self.sizes[i] = n
        self._labels[i] = y
        return x

    def wait_for(self, fn):
        """Returns `fn()`; with stages on workers, runs it in a helper thread and gives up
        (raising the watchdog's `WorkerLostError`) once a worker is lost."""
        return self._call(fn)

    def _call(self, fn):
        """`fn()`; with stages on workers, in a helper thread, given up on a lost worker."""
        if self._watchdog is None:
            return fn()
        watchdog = self._watchdog
        return watched_call(fn, lambda: watchdog.error if watchdog.lost.is_set() else None,
                            "tf_spectrain-window", _WAIT_SLICE)

    def _note(self, window, flags, notes, shift):
        """Records the window's passes: non-finite flags, memory, update counts.

        `notes` were traced for a window `shift` mini-batches earlier of the same shape.
        """
        setup = self.setup
        runners = setup.runners
        passes = [(setup.index(r, k), op.kind, (op.batch, op.micro))
                  for k, op in window.program if op.kind != UPDATE
                  for r in range(setup.replicas)]
        # Only each stage's first non-finite pass of the window (what `first_non_finite`
        # looks for): a whole window of passes would push it out of the stage's 64 events.
        firsts = {}
        for (index, kind, key), finite in zip(passes, flags):
            self._passes += 1
            if not finite and index not in firsts:
                firsts[index] = (self._passes, kind, key, False)
        for index, event in firsts.items():
            runners[index].events.append(event)
        for note in notes:
            if note[0] in ("timed", "probe", "through"):
                continue
            if note[0] == "kept":
                _, index, (i, j), per_example, fixed, weights, tape = note
                runner = runners[index]
                examples = self._examples(i + shift, j, index // setup.num_stages)
                own = per_example * examples + fixed
                if tape:
                    own += runner.memory.activations_per_example * examples
                runner.memory.kept_bytes((i + shift, j), own, weights)
            else:
                _, index, (i, j) = note
                runners[index].memory.released((i + shift, j))
        for k in range(setup.num_stages):
            count = sum(1 for s, op in window.program
                        if s == k and op.kind == UPDATE and self.applies(op.batch))
            for r in range(setup.replicas):
                setup.grid[r][k].note_updates(count)

    def _timelines(self, notes, times, shift, started):
        """Adds the window's passes to their runners' timelines, `(kind, key, start, end)`
        in `time.perf_counter` seconds: each ended at its time; each started when the
        stage's previous pass ended (or the graph call began) or, if later, when the pass
        it takes its input from ended (the neighbour's forward or backward)."""
        setup = self.setup
        offset = time.perf_counter() - time.time()  # tf.timestamp is time.time's clock
        ends, last = {}, {}
        timed = [note[1:] for note in notes if note[0] == "timed"]
        for (index, kind, (i, j)), stamp in zip(timed, times, strict=True):
            key, end = (i + shift, j), float(stamp) + offset
            r, k = divmod(index, setup.num_stages)
            start = last.get(index, started)
            source = k - 1 if kind == FORWARD else k + 1 if kind == BACKWARD else None
            if source is not None and 0 <= source < setup.num_stages:
                start = max(start, ends.get((setup.index(r, source), kind, key), start))
            start = min(start, end)
            ends[(index, kind, key)], last[index] = end, end
            setup.runners[index].timeline.append(
                (kind, None if kind == UPDATE else key, start, end))

    def _examples(self, i, j, r):
        """The examples of replica r's micro-batch j of mini-batch i."""
        parts = self.setup.replicas * self.setup.micro_batches
        n = self.sizes.get(i, 0)
        p = self.setup.micro_batches * r + j
        return n // parts + (1 if p < n % parts else 0)


def _read(outputs):
    """The outputs with the losses, flags and times read to the host (one wait for the
    window)."""
    outputs = dict(outputs)
    for name in ("losses", "flags", "times", "probes"):
        outputs[name] = outputs[name].numpy()
    return outputs
