"""The epoch loop of `PipelineModel.fit`: callbacks, schedules, stage threads or windows.

Each epoch builds every stage's instruction list (`PipelineOptions.op_lists`) and runs it
either pass by pass, with one thread per stage (`runtime.executor.EpochRun`, reporting
each finished mini-batch to the Keras callbacks from the caller's thread), or in windows
of K mini-batches, one graph call each (`runtime.window_epoch.WindowedEpoch`, reporting
each window), as `window_size` decides: pass by pass only under `compile(run_eagerly=True)`
and for mode 2bw under a dynamic loss scale. The pipeline drains at
every epoch end; the trained weights are then copied back into the wrapped model before
`on_epoch_end` when a callback may read them (`keras_fit.may_read_weights`), and at the
end of `fit` (`partition.mirror`: no weights cross to other hosts otherwise).
"""

import contextlib
import time

import keras
import tensorflow as tf

from tf_spectrain import prediction, schedule
from tf_spectrain.cluster import health
from tf_spectrain.runtime.bookkeeping import NonFiniteLossError
from tf_spectrain.runtime.executor import EpochRun
from tf_spectrain.runtime.probe import detach_probes
from tf_spectrain.runtime.stage import ACTIVATIONS, INPUTS, WEIGHTS
from tf_spectrain.runtime.window_epoch import WindowedEpoch
from tf_spectrain.schedule.windows import EpochWindows
from tf_spectrain.workflow import keras_fit

AUTO = "auto"
AUTO_WINDOW = 8
"""Mini-batches per graph call with `steps_per_execution="auto"` where callbacks allow."""
SHORT_FIT = 64
"""With `"auto"`, a `fit` of fewer mini-batches than this runs windows of one."""
_BATCH_HOOKS = ("on_train_batch_begin", "on_batch_begin", "on_train_batch_end", "on_batch_end")


def _per_batch(callback):
    """Whether a user's callback has its own per-batch hooks: a method of its class, or one
    given to the instance (`keras.callbacks.LambdaCallback(on_train_batch_end=...)`). Keras'
    own and ours run per window, as they do under `keras.Model.fit` with
    `steps_per_execution`."""
    module = type(callback).__module__ or ""
    return _defines(callback, _BATCH_HOOKS, keras_own=module.split(".")[0] not in (
        "keras", "tf_spectrain"))


def _defines(callback, hooks, keras_own=True):
    """Whether `callback` has any of `hooks` of its own: given to the instance, or (unless
    `keras_own` is False) a method of its class other than `keras.callbacks.Callback`'s."""
    if any(hook in vars(callback) for hook in hooks):
        return True
    return keras_own and any(
        getattr(type(callback), hook, None) is not getattr(keras.callbacks.Callback, hook)
        for hook in hooks)


def has_test_batch_hooks(callbacks):
    """Whether any of the user's `callbacks` has test-batch hooks (TensorBoard's, say), which
    validation and `evaluate` then call per batch with the running logs, as Keras does."""
    return any(_defines(c, ("on_test_batch_begin", "on_test_batch_end"))
               for c in callbacks or ())


