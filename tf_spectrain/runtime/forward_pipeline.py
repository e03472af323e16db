"""A forward-only pipeline: inference batches flow through the stages, one thread per stage.

`run_forward` feeds batches to stage 0's thread; each stage runs its inference forward on
its own device and hands the outputs to the next, so up to `window` batches are in flight
and the stages compute at the same time, as in training. The caller's thread receives the
last stage's results in order and consumes them (`evaluate` updates its metrics, `predict`
keeps the outputs) while the stages go on. Nothing is read back to the host on the way:
each stage's layer losses travel with the batch as tensors.

`run_in_order` is the same computation with the stages one after another in the caller's
thread (one device busy at a time); benchmarks compare the two.
"""

import threading

from tf_spectrain.runtime import stall
from tf_spectrain.runtime.handoff import Channel, FailureBox, PipelineAborted
from tf_spectrain.workflow.iterators import iterate

_STOP = "tf_spectrain.forward.stop"  # follows the last batch down the pipeline
_POLL_SECONDS = 0.05


class ForwardResult:
    """One batch out of the last stage.

    Attributes:
        index: the batch's position in the data (0, 1, ...).
        outputs: the last stage's output tensors (a list).
        penalties: every stage's layer losses for this batch (a list of scalar tensors).
        extra: what `split` kept beside the inputs (labels for `evaluate`), or None.
    """

    __slots__ = ("index", "outputs", "penalties", "extra")

    def __init__(self, index, outputs, penalties, extra):
        self.index = index
        self.outputs = outputs
        self.penalties = penalties
        self.extra = extra


def _stage_note(runner, index):
    """The note that says which stage failed, on which batch."""
    return (
        f"(tf_spectrain: stage {runner.k} on {runner.device} failed in the inference "
        f"forward of batch {index})"
    )


def _add_note(error, note):
    """Adds `note` to `error` (Python 3.11+)."""
    if hasattr(error, "add_note"):
        error.add_note(note)


class _ForwardRun:
    """The threads, hand-offs and failure box of one `run_forward` call."""

    def __init__(self, runners, batches, split, window, stall_timeout):
        self.runners = runners
        self.batches = batches
        self.split = split
        self.failure = FailureBox()
        self.progress = stall.Progress()
        self.where = [self.progress.record(f"stage {r.k} on {r.device}") for r in runners]
        self.watch = stall.StallWatch(self.progress, stall_timeout,
                                      lambda error: self.failure.record(error, None),
                                      label="an inference pipeline (predict or evaluate)")
        self.window = window
        abort = self.failure.abort
        n = len(runners)
        self.channels = [Channel(abort, f"inference {k}->{k + 1}") for k in range(n - 1)]
        self.results = Channel(abort, "inference results")
        self.slots = threading.Semaphore(window)

    def _take_slot(self, index):
        self.where[0].waits(f"room for batch {index} (at most {self.window} batches in "
                            "flight: the caller takes the results)")
        while not self.slots.acquire(timeout=_POLL_SECONDS):
            if self.failure.abort.is_set():
                raise PipelineAborted("aborted")
        self.where[0].runs()

    def _send(self, k, item):
        (self.channels[k] if k < len(self.runners) - 1 else self.results).put(item)

    def _feed(self):
        """Stage 0: reads the data, runs the first stage, hands each batch on."""
        runner, where = self.runners[0], self.where[0]
        index = 0
        while True:
            where.at(f"the inference forward of batch {index}")
            self._take_slot(index)
            where.waits(f"batch {index} from the data")
            try:
                element = next(self.batches, _STOP)
                inputs, extra = (None, None) if element is _STOP else self.split(element)
            except Exception as error:
                _add_note(error, f"(tf_spectrain: raised reading batch {index} of the data)")
                raise
            if element is _STOP:
                break
            where.runs()
            try:
                outputs, penalty = runner.infer(inputs)
            except Exception as error:
                _add_note(error, _stage_note(runner, index))
                raise
            self.progress.beat()
            self._send(0, ForwardResult(index, outputs, [penalty], extra))
            index += 1
        self._send(0, _STOP)

    def _relay(self, k):
        """Stage k > 0: runs its forward on each batch the previous stage hands on."""
        runner, where = self.runners[k], self.where[k]
        index = 0
        while True:
            where.at(f"the inference forward of batch {index}")
            where.waits(f"batch {index} from stage {k - 1}")
            item = self.channels[k - 1].get()
            if isinstance(item, str) and item == _STOP:
                self._send(k, _STOP)
                return
            where.runs()
            try:
                item.outputs, penalty = runner.infer(item.outputs)
            except Exception as error:
                _add_note(error, _stage_note(runner, item.index))
                raise
            self.progress.beat()
            index = item.index + 1
            item.penalties.append(penalty)
            self._send(k, item)

    def _thread_main(self, k):
        self.progress.attach()  # a trace in this thread stops the stall clock
        try:
            self._feed() if k == 0 else self._relay(k)
        except BaseException as error:  # re-raised in the caller's thread
            self.failure.record(error, None)  # the error's note says where
        finally:
            self.progress.detach()

    def run(self, consume):
        threads = [
            threading.Thread(target=self._thread_main, args=(k,), name=f"infer-{k}", daemon=True)
            for k in range(len(self.runners))
        ]
        stall.refuse_if_left_behind(self.runners)
        with self.watch:
            for t in threads:
                t.start()
            try:
                while True:
                    result = self.results.get()
                    if isinstance(result, str) and result == _STOP:
                        break
                    self.slots.release()
                    with self.progress.paused():  # the caller's work stops the stall clock
                        consume(result)
            except BaseException as error:  # anything: re-raised below
                self.failure.record(error, "the caller's thread (consuming the results)")
            finally:
                left = stall.join_or_leave(list(zip(threads, self.where)),
                                           lambda: self.watch.error is not None)
                if left:
                    stall.leave_behind(left, self.runners)
        self.failure.raise_if_failed()


