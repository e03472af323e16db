"""The stall watch of an epoch run in windows (`runtime.window_epoch.WindowedEpoch`).

A window's graph runs many passes in one call, so no Python runs between them. The window
graphs count each runner's finished passes in a variable on this host's CPU
(`WindowSetup.counters`, written by `runtime.window_graph`); the `runtime.stall.StallWatch`
reads the counters while a window runs, treats a count that moved as a finished pass, and
describes each stage from them: the pass it is on and, when a neighbour has not finished
the pass it needs, that it waits for it. Each window's data reads and graph call run in a
helper thread (`handoff.watched_call`), so that the caller's thread can stop the epoch.
"""

import contextlib

import tensorflow as tf

from tf_spectrain.runtime import stall
from tf_spectrain.runtime.handoff import watched_call
from tf_spectrain.schedule import UPDATE

_WAIT_SLICE = 0.05


class PassMarks:
    """What a window graph writes as its passes finish, for the watch and the trace.

    Each runner's finished passes are counted in its `WindowSetup.counters` variable (in
    program order: one variable per runner), which `WindowWatch` reads while the window
    runs; with `timed`, each pass's end time is taken too (`times`), noted in `notes` as
    `("timed", runner index, kind, key)` in the same order.

    Args:
        setup: the pipeline's `runtime.window_functions.WindowSetup`.
        timed: whether to take each pass's end time.
    """

    def __init__(self, setup, timed):
        self.setup = setup
        self.timed = timed
        self._times = []
        self.notes = []

    def count(self, finished, index, kind, key):
        """Counts a finished pass of runner `index` once `finished` (a tensor computed once
        the pass is) exists: through an identity, as an edge from an inlined call's output
        would wait only for the call's side effects. With `timed`, also takes the time."""
        with tf.device(finished.device or None):
            ready = tf.identity(finished)
        counter = self.setup.counters[index]
        with tf.device(counter.device), tf.control_dependencies([ready]):
            counter.assign_add(1)
            if self.timed:
                self._times.append(tf.timestamp())
                self.notes.append(("timed", index, kind, key))

    def time_update(self, k, i):
        """With `timed`, the time stage k's update of i ended (a read of a weight, ordered
        after the update), unless updates wait for every stage (then not timed)."""
        setup = self.setup
        if not self.timed or setup.waits_for_all_stages:
            return
        for r in range(setup.replicas):
            runner = setup.grid[r][k]
            if runner.passes.tf_trainable:
                with tf.device(runner.device):
                    read = tf.identity(runner.passes.tf_trainable[0])
                with tf.device(setup.counters[0].device), tf.control_dependencies([read]):
                    self._times.append(tf.timestamp())
                self.notes.append(("timed", setup.index(r, k), UPDATE, (i, None)))

    def times(self):
        """The end times taken, a float64 vector (empty without `timed`)."""
        return tf.stack(self._times) if self._times else tf.zeros((0,), tf.float64)


class WindowWatch:
    """Progress records, the stall watch and the watched calls of one windowed epoch.

    Args:
        setup: the pipeline's `runtime.window_functions.WindowSetup`.
        timeout: `stall_timeout` in seconds, or None.
        label: names the epoch in the message, e.g. "epoch 3".

    Attributes:
        progress: the epoch's `runtime.stall.Progress`.
        where: a `runtime.stall.Where` per runner, replica 0's stages first.
    """

    def __init__(self, setup, timeout, label):
        self.setup = setup
        self.progress = stall.Progress()
        self.where = [w for row in self.progress.stage_records(setup.grid) for w in row]
        self._watch = stall.StallWatch(self.progress, timeout, lambda error: None,
                                       label=label, poll=self._poll)
        self._watchdog = None
        self._counts = None  # the counters' values at the last poll
        self._window = None  # (window, the counters at its start) while one runs
        self._reading = False  # while stage 0's record says it waits for the data

    @contextlib.contextmanager
    def watching(self, watchdog):
        """The stall watch runs inside; `watchdog` (or None) is the workers' watchdog."""
        self._watchdog = watchdog
        try:
            with self._watch:
                yield
        finally:
            self._watchdog = None

    @contextlib.contextmanager
    def reading(self, i):
        """Stage 0's record says it waits for mini-batch i from the data, inside."""
        where = self.where[0]
        self._reading = True
        where.at(f"feeding mini-batch {i} to a window")
        where.waits(f"mini-batch {i} from the data")
        yield
        self._reading = False
        where.runs()
        self.progress.beat()

    def call(self, window, work):
        """`work()` (the window's reads and graph call) in a helper thread, given up on a
        stall (raising the `PipelineStalledError`) or a lost worker; a helper given up on
        after a stall is left behind (`stall.leave_behind`)."""
        watch, watchdog, progress = self._watch, self._watchdog, self.progress

        def attached():
            progress.attach()  # a trace in this thread stops the stall clock
            try:
                return work()
            finally:
                progress.detach()

        def abandon():
            if watch.error is not None:
                return watch.error
            if watchdog is not None and watchdog.lost.is_set():
                return watchdog.error
            return None

        left = []
        start = [int(c.numpy()) for c in self.setup.counters]
        # The passes of the window before, counted after the last poll, are no progress of
        # this window's (a beat would end the allowance of its first call; see `tracing`).
        self._counts = start
        self._window = (window, start)
        try:
            return watched_call(attached, abandon, "tf_spectrain-window", _WAIT_SLICE,
                                left=left)
        finally:
            self._window = None
            if left and watch.error is not None:
                running = [w for w in self.where if w.waiting is None] or self.where
                stall.leave_behind([(t, running[0]) for t in left], self.setup.runners)

    def _poll(self):
        """Reads the counters (from the watch's thread): whether any moved; updates `where`."""
        counts = [int(c.numpy()) for c in self.setup.counters]
        moved = self._counts is not None and counts != self._counts
        self._counts = counts
        current = self._window
        if current is not None:
            window, start = current
            done = [c - s for c, s in zip(counts, start)]
            n = self.setup.num_stages
            for index, where in enumerate(self.where):
                if index == 0 and self._reading:
                    continue  # `reading` says what stage 0 waits for
                r, k = divmod(index, n)
                doing, waiting = window.stage_position(k, done[r * n:(r + 1) * n])
                if doing != where.doing:
                    where.at(doing)
                if waiting != where.waiting:
                    where.waits(waiting) if waiting is not None else where.runs()
        return moved
