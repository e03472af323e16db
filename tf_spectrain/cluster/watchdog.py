"""Notices a worker that stops answering while an epoch runs: `Watchdog`, `WorkerLostError`.

A worker that dies makes the stages' remote ops fail with `UnavailableError` at once, but a
worker that hangs without dying (a stopped process, a host cut off from the network) makes
them wait for ever, and a thread blocked in a remote op cannot be cancelled from Python.
While an epoch runs with stages on workers, a watchdog thread checks every worker holding
stages, about once a second, with a tiny graph (an `Identity` of a constant on the
worker's `CPU:0`) run by a `tf.compat.v1.Session` whose target is that worker. Each check
runs in its own daemon thread and is given a deadline; a check that does not finish in
time, or fails, declares the worker lost: the watchdog hands a `WorkerLostError` naming the
worker's task, its address and its stages to the epoch, which aborts every hand-off and
raises it.

Why a session and not an eager op on the trainer's connection: measured over loopback, an
eager check of a worker whose stage waits on a stopped neighbour waits too (that worker
would be declared lost as well), while the session's step, served by the worker's master,
answers in milliseconds; it also answers in 1-30 ms while the worker runs a stage pass of
2.5 s (one CPU core).

The watchdog can only run if no thread waits on a worker while holding Python's GIL. A
`GradientTape` recording a graph function called under a remote device scope does
(`StageRunner` therefore calls it outside that scope), and a read of a remote value in the
caller's thread would hang it for ever (`EpochRun` hands the caller local copies).

`configure` sets the deadline and the interval between checks (defaults: 7 s and 1 s, so a
stopped worker fails `fit` about 8-9 s after it stopped).
"""

import threading
import time

import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.cluster import addresses, device_names, health, sockets, spec

DEFAULT_DEADLINE = 7.0
DEFAULT_INTERVAL = 1.0
_SLICE = 0.05  # seconds between looks at the stop event while waiting
REFUSED_SECONDS = 0.3  # how long a check retries a refused connection before it counts
_SETTINGS = {"deadline": DEFAULT_DEADLINE, "interval": DEFAULT_INTERVAL}


class WorkerLostError(tf.errors.UnavailableError):
    """A worker holding stages did not answer the watchdog's check in time, or failed it.

    A subclass of `tf.errors.UnavailableError`, which is what a stage's remote op raises
    when its worker has died.

    Attributes:
        tasks: the lost workers' task indices.
    """

    located = True  # the message says where; no "raised in" note

    def __init__(self, message, tasks=()):
        super().__init__(None, None, message)
        self.tasks = list(tasks)


def configure(deadline=None, interval=None):
    """Sets how long a worker may take to answer a check, and how often it is checked.

    Args:
        deadline: seconds a check may take before its worker is declared lost (> 0);
            None keeps the current value. It must exceed the longest time a healthy but
            loaded worker may take to answer.
        interval: seconds between the end of a round of checks and the next (> 0); None
            keeps the current value.

    Returns:
        The settings before the call, as `{"deadline": ..., "interval": ...}` (pass them
        back as keyword arguments to restore them).

    Raises:
        TypeError, ValueError: if a value is not a positive number.
    """
    before = dict(_SETTINGS)
    if deadline is not None:
        _SETTINGS["deadline"] = checks.check_number("deadline", deadline, 0, strict=True,
                                                    meaning="seconds")
    if interval is not None:
        _SETTINGS["interval"] = checks.check_number("interval", interval, 0, strict=True,
                                                    meaning="seconds")
    return before


class WorkerProbe:
    """Runs the check of one worker: a tiny graph in a session on that worker's master.

    A worker whose address refuses connections (its process died) fails the check at
    once; a stopped one still accepts them (the kernel does), and its session's step
    does not answer.

    The session is made on the first call (in the check's thread, so that a hung worker
    holds up only that thread) and reused. Its calls carry a gRPC deadline, so that a check
    of a hung worker ends too (with `DeadlineExceededError`), a little after the watchdog
    has given up on it.

    Args:
        address: the worker's `host:port`.
        task: its task index.
        timeout: the deadline of each call to the worker, in seconds.
    """

    def __init__(self, address, task, timeout=DEFAULT_DEADLINE + 1.0):
        self.address = address
        self.task = task
        self.timeout = timeout
        self._session = None
        self._fetch = None
        self._options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout * 1000))

    def __call__(self):
        """Runs the check once; returns when the worker has answered.

        Raises:
            tf.errors.OpError: if the worker cannot run it.
            RuntimeError: if the answer is wrong.
        """
        host, port = addresses.split_address(self.address)
        if sockets.wait_until_listening(host, int(port), REFUSED_SECONDS) == "connection refused":
            # Nothing listens there any more (the worker died): no need to wait the deadline.
            raise ConnectionRefusedError(f"{self.address} refuses connections")
        if self._session is None:
            graph = tf.Graph()
            with graph.as_default(), tf.device(
                    f"{device_names.worker_device_prefix(self.task)}/device:CPU:0"):
                fetch = tf.raw_ops.Identity(input=tf.constant(2, tf.int32))
            # Only this worker: the session must not wait on the others.
            config = tf.compat.v1.ConfigProto(
                device_filters=[f"/job:{spec.WORKER}/task:{self.task}"],
                operation_timeout_in_ms=int(self.timeout * 1000))
            self._session = tf.compat.v1.Session(f"grpc://{self.address}", graph=graph,
                                                 config=config)
            self._fetch = fetch
        value = int(self._session.run(self._fetch, options=self._options))
        if value != 2:
            raise RuntimeError(f"the check read {value} instead of 2")

    def close(self):
        """Closes the session (call it only once the worker has answered)."""
        if self._session is not None:
            self._session.close()
            self._session = None


