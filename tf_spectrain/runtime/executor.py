"""Runs one epoch of a pipeline: one thread per stage, each walking its instruction list.

`EpochRun` holds an epoch's threads, hand-offs and failure handling, for one pipeline or R
replicas of it; `split_batch` (from `runtime.feed`) cuts a mini-batch into parts.
"""

import threading
import time

import tensorflow as tf

from tf_spectrain import schedule
from tf_spectrain.cluster import watchdog as watchdog_lib
from tf_spectrain.runtime.feed import Feed, split_batch
from tf_spectrain.runtime.handoff import (
    Board,
    Channel,
    FailureBox,
    PipelineAborted,
    watched_call,
)
from tf_spectrain.runtime.loss_scale import shares_scale

__all__ = ["EpochRun", "split_batch", "to_host"]

STOP = "tf_spectrain.stop"  # the marker that follows the last fed mini-batch
# Once a worker is declared lost, how long to wait for the stage threads to end: a thread
# blocked in a remote op on that worker never returns, and is left behind (a daemon).
LOST_JOIN_SECONDS = 1.0
_JOIN_SLICE = 0.05


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
            squared norm of the same mini-batch. Likewise, with sync mode's one dynamic
            loss scale (the runners' `loss_scale.shared`), each update waits for every
            stage's "gradient finite" flag of its mini-batch.
        replicas: None for one pipeline; else R lists of N runners (`runners` is the
            first), the copies of a replicated pipeline (`runtime.replicas`). Every replica
            runs the same op lists on its own `1/R` of each mini-batch (split by
            `runtime.feed.Feed`), with its own hand-offs; before each update, stage k's
            copies wait for each other and sum their gradients. `on_batch` then gets the
            parts of every replica, replica 0's first.

    Mini-batch i's update on every stage uses the learning rate the caller's `on_begin(i)`
    returned (see `run`), so a callback that changes it at a batch's begin reaches every
    stage before that batch's updates, as in `keras.Model.fit`.
    """

    def __init__(
        self, runners, op_lists, batches, micro_batches, keep, label=None, clip_globally=False,
        replicas=None,
    ):
        self.grid = [list(runners)] if replicas is None else [list(r) for r in replicas]
        self.runners = self.grid[0]
        self.op_lists = op_lists
        self.micro_batches = micro_batches
        self.keep = keep
        self.failure = FailureBox()
        abort = self.failure.abort
        n, num_replicas = len(self.runners), len(self.grid)
        self.num_batches = sum(1 for op in op_lists[-1] if op.kind == schedule.UPDATE)
        self.lanes = [_Lane(abort, n, r if num_replicas > 1 else None, clip_globally,
                            shares_scale(self.runners))
                      for r in range(num_replicas)]
        self.feed = Feed(batches, self.num_batches, micro_batches, num_replicas)
        # The R copies of stage k enter their gradients' all-reduce together, once all of
        # them are ready: a replica that failed leaves the others waiting here (where an
        # abort wakes them), not in the collective.
        self.ready = ([Board(abort, num_replicas, num_replicas, f"replicas of stage {k}")
                       for k in range(n)] if num_replicas > 1 else None)
        self.label = label
        self.fed = None  # set to the number of mini-batches fed when stopped early
        self.rates = None  # a Board of each mini-batch's learning rate, when `run` has on_begin
        self._watchdog = None  # the workers' watchdog while `run` runs, with remote stages

    def request_stop(self):
        """Feeds no further mini-batch; the epoch ends once those in flight are done.

        Stage 0 stops feeding, a stop marker follows the last fed mini-batch down the pipeline,
        every stage skips the passes of the mini-batches that were never fed, and the ones in
        flight finish and update (the drain): exactly the schedule of a shorter epoch. Safe to
        call from any thread.
        """
        self.feed.stop.set()

    # --- stage threads ------------------------------------------------------------------

    def _stop_here(self, lane, k, i):
        """Passes the stop marker on from stage k: mini-batch i and later are not fed."""
        if k == 0:
            self.fed = i
        if k < len(self.runners) - 1:
            lane.activations[k].put(STOP)
            if k == 0:
                lane.labels.put(STOP)
        else:
            lane.results.put(STOP)

    def _stage_loop(self, r, k):
        stop_at = None
        for op in self.op_lists[k]:
            if self.failure.abort.is_set():
                raise PipelineAborted("aborted")
            if stop_at is not None and op.batch >= stop_at:
                continue
            try:
                stopped = self._run_op(r, k, op)
            except PipelineAborted:
                raise
            except BaseException as error:
                if hasattr(error, "add_note"):
                    where = f" of {self.label}" if self.label else ""
                    copy = f" of replica {r}" if len(self.grid) > 1 else ""
                    error.add_note(
                        f"(tf_spectrain: stage {k}{copy} on {self.grid[r][k].device} failed "
                        f"in the {op.kind} pass of mini-batch {op.batch}{where})"
                    )
                raise
            if stopped is not None:
                stop_at = stopped

    def _run_op(self, r, k, op):
        """Runs one op of stage k of replica r; returns the first batch not fed, once stopping."""
        runner, lane = self.grid[r][k], self.lanes[r]
        last = k == len(self.runners) - 1
        key = (op.batch, op.micro)
        if op.kind == schedule.FORWARD:
            if k == 0:
                if op.micro == 0 and op.batch > 0 and not self.feed.feeds(op.batch):
                    self._stop_here(lane, k, op.batch)
                    return op.batch
                x, y, share = self.feed.part(r, op.batch, op.micro)
                if not last:
                    lane.labels.put((y, share))
            else:
                handed = lane.activations[k - 1].get()
                if isinstance(handed, str) and handed == STOP:
                    self._stop_here(lane, k, op.batch)
                    return op.batch
                x, share = handed
            if last:
                if k > 0:
                    y, share = lane.labels.get()
                loss, logits = runner.forward(key, x, self.keep[k](key), labels=y, scale=share)
                if self._watchdog is not None:
                    loss, logits = to_host((loss, logits))
                lane.losses.setdefault(op.batch, []).append((loss, logits, y))
            else:
                # Every stage weighs its layer losses by the micro-batch's share, so that
                # a mini-batch's M micro-batches add them up once, as the loss is.
                outputs = runner.forward(key, x, self.keep[k](key), scale=share)
                lane.activations[k].put((outputs, share))
            if self._watchdog is not None:
                # The caller reads the layer losses: a copy here, not a remote read there.
                penalties = runner.penalties.get(op.batch)
                if penalties:
                    penalties[-1] = to_host(penalties[-1])
        elif op.kind == schedule.BACKWARD:
            grads_out = None if last else lane.gradients[k].get()
            grads_in = runner.backward(key, grads_out)
            if k > 0:
                lane.gradients[k - 1].put(grads_in)
        else:
            rate = None if self.rates is None else self.rates.wait(op.batch)[0]
            if self.ready is not None:
                self.ready[k].post(op.batch, (r, runner.pending_gradient))
                gathered = [g for _, g in sorted(self.ready[k].wait(op.batch), key=_first)]
                runner.reduce_pending(gathered)  # the sum over the replicas, in every copy
            squares = None
            if lane.norms is not None:
                lane.norms.post(op.batch, (k, runner.pending_square_norm()))
                squares = [x for _, x in sorted(lane.norms.wait(op.batch), key=_first)]
            finite = None
            if lane.flags is not None:  # sync mode's one loss scale: all stages decide together
                finite = _gathered(lane.flags, op.batch, k, runner.pending_finite())
            runner.update(learning_rate=rate, squares=squares, finite=finite)
            if last:
                lane.results.put((op.batch, lane.losses.pop(op.batch)))
        return None

    def _begin(self, i, on_begin):
        """Caller: runs `on_begin(i)` and posts its learning rate, if batch i is to be fed."""
        if self.feed.may_begin(i):
            self.rates.post(i, on_begin(i))

    def _thread_main(self, r, k):
        try:
            self._stage_loop(r, k)
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
        replicated = len(self.grid) > 1
        threads = [
            threading.Thread(target=self._thread_main, args=(r, k), daemon=True,
                             name=f"stage-{k}-replica-{r}" if replicated else f"stage-{k}")
            for r in range(len(self.grid)) for k in range(len(self.runners))
        ]
        if on_begin is not None:
            self.rates = Board(self.failure.abort, 1, len(threads), "learning rates")
        self._watchdog = watchdog = watchdog_lib.watch(
            [runner.device for runners in self.grid for runner in runners],
            lambda error: self.failure.record(error, None),
            label=self.label,
            num_stages=len(self.runners) if replicated else None,
        )
        try:
            self._run_threads(threads, on_batch, on_begin)
        finally:
            if watchdog is not None:
                watchdog.stop()
        if self.failure.abort.is_set():
            for runners in self.grid:
                for runner in runners:
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
                parts = self._results()
                if parts is None:
                    break
                on_batch(i, parts)
                if on_begin is not None and i + 1 < self.num_batches:
                    self._begin(i + 1, on_begin)
        except BaseException as error:  # anything: the caller re-raises it
            self.failure.record(error, "the training loop (callbacks)")
        finally:
            _join(threads, self._watchdog)

    def _results(self):
        """The next mini-batch's parts from every replica's last stage; None once stopped."""
        parts = []
        for lane in self.lanes:
            result = lane.results.get()
            if isinstance(result, str) and result == STOP:
                return None  # every replica stops at the same mini-batch
            parts.extend(result[1])
        return parts

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

        def abandon():
            if self.failure.abort.is_set():
                return PipelineAborted("the pipeline aborted while waiting on a read")
            return None

        return watched_call(fn, abandon, "tf_spectrain-wait", _JOIN_SLICE)


def _gathered(board, i, k, value):
    """Posts stage k's `value` of mini-batch i on `board`; every stage's, stage 0's first."""
    board.post(i, (k, value))
    return [x for _, x in sorted(board.wait(i), key=_first)]


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


class _Lane:
    """One replica's hand-offs: activations, gradients, labels, results, losses, norms, flags."""

    def __init__(self, abort, n, r, clip_globally, shared_scale=False):
        of = "" if r is None else f" of replica {r}"
        self.activations = [Channel(abort, f"activations {k}->{k + 1}{of}") for k in range(n - 1)]
        self.gradients = [Channel(abort, f"gradients {k + 1}->{k}{of}") for k in range(n - 1)]
        self.labels = Channel(abort, f"labels 0->last{of}")
        self.results = Channel(abort, f"results{of}")
        self.losses = {}  # last stage: i -> [(scaled loss, logits, labels)] until its update
        self.norms = Board(abort, n, n, f"gradient norms{of}") if clip_globally else None
        # Sync mode's one loss scale: every stage's "gradient finite" flag of a mini-batch.
        self.flags = Board(abort, n, n, f"gradient flags{of}") if shared_scale else None
