"""Runs one epoch of a pipeline: one thread per stage, each walking its instruction list.

`EpochRun` holds an epoch's threads, data feed, watchdog and failure handling, for one
pipeline or R replicas of it, and reports each mini-batch's results to the caller's thread;
what each stage thread does with its ops is `runtime.stage_threads`.
"""

import threading

import tensorflow as tf

from tf_spectrain import schedule
from tf_spectrain.cluster import watchdog as watchdog_lib
from tf_spectrain.runtime import stall
from tf_spectrain.runtime.feed import Feed
from tf_spectrain.runtime.handoff import Board, FailureBox, PipelineAborted, watched_call
from tf_spectrain.runtime.loss_scale import shares_scale
from tf_spectrain.runtime.stage_threads import STOP, StageThreads

__all__ = ["EpochRun"]

_JOIN_SLICE = 0.05


class EpochRun:
    """One epoch: its stage threads, the data feed, the failure box and the caller's side.

    Stage k's thread executes `op_lists[k]` (from `tf_spectrain.schedule`) in order, as
    `runtime.stage_threads.StageThreads` says. Activations go
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
        stall_timeout: seconds without a finished pass (on any stage) before the epoch
            stops with a `runtime.stall.PipelineStalledError`; None never stops.

    Mini-batch i's update on every stage uses the learning rate the caller's `on_begin(i)`
    returned (see `run`), so a callback that changes it at a batch's begin reaches every
    stage before that batch's updates, as in `keras.Model.fit`.
    """

    def __init__(
        self, runners, op_lists, batches, micro_batches, keep, label=None, clip_globally=False,
        replicas=None, stall_timeout=stall.DEFAULT_TIMEOUT, accumulate=1,
    ):
        self.grid = [list(runners)] if replicas is None else [list(r) for r in replicas]
        self.runners = self.grid[0]
        self.failure = FailureBox()
        self.num_batches = sum(1 for op in op_lists[-1] if op.kind == schedule.UPDATE)
        self.feed = Feed(batches, self.num_batches, micro_batches, len(self.grid))
        self.stages = StageThreads(self.grid, op_lists, self.feed, keep, self.failure, label,
                                   clip_globally, shares_scale(self.runners))
        self.stages.accumulate = accumulate
        self.label = label
        self.stall_timeout = stall_timeout
        self._watchdog = None  # the workers' watchdog while `run` runs, with remote stages
        self._stall = None  # the StallWatch while `run` runs

    @property
    def fed(self):
        """The number of mini-batches fed, once stopped early; else None."""
        return self.stages.fed

    def request_stop(self):
        """Feeds no further mini-batch; the epoch ends once those in flight are done.

        Stage 0 stops feeding, a stop marker follows the last fed mini-batch down the pipeline,
        every stage skips the passes of the mini-batches that were never fed, and the ones in
        flight finish and update (the drain): exactly the schedule of a shorter epoch. Safe to
        call from any thread.
        """
        self.feed.stop.set()

    def _begin(self, i, on_begin):
        """Caller: runs `on_begin(i)` and posts its learning rate, if batch i is to be fed."""
        if self.feed.may_begin(i):
            self.stages.rates.post(i, on_begin(i))

    def run(self, on_batch, on_begin=None):
        """Runs the epoch; calls `on_batch(i, parts)` in this thread as results arrive.

        `on_begin(i)` (if given) runs in this thread before mini-batch i's updates: for
        batch 0 before the stages start, for batch i + 1 right after `on_batch(i)`, and
        only for batches that are fed. It returns the learning rate for mini-batch i's
        updates on every stage (a float), or None to leave each stage's optimizer as it is.

        Any exception in any thread (or in `on_batch`) aborts the whole pipeline at once:
        blocked hand-offs wake up and stop, and the stages forget their in-flight state.

        When no stage finishes a pass for `stall_timeout` seconds (the clock stops while
        this thread runs `on_batch` and `on_begin`), a `runtime.stall.StallWatch` aborts
        the epoch with a `PipelineStalledError` that says where every stage is. When stages
        are on workers of a connected cluster, a watchdog (`tf_spectrain.cluster.watchdog`)
        checks those workers while the epoch runs; one that stops answering aborts the
        epoch with a `WorkerLostError`. In both cases the stage threads are then waited for
        at most `stall.LEAVE_AFTER_SECONDS` each: a thread inside an op that never returns
        is left behind (a daemon thread; after a stall, the next run of these stages
        refuses to start until it has returned). In every other case every thread is
        joined.

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
            PipelineStalledError: if no stage finished a pass for `stall_timeout`, or a
                thread of an earlier stalled run of these stages is still inside a pass.
        """
        if stall.refuse_if_left_behind(self._all_runners):
            for runner in self._all_runners:
                runner.reset()  # what a thread left behind wrote on its way out
        replicated = len(self.grid) > 1
        threads = [
            threading.Thread(target=self.stages.main, args=(r, k), daemon=True,
                             name=f"stage-{k}-replica-{r}" if replicated else f"stage-{k}")
            for r in range(len(self.grid)) for k in range(len(self.runners))
        ]
        if on_begin is not None:
            self.stages.rates = Board(self.failure.abort, 1, len(threads), "learning rates")
        self._watchdog = watchdog = watchdog_lib.watch(
            [runner.device for runners in self.grid for runner in runners],
            lambda error: self.failure.record(error, None),
            label=self.label,
            num_stages=len(self.runners) if replicated else None,
        )
        self.stages.remote = watchdog is not None
        self._stall = stall.StallWatch(self.stages.progress, self.stall_timeout,
                                       lambda error: self.failure.record(error, None),
                                       label=self.label)
        try:
            with self._stall:
                self._run_threads(threads, on_batch, on_begin)
        finally:
            if watchdog is not None:
                watchdog.stop()
        if self.failure.abort.is_set():
            for runner in self._all_runners:
                runner.reset()
        self._raise_if_failed()

    def _run_threads(self, threads, on_batch, on_begin):
        paused = self.stages.progress.paused  # the caller's work stops the stall clock
        try:
            if on_begin is not None:
                with paused():
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
                with paused():
                    on_batch(i, parts)
                    if on_begin is not None and i + 1 < self.num_batches:
                        self._begin(i + 1, on_begin)
        except BaseException as error:  # anything: the caller re-raises it
            self.failure.record(error, "the training loop (callbacks)")
        finally:
            self._join(threads)

    def _join(self, threads):
        """Joins the stage threads; after a stall or a lost worker, each only for a while."""
        watchdog, watch = self._watchdog, self._stall
        # `threads` are in the order of `where`'s records: replica 0's stages first.
        pairs = list(zip(threads, [w for row in self.stages.where for w in row], strict=True))
        left = stall.join_or_leave(pairs, lambda: watch.error is not None or (
            watchdog is not None and watchdog.lost.is_set()))
        if left and watch.error is not None:
            stall.leave_behind(left, self._all_runners)

    @property
    def _all_runners(self):
        """Every runner, replica 0's stages first."""
        return [runner for runners in self.grid for runner in runners]

    def _results(self):
        """The next mini-batch's parts from every replica's last stage; None once stopped."""
        parts = []
        for lane in self.stages.lanes:
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