def run_forward(runners, dataset, split, consume, window=None,
                stall_timeout=stall.DEFAULT_TIMEOUT):
    """Runs every batch of `dataset` through the stages as a pipeline, results in order.

    Stage k runs in its own thread and stage k + 1 works on batch i while stage k works
    on batch i + 1. A failure anywhere (a stage, the data, `consume`) stops every thread at
    once and is re-raised here with its traceback; a stage's error has a note naming the
    stage, its device and the batch.

    Args:
        runners: the stages' `StageRunner`s, in order.
        dataset: the batches (a `tf.data.Dataset` or any iterable).
        split: `element -> (inputs, extra)`: the model inputs of a batch and what to keep
            beside them for `consume` (e.g. the labels).
        consume: called in the caller's thread with each `ForwardResult`, in data order.
        window: the most batches in flight at once, an int >= 1; None means
            `len(runners) + 2`.
        stall_timeout: seconds without a finished forward (on any stage; the clock
            stops while `consume` runs) before the run stops with a
            `runtime.stall.PipelineStalledError`; None never stops.

    Returns:
        The number of batches run.

    Raises:
        ValueError: for a bad `window`.
        PipelineStalledError: no stage finished a forward for `stall_timeout`, or a thread
            of an earlier stalled run of these stages is still inside a pass.
    """
    window = len(runners) + 2 if window is None else window
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"`window` must be an int >= 1 (batches in flight). Received: "
                         f"window={window!r}")
    count = [0]

    def counted(result):
        count[0] += 1
        consume(result)

    batches = iterate(dataset)
    try:
        _ForwardRun(runners, batches, split, window, stall_timeout).run(counted)
    finally:
        batches.close()
    return count[0]


def run_in_order(runners, dataset, split, consume):
    """Like `run_forward`, with the stages one after another in the caller's thread.

    Args:
        runners, dataset, split, consume: as `run_forward`.

    Returns:
        The number of batches run.
    """
    count = 0
    for element in iterate(dataset):
        inputs, extra = split(element)
        outputs, penalties = inputs, []
        for runner in runners:
            try:
                outputs, penalty = runner.infer(outputs)
            except Exception as error:
                _add_note(error, _stage_note(runner, count))
                raise
            penalties.append(penalty)
        consume(ForwardResult(count, outputs, penalties, extra))
        count += 1
    return count
