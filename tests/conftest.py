"""Test set-up: split the CPU into 4 logical devices before TensorFlow initialises.

This runs at import time, before any test module creates a TensorFlow op, so every test can
place work on `/CPU:0` .. `/CPU:3`.
"""

import fcntl
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tf_spectrain  # noqa: E402

NUM_DEVICES = 4

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    DEVICES = tf_spectrain.setup_devices(NUM_DEVICES)

# Initialise TensorFlow now, with these 4 devices: otherwise the first test to call
# setup_devices(n) itself (train.py in-process with --gpus 3, say) would configure n.
import tensorflow as tf  # noqa: E402

assert len(tf.config.list_logical_devices("CPU")) == NUM_DEVICES
gc.freeze()  # TensorFlow's and Keras' objects: see "garbage off the main thread" below

# --- two workers (pytest-xdist), and tests that need the machine to themselves -----------
#
# pytest.ini runs the suite on `-n auto` workers, one per core (at most MAX_WORKERS), each
# given whole files (`--dist loadfile`). Tests marked `exclusive` measure wall time or cores
# (stage overlap, watchdog deadlines, logging overhead): while one runs, no test runs in
# another worker. Every test holds a shared lock on one file for its whole run (setup and
# teardown included); an exclusive test holds it exclusively. A gate file taken before
# either keeps a waiting exclusive test from being passed by the other workers' next tests.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use, at most MAX_WORKERS."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


class _MachineLock:
    """The shared/exclusive lock of one test run's workers (fcntl.flock on two files)."""

    def __init__(self, run_id):
        base = os.path.join(tempfile.gettempdir(), f"tf_spectrain-tests-{run_id}")
        self.gate = open(base + ".gate", "a")  # both held open for the session
        self.lock = open(base + ".lock", "a")

    def acquire(self, exclusive):
        """Blocks until this test may run: alone if `exclusive`, else beside other tests."""
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    def release(self):
        """Lets the other workers' tests run."""
        fcntl.flock(self.lock, fcntl.LOCK_UN)


_LOCK_KEY = pytest.StashKey()  # this worker's _MachineLock, in its config's stash


def _machine_lock(config):
    """This worker's `_MachineLock`, or None when the suite runs in one process."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return None
    if _LOCK_KEY not in config.stash:
        config.stash[_LOCK_KEY] = _MachineLock(worker["testrunuid"])
    return config.stash[_LOCK_KEY]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Runs an `exclusive` test (setup, call, teardown) with no other worker's test beside
    it, and any other test beside other non-exclusive ones only."""
    lock = _machine_lock(item.config)
    if lock is not None:
        lock.acquire(exclusive=item.get_closest_marker("exclusive") is not None)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


# --- garbage off the main thread ------------------------------------------------------------
#
# Deleting a tf.data iterator whose autotuner missed its wake-up waits, idle, up to the
# autotuner's next run (up to a minute; tf_spectrain.workflow.iterators). Keras' reference runs
# in the tests leave their iterators in reference cycles, and the next garbage collection
# deletes them in whichever test starts it: py-spy caught tests idle 20-60 s in
# `~LogicalThreadWrapper` under a collection started by an unrelated allocation. So the tests'
# garbage is collected on a daemon thread between tests, every few seconds, and what the
# imports made is frozen out of collections (`gc.freeze`: a full one then takes
# milliseconds instead of 0.2 s). While that collection runs, Python's others return at
# once: a test that needs garbage gone calls `collect_garbage`.


_COLLECTIONS = []  # the daemon threads started below, until `collect_garbage` joins them
_EVERY_SECONDS = 5.0  # a full collection costs 0.2 s or more: at most one in this time
_last = [0.0]


@pytest.fixture(autouse=True)
def _garbage_collected_off_the_main_thread():
    """After a test, collects garbage on a daemon thread (see above), unless one ran in the
    last `_EVERY_SECONDS` or still runs."""
    yield
    now = time.monotonic()
    if now - _last[0] < _EVERY_SECONDS or any(t.is_alive() for t in _COLLECTIONS):
        return
    _last[0] = now
    thread = threading.Thread(target=gc.collect, name="tests-gc", daemon=True)
    thread.start()
    _COLLECTIONS.append(thread)


def collect_garbage():
    """`gc.collect()` in this thread, once the background collections are done (for tests
    that need garbage gone now)."""
    while _COLLECTIONS:
        _COLLECTIONS.pop().join()
    return gc.collect()


class KerasOnly:
    """The `keras_only` fixture's child process (tests/keras_only_child.py)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.count = 0
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "keras_only_child.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env, cwd=tmp_path)

    def _answer(self):
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(f"the Keras-only process ended (exit code {self.process.wait()})")

    def predict(self, model_path, x):
        """Loads `model_path` in the child and returns its predictions for `x`; fails the
        test if the load or predict fails or the child holds any tf_spectrain module."""
        import numpy as np

        self.count += 1
        x_path = self.tmp_path / f"x{self.count}.npy"
        out_path = self.tmp_path / f"out{self.count}.npy"
        np.save(x_path, x)
        request = {"model": str(model_path), "x": str(x_path), "out": str(out_path)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        assert "error" not in answer, answer.get("error")
        assert answer["tf_spectrain"] == [], "the child imported tf_spectrain"
        return np.load(out_path)


@pytest.fixture(scope="session")
def keras_only(tmp_path_factory):
    """A Python process that imports Keras but never tf_spectrain, shared by the tests that
    check that a saved model loads without tf_spectrain (each fresh process costs seconds of
    TensorFlow imports): `keras_only.predict(path, x)`. Ended (by pid) after the session."""
    loader = KerasOnly(tmp_path_factory.mktemp("keras_only"))
    try:
        ready = loader._answer()
        assert ready == {"ready": True}, ready
        yield loader
    finally:
        loader.process.stdin.close()
        try:
            loader.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(loader.process.pid, 9)
            loader.process.wait()
