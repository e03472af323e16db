"""Blocking hand-offs between neighbouring stages that never hang on a failure.

A `Channel` is a FIFO queue. `get` blocks until an item arrives, but wakes up regularly to
check the pipeline's shared `abort` event: when any stage fails, every blocked stage raises
`PipelineAborted` at once instead of waiting forever for data that will never come.
"""

import queue
import threading

_POLL_SECONDS = 0.05


class PipelineAborted(Exception):
    """Raised in a stage thread when another part of the pipeline has failed."""


class Channel:
    """A FIFO hand-off from one stage to another (or to the main thread).

    Args:
        abort: a `threading.Event` shared by the whole pipeline; once set, `get` raises.
        name: for messages, e.g. `"activations 0->1"`.
    """

    def __init__(self, abort, name="channel"):
        self._queue = queue.SimpleQueue()
        self._abort = abort
        self.name = name

    def put(self, item):
        """Appends `item` to the queue (never blocks).

        Args:
            item: what to hand on.
        """
        self._queue.put(item)

    def get(self):
        """Returns the next item, waiting as long as the pipeline is not aborted.

        Returns:
            The oldest item put and not yet taken.

        Raises:
            PipelineAborted: once the pipeline's `abort` event is set, even with items queued.
        """
        while True:
            if self._abort.is_set():
                raise PipelineAborted(f"pipeline aborted while waiting on {self.name}")
            try:
                return self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue

    def empty(self):
        """True if no item is waiting (at the time of the call)."""
        return self._queue.empty()


class FailureBox:
    """Keeps the first failure of any thread and raises it, with its traceback, in the caller."""

    def __init__(self):
        self._lock = threading.Lock()
        self.abort = threading.Event()
        self.error = None
        self.where = None

    def record(self, error, where):
        """Stores `error` (if it is the first real one) and aborts the pipeline.

        A `PipelineAborted` is never stored: it is the consequence of another failure.

        Args:
            error: the exception a thread raised.
            where: where it happened, for the note added when it is re-raised (e.g. "stage 1").
        """
        with self._lock:
            if self.error is None and not isinstance(error, PipelineAborted):
                self.error = error
                self.where = where
        self.abort.set()

    def raise_if_failed(self):
        """Re-raises the first failure in the calling thread, naming where it happened."""
        if self.error is not None:
            error = self.error
            # Errors that say where they come from themselves set `located = True`.
            located = getattr(error, "located", False)
            if self.where and not located and hasattr(error, "add_note"):
                error.add_note(f"(tf_spectrain: raised in {self.where})")
            raise error.with_traceback(error.__traceback__)
        if self.abort.is_set():
            raise PipelineAborted("the pipeline was aborted")


class Board:
    """Values posted under a key, waited for by a known number of readers.

    `wait(key)` blocks until `posts` values have been posted under `key` and returns
    them in posting order; once `readers` threads have read them the key is forgotten.
    Used for what every stage must see before an update: the learning rate a callback
    set for a mini-batch (one post, every stage reads it) and, for `global_clipnorm`,
    every stage's squared gradient norm (one post per stage, every stage reads all).

    Args:
        abort: the pipeline's shared `threading.Event`; once set, `wait` raises.
        posts: values per key.
        readers: reads per key before it is forgotten.
        name: for messages.
    """

    def __init__(self, abort, posts, readers, name="board"):
        self._abort = abort
        self._posts = posts
        self._readers = readers
        self._values = {}  # key -> list of posted values
        self._reads = {}  # key -> reads so far
        self._changed = threading.Condition()
        self.name = name

    def post(self, key, value):
        """Adds `value` under `key`."""
        with self._changed:
            self._values.setdefault(key, []).append(value)
            self._changed.notify_all()

    def wait(self, key):
        """The values posted under `key`, once all of them are in.

        Returns:
            A list of `posts` values, in posting order.

        Raises:
            PipelineAborted: once the pipeline's `abort` event is set.
        """
        with self._changed:
            while len(self._values.get(key, ())) < self._posts:
                if self._abort.is_set():
                    raise PipelineAborted(f"pipeline aborted while waiting on {self.name}")
                self._changed.wait(_POLL_SECONDS)
            values = self._values[key]
            self._reads[key] = self._reads.get(key, 0) + 1
            if self._reads[key] == self._readers:
                del self._values[key], self._reads[key]
            return list(values)


def watched_call(fn, abandon, name, slice_seconds=0.05, left=None):
    """Runs `fn()` in a daemon thread; the caller waits, and gives up when `abandon()` says.

    A read or a graph call on a worker that hangs blocks its thread for ever; run there,
    it blocks only the helper thread, which is left behind.

    Args:
        fn: a function of no arguments.
        abandon: called every `slice_seconds` while `fn` runs: None to keep waiting, or
            the exception to raise instead.
        name: the helper thread's name.
        slice_seconds: how often to ask `abandon`.
        left: None, or a list to which the helper thread is appended when given up on.

    Returns:
        What `fn` returned.

    Raises:
        BaseException: what `abandon()` returned, or whatever `fn` raised.
    """
    done, box = threading.Event(), {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as error:  # re-raised in the caller
            box["error"] = error
        done.set()

    helper = threading.Thread(target=call, name=name, daemon=True)
    helper.start()
    while not done.wait(slice_seconds):
        error = abandon()
        if error is not None:
            if left is not None:
                left.append(helper)
            raise error
    if "error" in box:
        raise box["error"]
    return box["value"]
