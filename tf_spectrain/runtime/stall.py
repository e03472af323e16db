"""Never a silent hang: a watch that stops a pipeline in which no stage finishes a pass.

Every thread of a pipeline run (a stage thread, a forward-only stage, the thread that calls
a window graph) keeps a `Where` record: the instruction it is on and, while it blocks on a
hand-off, what it waits for. A finished pass calls `Progress.beat`. A `StallWatch` thread
checks the time since the last beat; once it exceeds the timeout it reports a
`PipelineStalledError` that lists every record, and the run aborts: threads blocked on a
hand-off wake at once.

The clock stops while nothing is owed by the stages: while the caller's thread runs the
Keras callbacks (`Progress.paused`) and while a graph function is being traced (`tracing`,
which `runtime.graphs.graph_function` enters in every traced body). After a trace, the
first call builds the graph (TensorFlow optimises, partitions and places it: a window of
resnet50's stages took about a minute here, 7-15 times its trace, and an 8-stage language
model's several minutes beside other jobs): until the next finished pass, while the process
uses at least `BUILDING_SHARE` of a core the clock stops too, for at most
`BUILDING_PER_TRACE` times the trace's duration (an op that spins for ever right after a
trace is still reported), and the first call gets `INSTANTIATION_PER_TRACE` times the
trace's duration more in any case.

TensorFlow cannot cancel an op that runs (a `py_function` that sleeps, a collective whose
peer is gone): a thread inside one stays there. `join_or_leave` leaves such a thread behind
(a daemon) and `refuse_if_left_behind` refuses the next run of those stages until it has
returned, since it would still change their weights when it does. Pure Python.
"""

import contextlib
import threading
import time

from tf_spectrain import checks

__all__ = [
    "DEFAULT_TIMEOUT",
    "PipelineStalledError",
    "Progress",
    "StallWatch",
    "check_timeout",
    "join_or_leave",
    "leave_behind",
    "refuse_if_left_behind",
    "tracing",
]

DEFAULT_TIMEOUT = 60.0
"""Seconds without a finished pass before a pipeline run stops (`stall_timeout`)."""
LEAVE_AFTER_SECONDS = 1.0
"""After an abort, how long to wait for each thread before leaving it behind."""
_JOIN_SLICE = 0.05

_local = threading.local()  # the calling thread's Progress, for `tracing`
_left_behind = []  # (thread, owners, what it is inside)
_left_lock = threading.Lock()


class PipelineStalledError(RuntimeError):
    """No stage of a pipeline finished a pass for `stall_timeout` seconds.

    Attributes:
        timeout: the timeout in seconds.
        stages: one line per watched thread: its device, instruction and what it waits for.
    """

    located = True  # the message says where; no "raised in" note

    def __init__(self, message, timeout, stages):
        super().__init__(message)
        self.timeout = timeout
        self.stages = list(stages)


def check_timeout(stall_timeout):
    """Checks `stall_timeout`: a number of seconds > 0, or None (no watch); returns it."""
    if stall_timeout is None:
        return None
    return checks.check_number(
        "stall_timeout", stall_timeout, 0, strict=True,
        valid="a number of seconds > 0, or None (never stop)",
        meaning="how long no stage may finish a pass before the run stops")


