"""Tests for conftest's `_MachineLock`: how the suite's workers keep `exclusive` tests alone.

Each lock object opens its own files, so two objects in one process hold flock locks as two
workers would.
"""

import threading
import time
import uuid

from conftest import _MachineLock

WAIT = 0.3  # seconds a blocked acquire is given to show that it does not return


def _acquire_in_thread(lock, exclusive, log, name):
    """Starts a thread that acquires `lock` and then appends `name` to `log`."""
    def run():
        lock.acquire(exclusive)
        log.append(name)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_tests_that_are_not_exclusive_run_beside_each_other():
    run = uuid.uuid4().hex
    a, b = _MachineLock(run), _MachineLock(run)
    a.acquire(exclusive=False)
    log = []
    _acquire_in_thread(b, False, log, "b").join(timeout=5)
    assert log == ["b"]
    a.release()
    b.release()


def test_an_exclusive_test_waits_for_the_running_one_and_then_runs_alone():
    run = uuid.uuid4().hex
    running, alone, later = (_MachineLock(run) for _ in range(3))
    running.acquire(exclusive=False)
    log = []
    exclusive = _acquire_in_thread(alone, True, log, "exclusive")
    time.sleep(WAIT)
    assert log == []  # the other worker's test is still running
    # A test the other worker starts now must not pass the waiting exclusive one.
    follower = _acquire_in_thread(later, False, log, "later")
    time.sleep(WAIT)
    assert log == []
    running.release()
    exclusive.join(timeout=5)
    time.sleep(WAIT)
    assert log == ["exclusive"]  # and the later test still waits
    alone.release()
    follower.join(timeout=5)
    assert log == ["exclusive", "later"]
    later.release()