def window_size(setting, callbacks, run_eagerly=False, devices=(), num_batches=None):
    """The mini-batches a `fit` runs per graph call.

    Args:
        setting: the compiled `steps_per_execution`: an int >= 1, or `"auto"`.
        callbacks: the user's callbacks of this `fit` (a list, or None).
        run_eagerly: the compiled `run_eagerly`: True runs pass by pass.
        devices: the stages' device names.
        num_batches: the mini-batches this `fit` trains (all its epochs), or None when
            unknown.

    Returns:
        None with `run_eagerly` (each pass its own call from its stage's thread). Else the
        int itself; for `"auto"`, `AUTO_WINDOW`, unless:

        - a callback of the user's own has per-batch hooks: then 1, each mini-batch its
          own call, so those hooks see every mini-batch, as in `keras.Model.fit` with the
          default `steps_per_execution`;
        - a stage is on a worker's CPU: then 1 (across hosts on 100 Mbit/s, VGG16 trained
          at 45.6 and 45.1 images/s in stash and paper SpecTrain in windows of one against
          44.9 and 33.3 in windows of 8; docs/RESULTS.md section 18);
        - the fit is short, fewer than `SHORT_FIT` mini-batches: then 1. Windows of one
          have three shapes whatever the epoch's length (the first, the steady and the
          last window), small graphs built in a fraction of the time of windows of 8,
          whose shapes depend on the epoch's length: a fit of a new length builds new
          ones, seconds that a short fit does not win back (docs/RESULTS.md section 17).

        A callback that asks for each pass's times (`needs_pass_times = True`, as
        `callbacks.PipelineTrace` does) gets them from the window graphs (`pass_times`).
    """
    if run_eagerly:
        return None
    if setting != AUTO:
        return int(setting)
    if any(_per_batch(c) for c in callbacks or ()) or on_workers_cpus(devices):
        return 1
    if num_batches is not None and num_batches < SHORT_FIT:
        return 1
    return AUTO_WINDOW


def on_accelerators(devices):
    """Whether any of the device names is not a CPU (a GPU, a TPU)."""
    return any((tf.DeviceSpec.from_string(d).device_type or "CPU").upper() != "CPU"
               for d in devices)


def on_workers_cpus(devices):
    """Whether a stage is on a worker of a cluster and none on an accelerator."""
    return not on_accelerators(devices) and any(health.task_of(d) is not None for d in devices)


def pass_times(callbacks):
    """Whether any of `callbacks` asks for each pass's times (`needs_pass_times = True`):
    then the window graphs take them too (`WindowedEpoch(timed=True)`)."""
    return any(getattr(c, "needs_pass_times", False) is True for c in callbacks or ())


def keep_rules(plans, lists, recompute="auto"):
    """Decides, for each stage, what the forward of `(i, j)` keeps for its backward.

    With `recompute="auto"` the forward keeps its activations where the backward uses
    the same weights (`PassPlan.same_weights`), else only its inputs, and the backward
    recomputes it at the backward's weights. With `"always"` every forward keeps only its
    inputs; where the backward reuses the forward's weights although updates come in
    between (stash, consistent SpecTrain), it keeps a copy of those weights too.

    Args:
        plans: each stage's `modes.PassPlan`.
        lists: each stage's instruction list for the epoch (from `op_lists`).
        recompute: `"auto"` or `"always"` (see `PipelineModel`).

    Returns:
        A list of functions `keep((i, j))`, one per stage, each returning what
        `StageRunner.forward` takes as `keep`: `ACTIVATIONS`, `INPUTS` or `WEIGHTS`.
    """
    rules = []
    for plan, ops in zip(plans, lists):
        seen = schedule.versions_seen(ops)

        def keep(key, seen=seen, plan=plan):
            i, j = key
            between = seen[(schedule.BACKWARD, i, j)] - seen[(schedule.FORWARD, i, j)]
            if recompute == "auto":
                return ACTIVATIONS if plan.same_weights(between) else INPUTS
            return WEIGHTS if plan.reuses_forward and between else INPUTS

        rules.append(keep)
    return rules


def learning_rate_reader(optimizer):
    """How to read the learning rate that callbacks set, once per mini-batch.

    Callbacks (LearningRateScheduler, ReduceLROnPlateau, a warm-up that sets it on batch
    begin) change the learning rate of `model.optimizer`, the last stage's; every stage's
    update of mini-batch i then uses the value read after `on_train_batch_begin(i)`. A
    `LearningRateSchedule` needs nothing: each stage has its own copy, stepped by its
    own update count.

    Args:
        optimizer: the last stage's optimizer (`model.optimizer` shares its learning rate).

    Returns:
        A function of no arguments returning the learning rate as a float, or None for a
        schedule (or a callable), which is left to each stage.
    """
    if isinstance(prediction.unwrapped(optimizer).get_config()["learning_rate"], dict):
        return lambda: None  # a LearningRateSchedule (or a callable), serialised as a dict
    return lambda: float(optimizer.learning_rate)


