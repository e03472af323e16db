"""Runs one epoch of a pipeline: one thread per stage, each walking its instruction list.

`EpochRun` holds an epoch's threads, hand-offs and failure handling; `split_batch` cuts a
mini-batch into GPipe micro-batches.
"""

import threading
import time

import tensorflow as tf

from tf_spectrain import schedule
from tf_spectrain.cluster import watchdog as watchdog_lib
from tf_spectrain.runtime.handoff import Board, Channel, FailureBox, PipelineAborted

STOP = "tf_spectrain.stop"  # the marker that follows the last fed mini-batch
# Once a worker is declared lost, how long to wait for the stage threads to end: a thread
# blocked in a remote op on that worker never returns, and is left behind (a daemon).
LOST_JOIN_SECONDS = 1.0
_JOIN_SLICE = 0.05


def split_batch(x, parts):
    """Splits a batch into `parts` nearly equal slices along the batch axis.

    Args:
        x: a tensor, or a list or tuple of tensors of the same batch size.
        parts: the number of slices (micro-batches), an int >= 1.

    Returns:
        A list of `(slice, size)`; sizes differ by at most one (the first are larger), and
        each slice is a tensor, or a list of tensors when `x` is a list or tuple.

    Raises:
        ValueError: if the batch has fewer than `parts` examples.
    """
    xs = x if isinstance(x, (list, tuple)) else [x]
    n = int(xs[0].shape[0])
    if parts > n:
        raise ValueError(
            f"A mini-batch of {n} examples cannot be split into {parts} micro-batches "
            "(each needs at least one example). This is usually the last, smaller "
            "mini-batch of an epoch: choose a batch size that divides the number of "
            "examples (or drop the remainder), or fewer micro-batches."
        )
    sizes = [n // parts + (1 if j < n % parts else 0) for j in range(parts)]
    pieces = [tf.split(t, sizes) for t in xs]
    out = []
    for j, size in enumerate(sizes):
        part = [p[j] for p in pieces]
        out.append((part if isinstance(x, (list, tuple)) else part[0], size))
    return out


def _first(pair):
    """The first item of a pair (a sort key)."""
    return pair[0]


def to_host(value):
    """Copies the tensors of `value` (a nest) into this process' memory.

    The caller's thread reads each mini-batch's loss, logits and layer losses; when they
    live on a worker, a read there would block for ever if the worker hangs. A stage thread
    (which the epoch can leave behind) copies them instead, once they are computed.

    Args:
        value: a tensor, or a nest of tensors (and other values, kept as they are).

    Returns:
        The same nest, with each tensor replaced by a local tensor of the same value.
    """
    return tf.nest.map_structure(lambda t: tf.constant(t.numpy()) if tf.is_tensor(t) else t,
                                 value)


class EpochRun:
    """The shared state of one epoch: channels, the failure box, the data feed.

    Stage k's thread executes `ops[k]` (from `tf_spectrain.schedule`) in order. Activations go
    from stage k to k+1 and gradients from k+1 to k through blocking `Channel`s, so data
    dependencies, not timing, order the work; which weights each pass uses therefore depends
    only on each stage's own order, as SPECTRAIN.md requires. Stage threads issue their passes
    to their own devices, so the passes of different stages overlap in time.

    Stage 0 pulls mini-batches from the data iterator and sends their labels straight to the
    last stage. The last stage reports each mini-batch's loss and predictions to the caller's
    thread, which runs the Keras callbacks. The epoch ends when every thread has finished its
    list: the pipeline is drained and every backward has been applied.

    Args:
        runners: the `StageRunner`s, stage 0 first.
        op_lists: one op list per stage.
        batches: an iterator of `(x, y)` mini-batches; only stage 0 reads it.
        micro_batches: M, the micro-batches per mini-batch.
        keep: for each stage, a function `(i, j) -> bool` saying whether the forward keeps its
            activations for the backward (see `StageRunner.forward`).
        label: names the epoch in error notes, e.g. "epoch 3".
        clip_globally: every stage clips its update by the global gradient norm over all
            stages (sync mode's `global_clipnorm`): each update waits for every stage's
            squared norm of the same mini-batch.

    Mini-batch i's update on every stage uses the learning rate the caller's `on_begin(i)`
    returned (see `run`), so a callback that changes it at a batch's begin reaches every
    stage before that batch's updates, as in `keras.Model.fit`.
    """

    def __init__(
        self, runners, op_lists, batches, micro_batches, keep, label=None, clip_globally=False
    ):
        self.runners = runners
        self.op_lists = op_lists
        self.batches = batches
        self.micro_batches = micro_batches
        self.keep = keep
        self.failure = FailureBox()
        abort = self.failure.abort
        n = len(runners)
        self.activations = [Channel(abort, f"activations {k}->{k + 1}") for k in range(n - 1)]
        self.gradients = [Channel(abort, f"gradients {k + 1}->{k}") for k in range(n - 1)]
        self.labels = Channel(abort, "labels 0->last")
        self.results = Channel(abort, "results")
        self._micro = {}  # stage 0: i -> list of (x slice, y slice, share)
        self.num_batches = sum(1 for op in op_lists[-1] if op.kind == schedule.UPDATE)
        self.label = label
        self._stop = threading.Event()
        self._losses = {}  # last stage: i -> [(scaled loss, logits, labels)] until its update
        self.fed = None  # set to the number of mini-batches fed when stopped early
        self.rates = None  # a Board of each mini-batch's learning rate, when `run` has on_begin
        self.norms = Board(abort, n, n, "gradient norms") if clip_globally else None
        # Whether mini-batch i is fed and whether its on_begin runs are decided together
        # under this lock, so that after a stop every fed batch, and only those, is begun.
        self._gate = threading.Lock()
        self._begun = -1  # the last mini-batch whose on_begin has run
        self._fed_upto = 0  # the last mini-batch stage 0 has fed (batch 0 always is)
        self._watchdog = None  # the workers' watchdog while `run` runs, with remote stages

    def request_stop(self):
        """Feeds no further mini-batch; the epoch ends once those in flight are done.

        Stage 0 stops feeding, a stop marker follows the last fed mini-batch down the pipeline,
        every stage skips the passes of the mini-batches that were never fed, and the ones in
        flight finish and update (the drain): exactly the schedule of a shorter epoch. Safe to
        call from any thread.
        """
        self._stop.set()

    # --- stage threads ------------------------------------------------------------------

    def _next_input(self, i, j):
        """Stage 0: the input of micro-batch (i, j); reads the data on j == 0."""
        if j == 0:
            try:
                x, y = next(self.batches)
            except StopIteration:
                raise ValueError(
                    f"The training data ran out after {i} mini-batches of an epoch of "
                    f"{self.num_batches}. With `steps_per_epoch`, the dataset must yield "
                    "at least steps_per_epoch * epochs batches (e.g. use `dataset.repeat()`)."
                ) from None
            n = int(tf.nest.flatten(x)[0].shape[0])
            if self.micro_batches == 1:
                self._micro[i] = [(x, y, 1.0)]
            else:
                xs = split_batch(x, self.micro_batches)
                ys = split_batch(y, self.micro_batches)
                self._micro[i] = [(xp, yp, size / n) for (xp, size), (yp, _) in zip(xs, ys)]
        x, y, share = self._micro[i][j]
        if j == self.micro_batches - 1:
            del self._micro[i]
        return x, y, share

    def _stop_here(self, k, i):
        """Passes the stop marker on from stage k: mini-batch i and later are not fed."""
        if k == 0:
            self.fed = i
        if k < len(self.runners) - 1:
            self.activations[k].put(STOP)
            if k == 0:
                self.labels.put(STOP)
        else:
            self.results.put(STOP)

    def _stage_loop(self, k):
        stop_at = None
        for op in self.op_lists[k]:
            if self.failure.abort.is_set():
                raise PipelineAborted("aborted")
            if stop_at is not None and op.batch >= stop_at:
                continue
            try:
                stopped = self._run_op(k, op)
            except PipelineAborted:
                raise
            except BaseException as error:
                if hasattr(error, "add_note"):
                    where = f" of {self.label}" if self.label else ""
                    error.add_note(
                        f"(tf_spectrain: stage {k} on {self.runners[k].device} failed in "
                        f"the {op.kind} pass of mini-batch {op.batch}{where})"
                    )
                raise
            if stopped is not None:
                stop_at = stopped

    def _run_op(self, k, op):
        """Runs one op of stage k; returns the first mini-batch not fed, once stopping."""
        runner = self.runners[k]
        last = k == len(self.runners) - 1
        losses = self._losses
        key = (op.batch, op.micro)
        if op.kind == schedule.FORWARD:
            if k == 0:
                if op.micro == 0 and op.batch > 0 and not self._feeds(op.batch):
                    self._stop_here(k, op.batch)
                    return op.batch
                x, y, share = self._next_input(op.batch, op.micro)
                if not last:
                    self.labels.put((y, share))
            else:
                handed = self.activations[k - 1].get()
                if isinstance(handed, str) and handed == STOP:
                    self._stop_here(k, op.batch)
                    return op.batch
                x, share = handed
            if last:
                if k > 0:
                    y, share = self.labels.get()
                loss, logits = runner.forward(key, x, self.keep[k](key), labels=y, scale=share)
                if self._watchdog is not None:
                    loss, logits = to_host((loss, logits))
                losses.setdefault(op.batch, []).append((loss, logits, y))
            else:
                # Every stage weighs its layer losses by the micro-batch's share, so that
                # a mini-batch's M micro-batches add them up once, as the loss is.
                outputs = runner.forward(key, x, self.keep[k](key), scale=share)
                self.activations[k].put((outputs, share))
            if self._watchdog is not None:
                # The caller reads the layer losses: a copy here, not a remote read there.
                penalties = runner.penalties.get(op.batch)
                if penalties:
                    penalties[-1] = to_host(penalties[-1])
        elif op.kind == schedule.BACKWARD:
            grads_out = None if last else self.gradients[k].get()
            grads_in = runner.backward(key, grads_out)
            if k > 0:
                self.gradients[k - 1].put(grads_in)
        else:
            rate = None if self.rates is None else self.rates.wait(op.batch)[0]
            squares = None
            if self.norms is not None:
                self.norms.post(op.batch, (k, runner.pending_square_norm()))
                squares = [x for _, x in sorted(self.norms.wait(op.batch), key=_first)]
            runner.update(learning_rate=rate, squares=squares)
            if last:
                self.results.put((op.batch, losses.pop(op.batch)))
        return None

    def _feeds(self, i):
        """Stage 0: whether to feed mini-batch i > 0 (no, once stopped, unless it was begun)."""
        with self._gate:
            if self._stop.is_set() and i > self._begun:
                return False
            self._fed_upto = i
            return True

    def _begin(self, i, on_begin):
        """Caller: runs `on_begin(i)` and posts its learning rate, if batch i is to be fed."""
        with self._gate:
            if self._stop.is_set() and i > self._fed_upto:
                return
            self._begun = i
        self.rates.post(i, on_begin(i))

    def _thread_main(self, k):
        try:
            self._stage_loop(k)
        except BaseException as error:  # anything, even KeyboardInterrupt: re-raised in the caller
            self.failure.record(error, None)  # _stage_loop's note says where

    # --- caller -------------------------------------------------------------------------

    def run(self, on_batch, on_begin=None):
        """Runs the epoch; calls `on_batch(i, parts)` in this thread as results arrive.

        `on_begin(i)` (if given) runs in this thread before mini-batch i's updates: for
        batch 0 before the stages start, for batch i + 1 right after `on_batch(i)`, and
        only for batches that are fed. It returns the learning rate for mini-batch i's
        updates on every stage (a float), or None to leave each stage's optimizer as it is.

        Any exception in any thread (or in `on_batch`) aborts the whole pipeline at once:
        blocked hand-offs wake up and stop, and the stages forget their in-flight state.

        When stages are on workers of a connected cluster, a watchdog
        (`tf_spectrain.cluster.watchdog`) checks those workers while the epoch runs; one
        that stops answering aborts the epoch with a `WorkerLostError`. The stage threads
        are then waited for at most `LOST_JOIN_SECONDS`: a thread blocked in a remote op on
        the lost worker never returns and is left behind (it is a daemon thread). In every
        other case every thread is joined.

        Args:
            on_batch: called with mini-batch `i` and `parts`, a list of
                `(scaled_loss, logits, labels)` per micro-batch; it may call `request_stop()`.

        Raises:
            BaseException: the first failure of any stage thread or of `on_batch`, with its
                original traceback, once every thread has ended; a stage's failure has a
                note naming the stage, the pass and the mini-batch, one of `on_batch` a note
                naming the training loop (unless the error says where itself).
            ValueError: from stage 0, if `batches` runs out before the epoch's mini-batches.
            tf_spectrain.cluster.watchdog.WorkerLostError: if a worker holding stages
                stopped answering.
        """
        threads = [
            threading.Thread(target=self._thread_main, args=(k,), name=f"stage-{k}", daemon=True)
            for k in range(len(self.runners))
        ]
        if on_begin is not None:
            self.rates = Board(self.failure.abort, 1, len(self.runners), "learning rates")
        self._watchdog = watchdog = watchdog_lib.watch(
            [runner.device for runner in self.runners],
            lambda error: self.failure.record(error, None),
            label=self.label,
        )
        try:
            self._run_threads(threads, on_batch, on_begin)
        finally:
            if watchdog is not None:
                watchdog.stop()
        if self.failure.abort.is_set():
            for runner in self.runners:
                runner.reset()
        self._raise_if_failed()

    def _run_threads(self, threads, on_batch, on_begin):
        try:
            if on_begin is not None:
                self._begin(0, on_begin)
        except BaseException as error:
            self.failure.record(error, "the training loop (callbacks)")
            self._raise_if_failed()
        for t in threads:
            t.start()
        try:
            for i in range(self.num_batches):
                result = self.results.get()
                if isinstance(result, str) and result == STOP:
                    break
                on_batch(*result)
                if on_begin is not None and i + 1 < self.num_batches:
                    self._begin(i + 1, on_begin)
        except BaseException as error:  # anything: the caller re-raises it
            self.failure.record(error, "the training loop (callbacks)")
        finally:
            _join(threads, self._watchdog)

    def _raise_if_failed(self):
        watchdog = self._watchdog
        if watchdog is not None and watchdog.lost.is_set():
            first = self.failure.error
            if not isinstance(first, tf.errors.UnavailableError):
                # Another failure came first, but the lost worker is what the caller must
                # know: its stages' weights can no longer be read.
                raise watchdog.error from first
        self.failure.raise_if_failed()

    def wait_for(self, fn):
        """Returns `fn()`; with remote stages, gives up on it if the pipeline aborts.

        A read of a stage's variable (a learning rate, say) blocks for ever in the calling
        thread when the stage's worker hangs. With stages on workers, `fn` runs in a helper
        daemon thread while the caller watches the pipeline's abort event; locally it is
        simply called.

        Args:
            fn: a function of no arguments.

        Returns:
            What `fn` returned.

        Raises:
            PipelineAborted: if the pipeline aborted (a worker was lost) before `fn` ended.
            BaseException: whatever `fn` raised.
        """
        if self._watchdog is None:
            return fn()
        done, box = threading.Event(), {}

        def call():
            try:
                box["value"] = fn()
            except BaseException as error:  # re-raised in the caller
                box["error"] = error
            done.set()

        threading.Thread(target=call, name="tf_spectrain-wait", daemon=True).start()
        while not done.wait(_JOIN_SLICE):
            if self.failure.abort.is_set():
                raise PipelineAborted("the pipeline aborted while waiting on a read")
        if "error" in box:
            raise box["error"]
        return box["value"]


def _join(threads, watchdog):
    """Joins the stage threads; once `watchdog` has declared a worker lost, only for a while."""
    if watchdog is None:
        for t in threads:
            t.join()
        return
    until = None
    for t in threads:
        while t.is_alive():
            if until is None and watchdog.lost.is_set():
                until = time.monotonic() + LOST_JOIN_SECONDS
            if until is not None and time.monotonic() >= until:
                return  # the rest are blocked on the lost worker: left behind
            t.join(_JOIN_SLICE)