def _seconds(seconds):
    """`61 s`, `0.8 s`."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


class Where:
    """What one watched thread is doing: written by the thread, read by the watch.

    Args:
        name: the thread's place, e.g. "stage 1 on /CPU:1".
    """

    __slots__ = ("name", "doing", "waiting", "since")

    def __init__(self, name):
        self.name = name
        self.doing = "not started"
        self.waiting = None
        self.since = time.monotonic()

    def at(self, doing):
        """The thread starts `doing` (e.g. "op 3 of 12: forward of mini-batch 1.0")."""
        self.doing, self.waiting, self.since = doing, None, time.monotonic()

    def waits(self, what):
        """The thread blocks until `what` arrives (e.g. "activations 1.0 from stage 0")."""
        self.waiting, self.since = what, time.monotonic()

    def runs(self):
        """What it waited for came: the thread computes again."""
        self.waiting, self.since = None, time.monotonic()

    def describe(self, now):
        """One line: place, instruction, and what it waits for or how long it has run."""
        state = (f"waiting for {self.waiting}" if self.waiting is not None
                 else "running")
        return f"{self.name}: {self.doing}: {state} for {_seconds(now - self.since)}"


class Progress:
    """The records of one run's threads and the time of its last finished pass."""

    def __init__(self):
        self.records = []
        self.last = time.monotonic()
        self.allowance = 0.0  # extra seconds until the next beat (see `tracing`)
        self._building = None  # after a trace: (the process' CPU seconds at the last look,
        # the monotonic time until which CPU use counts as building the graph)
        self._pauses = 0
        self._lock = threading.Lock()

    def record(self, name):
        """A new `Where` for a thread named `name` (see `Where`)."""
        where = Where(name)
        self.records.append(where)
        return where

    def stage_records(self, grid):
        """A `Where` per runner of `grid` (R lists of N runners), named "stage k [of
        replica r] on <device>": R lists of N records."""
        copy = [f" of replica {r}" if len(grid) > 1 else "" for r in range(len(grid))]
        return [[self.record(f"stage {k}{copy[r]} on {runner.device}")
                 for k, runner in enumerate(runners)] for r, runners in enumerate(grid)]

    def beat(self):
        """A pass finished (or something else showed the run is alive)."""
        self.last = time.monotonic()
        self.allowance = 0.0
        self._building = None

    def building(self, limit):
        """A graph function was traced: until the next beat, and for at most `limit` more
        seconds, while the process keeps `BUILDING_SHARE` of a core busy it is building
        that graph (`still_building`). Each trace may extend the limit, never shorten it."""
        until = time.monotonic() + limit
        if self._building is None or until > self._building[1]:
            self._building = (time.process_time(), until)

    def still_building(self, seconds):
        """Whether, after a trace, before the next beat and within its limit, the process
        used at least `BUILDING_SHARE` of the last `seconds` of CPU time: TensorFlow
        optimising, partitioning and placing the new graph on its first call. A run whose
        stages all wait uses next to none. The whole process is measured, not the thread
        that traced: TensorFlow builds a multi-device function's parts in threads of its
        own, and a thread-level rule stopped an 8-stage run beside other jobs falsely. The
        limit (`BUILDING_PER_TRACE`) keeps an op that spins for ever from passing as one."""
        if self._building is None:
            return False
        cpu, until = self._building
        now = time.process_time()
        self._building = (now, until)
        return time.monotonic() < until and now - cpu >= BUILDING_SHARE * seconds

    def allow(self, seconds):
        """Gives the work until the next beat `seconds` more than the timeout."""
        self.allowance = max(self.allowance, seconds)

    @contextlib.contextmanager
    def paused(self):
        """The clock stops inside (the caller's callbacks, a trace); a beat on the way out."""
        with self._lock:
            self._pauses += 1
        try:
            yield
        finally:
            with self._lock:
                self._pauses -= 1
            self.beat()

    def idle_seconds(self, now):
        """Seconds since the last beat, less the allowance; 0 while paused."""
        return 0.0 if self._pauses else now - self.last - self.allowance

    def attach(self):
        """Makes this the calling thread's progress, paused by `tracing` in that thread."""
        _local.progress = self

    @staticmethod
    def detach():
        """The calling thread has no progress any more."""
        _local.progress = None


BUILDING_SHARE = 0.1
"""The share of a core the process must use after a trace to be taken as building a graph:
a tenth, as a machine loaded 5x beyond its cores still gives it about a fifth."""

BUILDING_PER_TRACE = 15.0
"""After a trace of t seconds, CPU use counts as building the graph for at most
`BUILDING_PER_TRACE * t` seconds (measured: 7-15 t for resnet50's windows), besides the
`INSTANTIATION_PER_TRACE * t` every first call gets."""

INSTANTIATION_PER_TRACE = 10.0
"""After a trace of t seconds, the first pass may take `INSTANTIATION_PER_TRACE * t` more:
TensorFlow optimises and places a graph on its first call, which takes longer the larger
the graph, as its trace does."""


@contextlib.contextmanager
def tracing():
    """Stops the calling thread's run's clock while a graph function is traced, and allows
    the first call that follows time to build the graph (`INSTANTIATION_PER_TRACE`)."""
    progress = getattr(_local, "progress", None)
    if progress is None:
        yield
        return
    started = time.monotonic()
    with progress.paused():
        yield
    seconds = time.monotonic() - started
    progress.allow(INSTANTIATION_PER_TRACE * seconds)
    progress.building(BUILDING_PER_TRACE * seconds)


