"""`tf.data` iterators that never stall training when they are deleted.

Deleting a `tf.data` iterator stops TensorFlow's autotuning thread for it, and in TF 2.21
that stop can miss its wake-up: the deleting thread then waits, idle, until the autotuner's
next scheduled run (its period doubles from 10 ms up to a minute, so the wait ends at about
5.1 s, 10.2 s, 20.5 s ... after the iterator was made). Measured here, deleting the iterator
of an 8-batch epoch waited 2.2-2.6 s in about half of the fresh processes, in plain Keras
`model.fit` (at the end of every epoch) as in a pipeline. A training loop that deletes its
epoch's iterator inline therefore sometimes shows a whole second of idle cores per epoch.

Here datasets built from arrays turn autotuning off (`without_autotune`: they prefetch a
fixed number of batches and have nothing to tune), and the pipeline hands every iterator it
is done with to `retire`, which deletes it on a background thread: training goes on, and
the wait (which uses no CPU and releases the GIL) is spent off the critical path.
"""

import atexit
import os
import queue
import sys
import threading
import time

import tensorflow as tf

_OWNER_WAIT_SECONDS = 5.0  # how long `retire` waits for callers to drop their references
_EXIT_WAIT_SECONDS = 65.0  # the autotuner's longest period is 60 s


def without_autotune(dataset):
    """Returns `dataset` with `tf.data` autotuning turned off.

    For datasets whose parameters are all fixed (no `tf.data.AUTOTUNE`): nothing changes but
    that no autotuning thread is started, so deleting their iterators never waits for one.

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        The same dataset with `options.autotune.enabled = False`.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


class Reaper:
    """A daemon thread that drops retired objects once it holds their last reference.

    The module's `retire` and `wait_retired` use one for the process; another is for a
    caller (a test) that must see only its own objects go.
    """

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._done = threading.Condition()
        self._pending = 0
        self._thread = None
        self._pid = None  # a forked child has no reaper thread yet

    def retire(self, obj):
        """Queues `obj` for deletion on the reaper thread."""
        with self._done:
            self._pending += 1
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="tf_spectrain-iterator-reaper", daemon=True
                )
                self._thread.start()
        self._queue.put(obj)

    def _run(self):
        while True:
            obj = self._queue.get()
            deadline = time.monotonic() + _OWNER_WAIT_SECONDS
            # 2 = `obj` here + getrefcount's argument: the caller has let go.
            while sys.getrefcount(obj) > 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            del obj
            with self._done:
                self._pending -= 1
                self._done.notify_all()

    def wait(self, timeout):
        """Waits until every retired object is deleted; False on timeout."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)


_REAPER = Reaper()
atexit.register(_REAPER.wait, _EXIT_WAIT_SECONDS)


def retire(iterator):
    """Deletes `iterator` (None is ignored) on a background thread; drop your references now.

    The reaper waits a few seconds for the caller's references to go; at exit Python waits
    (about a minute at most) for retired iterators to be deleted."""
    if iterator is not None:
        _REAPER.retire(iterator)


def wait_retired(timeout=None):
    """Waits (at most `timeout` s; None: no limit) for retired iterators to go; True if all did."""
    return _REAPER.wait(timeout)


def iterate(dataset):
    """Yields the elements of `dataset`, then retires its iterator (see `retire`).

    Args:
        dataset: a `tf.data.Dataset` (or any iterable).

    Yields:
        Its elements, in order.
    """
    iterator = iter(dataset)
    try:
        yield from iterator
    finally:
        retire(iterator)
        del iterator
