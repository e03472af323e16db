"""`Telemetry`: TensorBoard scalars of a training run, pipeline internals included.

    pipe.fit(x, y, epochs=5, callbacks=[tf_spectrain.callbacks.Telemetry("runs/exp1")])
    # then: tensorboard --logdir runs

Tags written (steps are global mini-batch numbers for `batch/*` and `prediction/*`, epoch
numbers for `epoch/*` and `pipeline/*`):

| tag | what |
|---|---|
| `batch/<metric>` | running loss and metrics of the epoch, as the progress bar shows them |
| `batch/learning_rate` | the learning rate |
| `batch/images_per_second` | training throughput since the previous logged step |
| `epoch/<metric>`, `epoch/val_<metric>` | epoch-end training and validation results |
| `epoch/wall_time` | seconds of the epoch, validation included |
| `pipeline/stage_<k>/busy_seconds` | time stage k spent in its passes during the epoch |
| `pipeline/stage_<k>/utilisation` | busy time / the epoch's training wall time |
| `pipeline/bubble_fraction` | measured idle share: 1 - mean utilisation of the stages |
| `pipeline/bubble_fraction_schedule` | the idle share of the schedule in lock-step slots |
| `pipeline/stage_<k>/s_f`, `.../s_b` | SpecTrain's version gaps in use (0: current weights) |
| `pipeline/skipped_batches` | mini-batches left out by `on_nan="skip"` so far |
| `run/num_stages` | written once at the start (1 for a plain model) |
| `prediction/stage_<k>/<pass>_ratio` | `|W_used - W_target| / |W_stale - W_target|` |
| `prediction/stage_<k>/<pass>_error` | `|W_used - W_target|` (vanilla, stash: the staleness) |
| `prediction/stage_<k>/<pass>_baseline` | `|W_stale - W_target|` |
| `prediction/stage_<k>/<pass>_ratio_mean` | per epoch, the mean of the sampled ratios |

`<pass>` is `forward` or `backward`. The prediction error is measured, not derived: see
`tf_spectrain.runtime.probe`. With a plain Keras model (the `single` and `dp` baselines)
only the `batch/*` and `epoch/*` tags are written.
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import modes, schedule
from tf_spectrain.runtime.probe import WeightProbe

# "auto" logs so that per-step logging costs under 2% of the step time; aim lower, since
# both the cost of a write and the step time are measured with noise.
_OVERHEAD_TARGET = 0.01


def _check_positive_int(name, value, allow=()):
    if value in allow:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        extra = "".join(f" or {a!r}" for a in allow)
        raise ValueError(f"`{name}` must be an integer >= 1{extra}. Received: {name}={value!r}")


class Telemetry(keras.callbacks.Callback):
    """Writes per-step, per-epoch and per-stage pipeline scalars for TensorBoard.

    Args:
        logdir: the directory for the event files (created if needed).
        log_every: write `batch/*` scalars every this many mini-batches, or `"auto"`:
            adapt the interval so that logging costs under 2% of the training time
            (measured as training goes).
        prediction_every: measure the weight prediction error of mini-batches
            `0, n, 2n, ...` of each epoch, on every stage (pipelines only; 0 turns it off).
        batch_size: the mini-batch size, for `batch/images_per_second` with a plain Keras
            model (a pipeline counts its examples itself). None: log steps per second.

    Attributes:
        predictions: every prediction measurement so far (dicts, see
            `runtime.probe.WeightProbe`), for scripts and benchmarks.
        stage_stats: per epoch, a list of per-stage dicts (busy seconds, utilisation).
        overhead_seconds: time spent inside this callback.
        batch_log_seconds: the part of it spent on per-step logging.
        log_interval: the current `log_every` (adapted when "auto").

    Raises:
        ValueError: for a bad `log_every`, `prediction_every` or `batch_size`.
        TypeError: if `logdir` is not a path.
    """

    def __init__(self, logdir, log_every="auto", prediction_every=10, batch_size=None):
        super().__init__()
        if not isinstance(logdir, (str, bytes)) and not hasattr(logdir, "__fspath__"):
            raise TypeError(f"`logdir` must be a path. Received: logdir={logdir!r}")
        _check_positive_int("log_every", log_every, allow=("auto",))
        if prediction_every != 0:
            _check_positive_int("prediction_every", prediction_every)
        if batch_size is not None:
            _check_positive_int("batch_size", batch_size)
        self.logdir = str(logdir)
        self.log_every = log_every
        self.prediction_every = prediction_every
        self.batch_size = batch_size
        self.pipeline = None
        self.predictions = []
        self.stage_stats = []
        self.overhead_seconds = 0.0
        self.batch_log_seconds = 0.0
        self.log_interval = 1 if log_every == "auto" else log_every
        self._writer = None
        self._schedule_bubbles = {}  # mini-batches -> the schedule's bubble fraction
        self._started = self._ended = None

    def set_pipeline(self, pipeline):
        """Called by `PipelineModel.fit`: the pipeline whose stages to watch."""
        self.pipeline = pipeline

    # --- helpers --------------------------------------------------------------------------

    def _scalar(self, tag, value, step):
        tf.summary.scalar(tag, float(value), step=int(step))

    def _learning_rate(self):
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return None
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))

    def _images(self):
        if self.pipeline is not None:
            return self.pipeline.images_seen
        return self._step * (self.batch_size or 1)

    def _write_predictions(self):
        if self.pipeline is None:
            return
        steps = self.pipeline.epoch_progress[2] if self.pipeline.epoch_progress else 0
        for runner in self.pipeline.runners:
            if runner.probe is None:
                continue
            for result in runner.probe.take_results():
                result = dict(result, epoch=self._epoch)
                self.predictions.append(result)
                step = self._epoch * steps + result["batch"]
                prefix = f"prediction/stage_{result['stage']}/{result['pass']}"
                for name in ("ratio", "error", "baseline"):
                    if math.isfinite(result[name]):
                        self._scalar(f"{prefix}_{name}", result[name], step)

    # --- callback hooks -------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        started = time.perf_counter()
        self._writer = tf.summary.create_file_writer(self.logdir)
        with self._writer.as_default():
            # The first summary op of a process costs ~0.2 s of set-up: pay it here, once,
            # rather than in the first step's timing.
            stages = self.pipeline.num_stages if self.pipeline is not None else 1
            self._scalar("run/num_stages", stages, 0)
        self._step = 0
        self._last_log = (started, 0, 0)  # (time, step, images)
        self._started, self._ended = started, None
        self._log_seconds = 0.0
        self._epoch = 0
        pipe = self.pipeline
        if pipe is not None and self.prediction_every and pipe.num_stages > 1:
            for runner in pipe.runners:
                horizons = modes.probe_horizons(
                    pipe.mode, runner.k, pipe.num_stages, pipe.spectrain_target
                )
                if max(horizons) > 0:
                    runner.probe = WeightProbe(runner, horizons, self.prediction_every)
        self.overhead_seconds += time.perf_counter() - started

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        started = time.perf_counter()
        self._step += 1
        if self._step % self.log_interval and self._step != 1:
            spent = time.perf_counter() - started
            self.overhead_seconds += spent
            self.batch_log_seconds += spent
            return
        last_time, last_step, last_images = self._last_log
        images = self._images()
        rate = (images - last_images) / max(started - last_time, 1e-9)
        with self._writer.as_default():
            step = self._step - 1
            for name, value in (logs or {}).items():
                self._scalar(f"batch/{name}", value, step)
            lr = self._learning_rate()
            if lr is not None:
                self._scalar("batch/learning_rate", lr, step)
            name = "images_per_second" if self.pipeline or self.batch_size else "steps_per_second"
            if self._step > 1:
                self._scalar(f"batch/{name}", rate, step)
            self._write_predictions()
        finished = time.perf_counter()
        self._log_seconds = finished - started
        self._last_log = (finished, self._step, self._images())
        if self.log_every == "auto" and self._step > 1:
            per_step = (started - last_time) / max(self._step - last_step, 1)
            needed = self._log_seconds / (_OVERHEAD_TARGET * max(per_step, 1e-9))
            self.log_interval = max(1, math.ceil(needed))
        self.overhead_seconds += finished - started
        self.batch_log_seconds += finished - started

    def on_epoch_end(self, epoch, logs=None):
        started = time.perf_counter()
        with self._writer.as_default():
            for name, value in (logs or {}).items():
                self._scalar(f"epoch/{name}", value, epoch)
            self._scalar("epoch/wall_time", started - self._epoch_start, epoch)
            if self.pipeline is not None:
                self._write_stages(epoch)
                self._write_predictions()
                self._write_prediction_means(epoch)
        self._writer.flush()
        self.overhead_seconds += time.perf_counter() - started

    def _write_stages(self, epoch):
        pipe = self.pipeline
        wall = max(pipe.epoch_seconds, 1e-9)
        stats = []
        for runner, plan in zip(pipe.runners, pipe.plans):
            busy = sum(end - start for _, _, start, end in runner.timeline)
            stats.append({"stage": runner.k, "busy_seconds": busy, "utilisation": busy / wall})
            prefix = f"pipeline/stage_{runner.k}"
            self._scalar(f"{prefix}/busy_seconds", busy, epoch)
            self._scalar(f"{prefix}/utilisation", busy / wall, epoch)
            self._scalar(f"{prefix}/s_f", plan.forward_steps, epoch)
            s_b = plan.forward_steps if plan.backward_steps is None else plan.backward_steps
            self._scalar(f"{prefix}/s_b", s_b, epoch)
        self.stage_stats.append(stats)
        mean_util = sum(s["utilisation"] for s in stats) / len(stats)
        self._scalar("pipeline/bubble_fraction", max(0.0, 1.0 - mean_util), epoch)
        done = pipe.epoch_progress[1] if pipe.epoch_progress else 0
        if done:
            if done not in self._schedule_bubbles:
                table = schedule.clock_table(pipe._op_lists(done))  # noqa: SLF001
                self._schedule_bubbles[done] = schedule.bubble_fraction(table)
            self._scalar("pipeline/bubble_fraction_schedule", self._schedule_bubbles[done], epoch)
        self._scalar("pipeline/skipped_batches", pipe.batches_skipped, epoch)

    def _write_prediction_means(self, epoch):
        groups = {}
        for r in self.predictions:
            if r["epoch"] == epoch and math.isfinite(r["ratio"]):
                groups.setdefault((r["stage"], r["pass"]), []).append(r["ratio"])
        for (stage, kind), ratios in sorted(groups.items()):
            self._scalar(f"prediction/stage_{stage}/{kind}_ratio_mean", np.mean(ratios), epoch)

    def on_train_end(self, logs=None):
        self._ended = time.perf_counter()
        if self.pipeline is not None:
            for runner in self.pipeline.runners:
                runner.probe = None
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    @property
    def overhead_fraction(self):
        """Time spent in this callback during training / the training time so far."""
        elapsed = (self._ended or time.perf_counter()) - self._started
        return self.overhead_seconds / elapsed if elapsed > 0 else 0.0
