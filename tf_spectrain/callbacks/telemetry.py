"""`Telemetry`: TensorBoard scalars of a training run, pipeline internals included.

    pipe.fit(x, y, epochs=5, callbacks=[tf_spectrain.callbacks.Telemetry("runs/exp1")])
    # then: tensorboard --logdir runs

`Telemetry`'s docstring lists the tags it writes; `callbacks.pipeline_scalars` computes the
`pipeline/*` ones.
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.callbacks.pipeline_scalars import PipelineScalars

# "auto" logs so that per-step logging costs under 2% of the step time; aim lower, since
# both the cost of a write and the step time are measured with noise.
_OVERHEAD_TARGET = 0.01
_FIRST_AUTO_INTERVAL = 10


class Telemetry(keras.callbacks.Callback):
    """Writes per-step, per-epoch and per-stage pipeline scalars for TensorBoard.

    Tags written (steps are global mini-batch numbers for `batch/*` and `prediction/*`, epoch
    numbers for `epoch/*` and `pipeline/*`):

    | tag | what |
    |---|---|
    | `batch/<metric>` | running loss and metrics of the epoch, as the progress bar shows them |
    | `batch/learning_rate` | the learning rate |
    | `batch/images_per_second` | training throughput since the previous logged step |
    | `epoch/<metric>`, `epoch/val_<metric>` | epoch-end training and validation results |
    | `epoch/wall_time` | seconds of the epoch, validation included |
    | `pipeline/stage_<k>/busy_seconds` | time stage k spent in its passes during the epoch (*) |
    | `pipeline/stage_<k>/utilisation` | busy time / the epoch's training wall time (*) |
    | `pipeline/bubble_fraction` | measured idle share: 1 - mean utilisation of the stages (*) |
    | `pipeline/bubble_fraction_schedule` | the idle share of the schedule in lock-step slots |
    | `pipeline/stage_<k>/s_f`, `.../s_b` | SpecTrain's version gaps in use (0: current weights) |
    | `pipeline/stage_<k>/memory_bytes` | estimated peak bytes the stage kept in the epoch |
    | `pipeline/stage_<k>/in_flight_bytes` | its in-flight part (`runtime.memory`) |
    | `pipeline/stage_<k>/in_flight_micro_batches` | most micro-batches in flight at once |
    | `pipeline/stage_<k>/device_peak_bytes` | the allocator's peak on the device (GPUs) |
    | `pipeline/skipped_batches` | mini-batches left out by `on_nan="skip"` so far |
    | `pipeline/probe_seconds` | time the prediction measurements added to the stage threads |
    | `run/num_stages` | written once at the start (1 for a plain model) |
    | `prediction/stage_<k>/<pass>_ratio` | `|W_used - W_target| / |W_stale - W_target|` |
    | `prediction/stage_<k>/<pass>_error` | `|W_used - W_target|` (vanilla, stash: the staleness) |
    | `prediction/stage_<k>/<pass>_baseline` | `|W_stale - W_target|` |
    | `prediction/stage_<k>/<pass>_ratio_mean` | per epoch, the mean of the sampled ratios |

    (*) From each pass's end time: the stage threads take it pass by pass; windows take it
    in their graph, since the telemetry asks for it (`needs_pass_times`; a time stamp after
    each pass, about 3% of the step time, docs/trace_overhead.md). With windows, per-step
    scalars are written at the end of a window, and prediction errors are measured inside
    the window graphs (`runtime.window_probes`; `pipeline/probe_seconds` is then 0).

    `<pass>` is `forward` or `backward`. The prediction error is measured, not derived: see
    `tf_spectrain.runtime.probe`. With a plain Keras model (the `single` and `dp` baselines)
    only the `batch/*` and `epoch/*` tags are written (`batch/steps_per_second` instead of
    `batch/images_per_second` when `batch_size` is None).

    Args:
        logdir: the directory for the event files (created if needed).
        log_every: write `batch/*` scalars every this many mini-batches, or `"auto"`:
            adapt the interval so that logging costs under 2% of the training time
            (measured as training goes).
        prediction_every: measure the weight prediction error of mini-batches
            `0, n, 2n, ...` of each epoch, on every stage (pipelines only; 0 turns it off).
        batch_size: the mini-batch size, for `batch/images_per_second` with a plain Keras
            model (a pipeline counts its examples itself). None: log steps per second.
        steps_per_epoch: mini-batches in a whole epoch, for the step numbers (epoch *
            steps_per_epoch + mini-batch), which then continue across `fit` calls and
            resumed runs. None: the `steps` of each `fit`.

    Set `resume_batch` before a `fit` that resumes an epoch in its middle (the restored
    checkpoint's `batch`): that epoch's step numbers then start there.

    Attributes:
        predictions: every prediction measurement so far (dicts, see
            `runtime.probe.WeightProbe`), for scripts and benchmarks.
        stage_stats: per epoch, a list of per-stage dicts (busy seconds, utilisation, and
            the memory figures of the `pipeline/stage_<k>/` tags).
        overhead_seconds: time spent inside this callback.
        batch_log_seconds: the part of it spent on per-step logging.
        probe_seconds: time the prediction measurements added to the stage threads.
        log_interval: the current `log_every` (adapted when "auto").

    Raises:
        ValueError: for a `log_every`, `prediction_every`, `batch_size` or
            `steps_per_epoch` out of range, or a `logdir` that cannot be created or written.
        TypeError: if `logdir` is not a path, or one of those numbers is not an int.
    """

    reads_model_weights = False  # the pipeline's stages, not the wrapped model's weights

    def __init__(
        self, logdir, log_every="auto", prediction_every=10, batch_size=None, steps_per_epoch=None
    ):
        super().__init__()
        checks.check_int("log_every", log_every, 1, allow=("auto",))
        if prediction_every != 0:
            checks.check_int("prediction_every", prediction_every, 1)
        for name, value in (("batch_size", batch_size), ("steps_per_epoch", steps_per_epoch)):
            if value is not None:
                checks.check_int(name, value, 1)
        self.logdir = checks.check_writable_dir("logdir", logdir)
        self.steps_per_epoch = steps_per_epoch
        self.resume_batch = 0
        self.log_every = log_every
        self.prediction_every = prediction_every
        self.needs_pass_times = True  # windows time each pass: the stages' utilisation
        self.batch_size = batch_size
        self.state = None  # the pipeline's PipelineState, None for a plain Keras model
        self._pipeline_scalars = None  # the PipelineScalars of `state`
        self.predictions = []
        self.stage_stats = []
        self.overhead_seconds = 0.0
        self.batch_log_seconds = 0.0
        self.probe_seconds = 0.0
        # "auto" logs step 1, then every 10th until it has measured what a log costs.
        self.log_interval = _FIRST_AUTO_INTERVAL if log_every == "auto" else log_every
        self._writer = None
        self._writers_by_tags = {}  # tuple of tags -> tf.function writing them
        self._started = self._ended = None

    def set_pipeline(self, pipeline):
        """Called by `PipelineModel.fit`: watch this pipeline (through its read-only state).

        Args:
            pipeline: the `PipelineModel` being fitted.
        """
        self.state = pipeline.state
        self._pipeline_scalars = PipelineScalars(self.state)

    # --- helpers --------------------------------------------------------------------------

    def _scalar(self, tag, value, step):
        """Writes one scalar (eagerly) to the default writer."""
        tf.summary.scalar(tag, float(value), step=int(step))

    def _write_many(self, values, step):
        """Writes `{tag: value}` in one graph call; True when this call traced the graph."""
        # One graph call: a few eager ops per tag cost more. Tracing is a one-time cost, so
        # the caller does not count it as a logging cost.
        tags = tuple(values)
        writer = self._writers_by_tags.get(tags)
        traced = writer is None
        if traced:

            def write(vector, step):
                for n, tag in enumerate(tags):
                    tf.summary.scalar(tag, vector[n], step=step)

            writer = self._writers_by_tags[tags] = tf.function(write)
        writer(tf.constant([values[t] for t in tags], tf.float32), tf.constant(step, tf.int64))
        return traced

    def _learning_rate(self):
        """The model's optimizer's learning rate, or None without an optimizer."""
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return None
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))

    def _images(self):
        """Training examples so far (steps, when a plain model's batch size is unknown)."""
        if self.state is not None:
            return self.state.images_seen
        return self._step * (self.batch_size or 1)

    def _global_step(self, epoch, batch):
        """The step number of mini-batch `batch` of `epoch` (counted from the run's start)."""
        per_epoch = self.steps_per_epoch or self.params.get("steps") or 0
        return epoch * per_epoch + batch

    def _probes(self):
        """The probes attached to the pipeline's stages (none for a plain model)."""
        return () if self.state is None else self.state.probes

    def _write_predictions(self):
        """Writes the completed prediction measurements and keeps them in `predictions`."""
        for probe in self._probes():
            for result in probe.take_results():
                self.predictions.append(result)
                self._epoch_ratios.setdefault(
                    (result["epoch"], result["stage"], result["pass"]), []
                ).append(result["ratio"])
                step = self._global_step(result["epoch"], result["batch"])
                prefix = f"prediction/stage_{result['stage']}/{result['pass']}"
                for name in ("ratio", "error", "baseline"):
                    if math.isfinite(result[name]):
                        self._scalar(f"{prefix}_{name}", result[name], step)

    # --- callback hooks -------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        started = time.perf_counter()
        self._writer = tf.summary.create_file_writer(self.logdir)
        self._writers_by_tags = {}  # traced with the writer above: new ones for each fit
        with self._writer.as_default():
            # The first summary op of a process costs ~0.2 s of set-up: pay it here, once,
            # rather than in the first step's timing.
            stages = self.state.num_stages if self.state is not None else 1
            self._scalar("run/num_stages", stages, 0)
        self._step = 0
        self._epoch_done = 0
        self._last_log = (started, 0, 0)  # (time, step, images)
        self._started, self._ended = started, None
        self._log_costs = []
        self._epoch, self._offset = 0, 0
        self._epoch_ratios = {}  # (epoch, stage, pass) -> ratios not yet averaged
        if self.state is not None and self.prediction_every:
            self.state.attach_probes(self.prediction_every)
        self.overhead_seconds += time.perf_counter() - started

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._offset, self.resume_batch = epoch, self.resume_batch, 0
        self._epoch_done = 0  # mini-batches of this epoch reported so far
        self._epoch_start = time.perf_counter()
        for probe in self._probes():
            probe.epoch, probe.offset = epoch, self._offset

    def on_train_batch_end(self, batch, logs=None):
        started = time.perf_counter()
        # Count mini-batches by index: with steps_per_execution = K (Keras', or a pipeline's
        # windows) one call ends K of them. Log the first call, and every call that passes
        # a multiple of the interval.
        advanced = max(batch + 1 - self._epoch_done, 1)
        self._epoch_done = batch + 1
        self._step += advanced
        before = self._step - advanced
        if self._step // self.log_interval == before // self.log_interval and before:
            spent = time.perf_counter() - started
            self.overhead_seconds += spent
            self.batch_log_seconds += spent
            return
        last_time, last_step, last_images = self._last_log
        images = self._images()
        rate = (images - last_images) / max(started - last_time, 1e-9)
        values = {f"batch/{name}": float(value) for name, value in (logs or {}).items()}
        lr = self._learning_rate()
        if lr is not None:
            values["batch/learning_rate"] = lr
        if before:
            counts_images = self.state is not None or self.batch_size
            name = "images_per_second" if counts_images else "steps_per_second"
            values[f"batch/{name}"] = rate
        with self._writer.as_default():
            traced = self._write_many(values, self._global_step(self._epoch, self._offset + batch))
            self._write_predictions()
        finished = time.perf_counter()
        if not traced:
            self._log_costs = (self._log_costs + [finished - started])[-5:]
        self._last_log = (finished, self._step, self._images())
        if self.log_every == "auto" and before and self._log_costs:
            per_step = (started - last_time) / max(self._step - last_step, 1)
            # The dearest of the last few writes: one cheap write must not shrink the
            # interval below what the usual ones need.
            needed = max(self._log_costs) / (_OVERHEAD_TARGET * max(per_step, 1e-9))
            self.log_interval = max(1, math.ceil(needed))
        self.overhead_seconds += finished - started
        self.batch_log_seconds += finished - started

    def on_epoch_end(self, epoch, logs=None):
        started = time.perf_counter()
        with self._writer.as_default():
            for name, value in (logs or {}).items():
                self._scalar(f"epoch/{name}", value, epoch)
            self._scalar("epoch/wall_time", started - self._epoch_start, epoch)
            if self.state is not None:
                self._write_stages(epoch)
                self._write_predictions()
                self._write_prediction_means()
        self._writer.flush()
        self.overhead_seconds += time.perf_counter() - started

    def _write_stages(self, epoch):
        """Writes the epoch's `pipeline/*` scalars and keeps its per-stage figures."""
        stats, scalars = self._pipeline_scalars.of_epoch()
        for tag, value in scalars.items():
            self._scalar(tag, value, epoch)
        self.stage_stats.append(stats)
        self.probe_seconds = scalars["pipeline/probe_seconds"]

    def _write_prediction_means(self, final=False):
        """Writes the mean ratio per stage and pass of each epoch whose measurements are done."""
        # Passes of the last mini-batches of an epoch may aim at versions that the stage
        # reaches in the next epoch (deep pipelines), so an epoch's mean is written one
        # epoch later, or at the end of training (`final`), at that epoch's step.
        for key in sorted(k for k in self._epoch_ratios if final or k[0] < self._epoch):
            epoch, stage, kind = key
            ratios = [r for r in self._epoch_ratios.pop(key) if math.isfinite(r)]
            if ratios:
                self._scalar(f"prediction/stage_{stage}/{kind}_ratio_mean", np.mean(ratios), epoch)

    def on_train_end(self, logs=None):
        self._ended = time.perf_counter()
        if self._writer is not None:
            with self._writer.as_default():
                self._write_predictions()
                self._write_prediction_means(final=True)
        if self.state is not None:
            self.state.detach_probes()
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    @property
    def overhead_fraction(self):
        """Time spent in this callback during training / the training time so far."""
        elapsed = (self._ended or time.perf_counter()) - self._started
        return self.overhead_seconds / elapsed if elapsed > 0 else 0.0