class FitLoop:
    """Runs the epochs of one `fit` call of a compiled `PipelineModel`.

    Args:
        pipeline: the `PipelineModel` (compiled).
        callbacks: the `keras.callbacks.CallbackList` of this `fit`.
        logs: the `runtime.bookkeeping.TrainLogs` of this `fit`.
        num_batches: mini-batches per epoch.
        on_nan: `"stop"` or `"skip"`.
        window: mini-batches per graph call (`window_size`): windows of that many
            (`runtime.window_epoch`, with `pipeline.window_functions`; the telemetry's
            prediction probes measure inside them, `runtime.window_probes`); None runs
            every pass from its stage's thread (`runtime.executor`), as does mode 2bw
            under a dynamic loss scale.
    """

    def __init__(self, pipeline, callbacks, logs, num_batches, on_nan, window=1):
        self.pipeline = pipeline
        self.callbacks = callbacks
        self.logs = logs
        self.num_batches = num_batches
        self.on_nan = on_nan
        self.window = window
        self._run = None  # the EpochRun or WindowedEpoch in progress

    def request_stop(self):
        """Feeds no further mini-batch to the epoch in progress (safe from any thread)."""
        run = self._run
        if run is not None:
            run.request_stop()

    def run(self, initial_epoch, epochs, next_batches, validate=None):
        """Trains epochs `initial_epoch..epochs-1` and calls the callbacks' hooks.

        Stops early after an epoch in which a callback set `model.stop_training`.

        Args:
            initial_epoch: the first epoch to train.
            epochs: the epoch to stop before.
            next_batches: `epoch -> iterator of (x, y) mini-batches` of that epoch.
            validate: None, or a function `validate(epoch)` returning the validation logs
                (without the `val_` prefix; `{}` for none), called at the end of each
                epoch that was not cut short.

        Returns:
            The last epoch's logs (`{}` if no epoch ran).

        Raises:
            NonFiniteLossError: a non-finite loss with `on_nan="stop"`.
            Exception: whatever a stage thread or a callback raised, re-raised here.
        """
        try:
            return self._epochs(initial_epoch, epochs, next_batches, validate)
        except BaseException as error:
            # Validation, a checkpoint or a callback may be the first to meet a lost worker.
            lost = health.note_lost_workers(error, self.pipeline.all_devices,
                                            self.pipeline.num_stages)
            if not lost:  # the weights trained so far, in the model (the error goes on)
                with contextlib.suppress(Exception):
                    self.pipeline.copy_weights_to_model()
            raise

    def _epochs(self, initial_epoch, epochs, next_batches, validate):
        pipe, callbacks = self.pipeline, self.callbacks
        callbacks.on_train_begin()
        # As Keras' fit: BackupAndRestore may have restored the model and its epoch.
        initial_epoch = keras_fit.start_epoch(pipe, initial_epoch)
        # The model gets the stages' weights before epoch hooks only if a callback may read
        # them (each copy crosses the links to the stages' hosts), and at the end.
        reads = any(keras_fit.may_read_weights(c) for c in callbacks.callbacks)
        logs = {}
        for epoch in range(initial_epoch, epochs):
            self.logs.reset()
            callbacks.on_epoch_begin(epoch)
            pipe.copy_weights_to_stages()  # callbacks may have set the model's weights
            try:
                self._run_epoch(epoch, next_batches(epoch))
                logs = self.logs.result()
            except NonFiniteLossError:  # with TerminateOnNaN, fit ends as in Keras
                logs = keras_fit.terminate_on_nan(callbacks, pipe.progress, self.logs.result())
                if logs is None:
                    raise
            if reads:
                pipe.copy_weights_to_model()
            cut_short = pipe.progress.epoch_progress[1] < self.num_batches
            if validate is not None and not cut_short:
                logs.update({f"val_{k}": v for k, v in validate(epoch).items()})
            callbacks.on_epoch_end(epoch, logs)
            if pipe.model.stop_training:
                break
        pipe.copy_weights_to_model()
        callbacks.on_train_end(logs)
        return logs

    def _run_epoch(self, epoch, batches):
        """One epoch through the stages (the wrapped model is then behind them)."""
        pipe, progress, n = self.pipeline, self.pipeline.progress, self.num_batches
        options = pipe.options
        lists = options.op_lists(pipe.num_stages, n)
        rules = keep_rules(pipe.plans, lists, options.recompute)
        for runner in pipe.all_runners:
            runner.timeline.clear()
            runner.events.clear()
            runner.memory.reset_peak()  # each epoch's peak
        progress.epoch_progress = (epoch, 0, n)
        optimizer = pipe.runners[-1].optimizer
        read_rate = []  # learning_rate_reader's function, made at the epoch's first batch
        label = f"epoch {epoch}"
        every = options.updates_every(pipe.num_stages)
        # 2bw under a dynamic loss scale runs pass by pass (its held gradients' scales).
        if self.window is not None and (every == 1 or all(r.loss_scale is None
                                                  for r in pipe.all_runners)):
            run, hook = self._windowed(epoch, batches, rules, label)
        else:
            run = EpochRun(
                pipe.runners, lists, batches, options.micro_batches, rules, label=label,
                clip_globally=any(r.global_clipnorm for r in pipe.runners),
                replicas=pipe.replica_runners if options.replicas > 1 else None,
                stall_timeout=pipe.stall_timeout, accumulate=every,
            )

            def hook(i, parts):
                self.logs.record(epoch, i, parts, self.on_nan)
                self._batch_done(run, epoch, i + 1)

        def on_begin(i):
            self.callbacks.on_train_batch_begin(i)
            # Remote reads that a lost worker cannot hang, inside the epoch's `run` (a lost
            # worker is then named): the rate's kind (its config reads the variable), the rate.
            if not read_rate:
                read_rate.append(run.wait_for(lambda: learning_rate_reader(optimizer)))
            return run.wait_for(read_rate[0])

        self._run = run
        started = time.perf_counter()
        lost = False
        try:
            if pipe.model.stop_training:
                run.request_stop()  # stopped from outside before this epoch began
            run.run(hook, on_begin)
        except BaseException as error:
            detach_probes(pipe.runners)  # measurements belong to this fit's callbacks
            # A worker that died fails the epoch with UnavailableError, or with another
            # error (a cancelled receive, say) in a stage that waited on it: either way,
            # its stages' weights can no longer be read (reading them would wait forever).
            lost = health.note_lost_workers(error, pipe.all_devices, pipe.num_stages)
            raise
        finally:
            self._run = None
            progress.epoch_seconds = time.perf_counter() - started
            pipe.epochs_trained += 1
            if not lost:  # a stage's device is gone: its weights cannot be read back
                pipe.epoch_trained()

    def _batch_done(self, run, epoch, done):
        """After mini-batch `done - 1`: progress, `on_train_batch_end`, a requested stop."""
        pipe = self.pipeline
        pipe.progress.epoch_progress = (epoch, done, self.num_batches)
        self.callbacks.on_train_batch_end(done - 1, self.logs.result())
        if pipe.model.stop_training:
            run.request_stop()

    def _windowed(self, epoch, batches, rules, label):
        """The epoch's `WindowedEpoch` and the hook its `run` calls after each window."""
        pipe, options = self.pipeline, self.pipeline.options
        report_stage = 0 if options.mode == "sync" else pipe.num_stages - 1
        windows = EpochWindows(
            lambda t: options.op_lists(pipe.num_stages, t),
            self.num_batches, self.window, report_stage,
        )
        run = WindowedEpoch(pipe.window_functions(self.logs), windows, batches, rules, label,
                            stall_timeout=pipe.stall_timeout,
                            timed=pass_times(self.callbacks.callbacks))

        def on_window(window, losses):
            self.logs.record_window(epoch, window.reported, losses, run.sizes, self.on_nan)
            if window.stop > window.first:
                self._batch_done(run, epoch, window.stop)

        return run, on_window