class _Check:
    """One check of one worker, run in its own daemon thread."""

    def __init__(self, probe, task):
        self.done = threading.Event()
        self.error = None
        self.seconds = None
        self._probe = probe
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"tf_spectrain-check-task{task}")

    def start(self):
        self._start = time.monotonic()
        self._thread.start()
        return self

    def _main(self):
        try:
            self._probe()
        except Exception as error:  # any failure of the check declares the worker lost
            self.error = error
        self.seconds = time.monotonic() - self._start
        self.done.set()


class Watchdog:
    """Checks the workers holding stages until stopped, and reports the first lost ones.

    Args:
        cluster: the connected `Cluster` (for the workers' addresses).
        held: `{task: [stage, ...]}` of the workers to check (see `health.held_stages`).
        on_lost: called once, from the watchdog's thread, with a `WorkerLostError` naming
            every worker found lost in the same round.
        deadline: seconds a check may take; None for the `configure`d value.
        interval: seconds between rounds; None for the `configure`d value.
        label: names the epoch in the message, e.g. "epoch 3".
        make_probe: `(address, task) -> check`, where `check()` returns once the worker
            has answered and raises if it cannot (default: `WorkerProbe`).
        num_stages: the stages of one replica, when `held` counts the devices of every
            replica of a replicated pipeline (see `health.name_stages`).

    Attributes:
        lost: a `threading.Event`, set once a worker is declared lost.
        error: the `WorkerLostError`, once one is.
        latencies: `{task: [seconds, ...]}` of the checks that answered.
    """

    def __init__(self, cluster, held, on_lost, deadline=None, interval=None, label=None,
                 make_probe=None, num_stages=None):
        self.cluster = cluster
        self.held = dict(held)
        self.on_lost = on_lost
        self.deadline = _SETTINGS["deadline"] if deadline is None else deadline
        self.interval = _SETTINGS["interval"] if interval is None else interval
        self.label = label
        self.num_stages = num_stages
        self.lost = threading.Event()
        self.error = None
        self.latencies = {task: [] for task in self.held}
        if make_probe is None:
            def make_probe(address, task):
                return WorkerProbe(address, task, timeout=self.deadline + 1.0)
        self._probes = {task: make_probe(cluster.workers[task], task) for task in self.held}
        self._in_flight = set()  # tasks whose check has not ended
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name="tf_spectrain-watchdog")

    def start(self):
        """Starts checking (the first round at once); returns the watchdog."""
        self._thread.start()
        return self

    def stop(self):
        """Stops checking; a check still waiting is abandoned and reports nothing."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _main(self):
        try:
            while not self._stop.is_set():
                if self._round():
                    return
                self._stop.wait(self.interval)
        finally:
            for task, probe in self._probes.items():
                if task not in self._in_flight and hasattr(probe, "close"):
                    probe.close()

    def _round(self):
        """Checks every worker once; True if some were lost (and reported)."""
        started = {task: _Check(self._probes[task], task).start() for task in sorted(self.held)}
        self._in_flight.update(started)
        until = time.monotonic() + self.deadline
        problems = []
        for task, check in started.items():
            while not check.done.wait(min(_SLICE, max(0.0, until - time.monotonic()))):
                if self._stop.is_set():
                    return False
                if time.monotonic() >= until:
                    break
            if check.done.is_set():
                self._in_flight.discard(task)
            if not check.done.is_set():
                problems.append((task, f"did not answer the watchdog's check within "
                                       f"{self.deadline:g} s: the worker is stopped or hung, "
                                       "or its host is unreachable"))
            elif check.error is not None:
                error = check.error
                first = str(getattr(error, "message", error)).strip().splitlines()
                problems.append((task, f"failed the watchdog's check ({type(error).__name__}"
                                       + (f": {first[0]}" if first else "") + ")"))
            else:
                self.latencies[task].append(check.seconds)
        if not problems or self._stop.is_set():
            return False
        self.error = self._error(problems)
        self.lost.set()
        self.on_lost(self.error)
        return True

    def _error(self, problems):
        parts = [f"worker {self.cluster.describe(task)}, which held "
                 f"{health.name_stages(self.held[task], self.num_stages)}, {reason}"
                 for task, reason in problems]
        text = "; ".join(parts)
        text = f"During {self.label}, {text}" if self.label else text[0].upper() + text[1:]
        return WorkerLostError(
            f"{text}. Training stopped (a stage thread blocked in a remote op on a lost "
            "worker is left behind). Restart the worker (or its host) and resume from the "
            "last checkpoint: train.py --resume, or restore_checkpoint.",
            tasks=[task for task, _ in problems],
        )


def watch(devices, on_lost, label=None, cluster=None, num_stages=None):
    """Starts a `Watchdog` for the epoch of a pipeline whose stages are on `devices`.

    Args:
        devices: the stages' device names, stage 0 first.
        on_lost: called with the `WorkerLostError` when a worker is declared lost.
        label: names the epoch in the message.
        cluster: the `Cluster`; None for this process' connected cluster.
        num_stages: the stages of one replica, when `devices` are every replica's.

    Returns:
        The started `Watchdog`, or None (and nothing runs) when no stage is on a worker of
        a connected cluster.
    """
    cluster = health.connected_cluster() if cluster is None else cluster
    if cluster is None:
        return None
    held = health.held_stages(devices, cluster.num_workers)
    if not held:
        return None
    return Watchdog(cluster, held, on_lost, label=label, num_stages=num_stages).start()
