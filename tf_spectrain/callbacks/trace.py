"""`PipelineTrace`: a timeline of every epoch, to open in Perfetto or `chrome://tracing`.

    pipe.fit(x, y, epochs=2, callbacks=[tf_spectrain.callbacks.PipelineTrace("runs/trace")])
    # then open runs/trace/trace_epoch_0.json in https://ui.perfetto.dev

The stages already time every pass (`StageRunner.timeline`); this callback reads those
times at each epoch's end and writes them in the trace-event format
(`callbacks.trace_events`).
"""

import json
import os
import time

import keras

from tf_spectrain import checks
from tf_spectrain.callbacks import trace_events
from tf_spectrain.runtime.loop import keep_rules
from tf_spectrain.runtime.stage import ACTIVATIONS

__all__ = ["PipelineTrace"]

_FILE = "trace_epoch_{epoch}.json"


class PipelineTrace(keras.callbacks.Callback):
    """Writes a trace of each epoch's passes, stage by stage, in Chrome's trace-event JSON.

    Each trace has one track per stage (named with its device, its measured busy fraction
    and bubble, and the schedule's bubble), a slice per forward, backward and update pass
    named by mini-batch and micro-batch (`forward 3.1`: mini-batch 3, micro-batch 1), and a
    wait slice for every gap between a stage's passes, named by what the next pass waited
    for (`wait activations 3.1 from stage 0`, `wait gradient 3.1 from stage 2`, `wait
    input 3.0` on stage 0, `wait before update 3`; `host` on the last stage between its own
    forward and backward, `idle: drained` after its last pass). The busy fraction is the
    stage's time in its passes over the epoch's training wall time: `Telemetry`'s
    `pipeline/stage_<k>/utilisation`. Open a trace in https://ui.perfetto.dev or
    `chrome://tracing`.

    A backward that recomputes its forward (`recompute`, or the modes whose backward uses
    other weights than its forward) includes that recomputation: the runtime times it as
    one pass, so its slice is named `backward 3.0 (recomputes)`, not split in two. With
    `replicas`, the tracks are those of replica 0 (the copies run the same op lists).

    Pass by pass the stages time every pass whether or not a trace is on. Windows
    (`steps_per_execution = K > 1`, and "auto") run every pass of K mini-batches in one
    graph call; with `pass_times=True` this callback asks them (`needs_pass_times`) to
    take the time each pass ends inside the graph, and each slice then starts when the
    stage's previous pass ended or, if later, when the neighbour's pass it takes its input
    from ended (waiting on the host between windows shows as `host`). With
    `pass_times=False` windows have one slice per window.

    Args:
        path: a directory, for one file per epoch (`trace_epoch_<epoch>.json`), or a file
            name ending in `.json`, which may contain `{epoch}` (else each epoch overwrites
            it).
        batches: None for every mini-batch, or `(start, stop)`: only the passes of
            mini-batches `start..stop-1` of each epoch, over the time they span.
        pass_times: whether windows time each pass (see above).

    Attributes:
        paths: the files written so far.
        stage_stats: per traced epoch, a list of per-stage dicts: `stage`, `device`,
            `busy_seconds`, `busy_fraction`, `bubble` (1 - busy fraction) and
            `bubble_schedule` (the stage's idle share of the schedule's clock table).
        last_trace: the last trace written, as a dict.
        overhead_seconds: time spent in this callback.

    Raises:
        TypeError: if `path` is not a path, or `batches` not a pair of ints.
        ValueError: if the directory cannot be created or written, or `batches` is not
            `(start, stop)` with `0 <= start < stop`.
    """

    reads_model_weights = False  # the pipeline's stages, not the wrapped model's weights

    def __init__(self, path, batches=None, pass_times=True):
        super().__init__()
        path = checks.check_path("path", path)
        if path.endswith(".json"):
            checks.check_writable_dir("path", os.path.dirname(os.path.abspath(path)))
            self._template = path
        else:
            self._template = os.path.join(checks.check_writable_dir("path", path), _FILE)
        self.batches = _check_batches(batches)
        checks.check_bool("pass_times", pass_times)
        self.pass_times = pass_times
        # Read by `fit` (`runtime.loop.pass_times`): windows then time each pass.
        self.needs_pass_times = pass_times
        self.state = None
        self.paths, self.stage_stats = [], []
        self.last_trace = None
        self.overhead_seconds = 0.0
        self._epoch_start = self._window_start = None
        self._windows, self._done = [], 0

    def set_pipeline(self, pipeline):
        """Called by `PipelineModel.fit`: trace this pipeline (through its read-only state).

        Args:
            pipeline: the `PipelineModel` being fitted.
        """
        self.state = pipeline.state

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._window_start = None
        self._windows, self._done = [], 0

    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if self._epoch_start is None:
            self._epoch_start = now  # just before the stage threads (or windows) start
        self._window_start = now

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        start = self._window_start if self._window_start is not None else now
        self._windows.append((self._done, batch + 1, start, now))
        self._done = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        if self.state is None or not self.state.epoch_progress:
            return  # a plain keras.Model: no stages to trace
        started = time.perf_counter()
        trace = self.trace_of_epoch(epoch)
        path = self._template.format(epoch=epoch)
        _write_json(path, trace)
        self.paths.append(path)
        self.last_trace = trace
        if trace["otherData"]["stages"]:
            self.stage_stats.append(trace["otherData"]["stages"])
        self.overhead_seconds += time.perf_counter() - started

    def trace_of_epoch(self, epoch):
        """The trace of the current (or last) epoch, as a dict (`trace_events`' format)."""
        state = self.state
        title = f"tf_spectrain pipeline ({state.mode}), epoch {epoch}"
        timelines = state.timelines
        if not any(timelines):
            trace = trace_events.window_trace(self._windows, title)
            trace["otherData"]["epoch"] = epoch
            return trace
        done = state.epoch_progress[1] or state.epoch_progress[2]
        lists = state.op_lists(done)
        rules = keep_rules(state.plans, lists, state.recompute)
        recomputes = [lambda key, rule=rule: rule(key) != ACTIVATIONS for rule in rules]
        trace = trace_events.pipeline_trace(
            timelines, lists, state.devices, self._epoch_start, state.epoch_seconds,
            self.batches, recomputes, title)
        trace["otherData"].update(epoch=epoch, mode=state.mode, schedule=state.schedule,
                                  micro_batches=state.micro_batches)
        return trace


def _check_batches(batches):
    """`batches` is None or `(start, stop)` with `0 <= start < stop`; as a tuple."""
    if batches is None:
        return None
    if not isinstance(batches, (list, tuple)) or len(batches) != 2:
        raise TypeError("`batches` must be None or a pair (start, stop) of mini-batch "
                        f"indices. Received: batches={batches!r}")
    for name, value in zip(("batches[0]", "batches[1]"), batches):
        checks.check_int(name, value, 0)
    if batches[0] >= batches[1]:
        raise ValueError("`batches` must be (start, stop) with start < stop (mini-batches "
                         f"start..stop-1). Received: batches={tuple(batches)!r}")
    return tuple(batches)


def _write_json(path, trace):
    """Writes `trace` to `path` atomically (a temporary file, then a rename)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as handle:
        json.dump(trace, handle, separators=(",", ":"))
    os.replace(temporary, path)