class StallWatch:
    """A daemon thread that calls `on_stall(error)` once `progress` is idle for `timeout`.

    Args:
        progress: the run's `Progress`.
        timeout: seconds (> 0), or None: then the watch does nothing.
        on_stall: called (from the watch's thread) with the `PipelineStalledError`.
        label: what the run is, for the message (e.g. "epoch 3", "predict").
        poll: None, or a function called every check that returns True when the run
            showed progress the records cannot (a window graph's pass counters).

    Attributes:
        error: the `PipelineStalledError` once reported, else None.
    """

    def __init__(self, progress, timeout, on_stall, label=None, poll=None):
        self.progress, self.timeout, self.on_stall = progress, timeout, on_stall
        self.label, self.poll = label, poll
        self.error = None
        self._looked = time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.timeout is not None:
            self.progress.beat()
            self._thread = threading.Thread(target=self._watch, name="tf_spectrain-stall-watch",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return False

    def _watch(self):
        slice_seconds = min(1.0, self.timeout / 20)
        while not self._stop.wait(slice_seconds):
            if self.poll is not None and self.poll():
                self.progress.beat()
            now = time.monotonic()
            if self.progress.still_building(now - self._looked):
                self.progress.last = now  # not a beat: the graph is still being built
            self._looked = now
            if self.progress.idle_seconds(now) > self.timeout:
                self.error = self._stalled(now)
                self.on_stall(self.error)
                return

    def _stalled(self, now):
        """The error that says where every thread is."""
        lines = [where.describe(now) for where in self.progress.records]
        where = f" in {self.label}" if self.label else ""
        message = (
            f"No stage of the pipeline finished a pass for {_seconds(self.timeout)}"
            f"{where} (stall_timeout={self.timeout:g}); the run was stopped. Where each "
            "stage was:\n  " + "\n  ".join(lines) + "\n"
            "A stage 'running' for that long is stuck inside its pass (a layer, an op, the "
            "device); one 'waiting' waits for a neighbour or the data. Checkpoints already "
            "written are untouched. If a pass can legitimately take longer, raise "
            "`stall_timeout` (PipelineModel(..., stall_timeout=...); train.py "
            "--stall-timeout)."
        )
        return PipelineStalledError(message, self.timeout, lines)


def join_or_leave(threads, aborted):
    """Joins `threads`; once `aborted()`, each only for `LEAVE_AFTER_SECONDS`.

    Args:
        threads: `(thread, Where or None)` pairs.
        aborted: a function returning whether the run was aborted.

    Returns:
        The pairs whose thread is still alive: inside an op TensorFlow cannot stop (see
        `leave_behind`).
    """
    until, left = None, []
    for thread, where in threads:
        while thread.is_alive():
            if until is None and aborted():
                until = time.monotonic() + LEAVE_AFTER_SECONDS
            if until is not None and time.monotonic() >= until:
                left.append((thread, where))
                break
            thread.join(_JOIN_SLICE)
    return left


def leave_behind(threads, owners):
    """Records threads left inside an op (daemons), so that `refuse_if_left_behind(owners)`
    refuses the next run of what they work on (matched by identity) until they return."""
    ids = {id(o) for o in owners}
    with _left_lock:
        for thread, where in threads:
            what = f"{where.name}: {where.doing}" if where is not None else thread.name
            _left_behind.append((thread, ids, what))


def refuse_if_left_behind(owners):
    """Raises if a thread left behind by a stalled run of any of `owners` is still alive.

    Returns:
        True if such a thread has returned since (its owners' in-flight state may hold
        what it wrote on the way out: the caller resets them), else False.

    Raises:
        PipelineStalledError: naming the thread's stage and pass.
    """
    ids = {id(o) for o in owners}
    with _left_lock:
        mine = [entry for entry in _left_behind if entry[1] & ids]
        _left_behind[:] = [entry for entry in _left_behind
                           if entry[0].is_alive() or not entry[1] & ids]
        stuck = [what for thread, _, what in mine if thread.is_alive()]
    if stuck:
        raise PipelineStalledError(
            "A thread of an earlier run that stalled is still inside a pass of this "
            f"pipeline ({'; '.join(stuck)}). TensorFlow cannot stop an op that runs, and it "
            "would change the stages' weights when it returns: wait until it returns, or "
            "start a new process (checkpoints already written are untouched).",
            None, stuck,
        )
    return bool(mine)
