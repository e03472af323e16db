"""Training one prepared `train.py` run: fit, evaluate, export.

`train(run)` trains the `Run` that `tf_spectrain.app.preparation.prepare` set up, writing
telemetry and checkpoints, then evaluates and exports; `request_stop(run)` stops it cleanly;
`run(config)` prepares and trains.
"""

import math
import os
import time

import keras

from tf_spectrain import data
from tf_spectrain.app import preparation
from tf_spectrain.app.run_callbacks import RunProgress, StopOnNonFinite
from tf_spectrain.callbacks import PipelineTrace, Telemetry
from tf_spectrain.pipeline_model import PipelineModel


def request_stop(run):
    """Stops a running `train(run)` cleanly (from a signal handler or another thread).

    The mini-batches in flight finish, a checkpoint is saved, and `train` returns.

    Args:
        run: the `Run` being trained.
    """
    run.stop_requested = True
    if isinstance(run.trainer, PipelineModel):
        run.trainer.request_stop()
    else:
        run.trainer.stop_training = True


def _callbacks(run, progress, telemetry):
    """The run's Keras callbacks: progress, telemetry, TensorBoard, trace, NaN stop, checkpoints."""
    config = run.config
    callbacks = [progress, telemetry]
    if config.graph or config.histograms:
        callbacks.append(
            keras.callbacks.TensorBoard(
                config.logdir,
                write_graph=config.graph,
                histogram_freq=1 if config.histograms else 0,
            )
        )
    if config.trace:
        callbacks.append(PipelineTrace(os.path.join(config.logdir, "trace")))
    if not isinstance(run.trainer, PipelineModel):
        callbacks.append(StopOnNonFinite())
    if run.checkpoint is not None:
        callbacks.append(run.checkpoint)
    return callbacks


def _fit_segments(run):
    """`(start_epoch, skip_batches, stop_epoch)` of each `fit` call of the run."""
    # A run resumed in the middle of an epoch first finishes that epoch (a shorter one),
    # then trains the remaining epochs.
    start, skip, epochs = run.start_epoch, run.start_batch, run.config.epochs
    if start >= epochs:
        return []
    if skip:
        segments = [(start, skip, start + 1)]
        if start + 1 < epochs:
            segments.append((start + 1, 0, epochs))
        return segments
    return [(start, 0, epochs)]


def train(run):
    """Fits and evaluates a prepared run, writing telemetry and checkpoints.

    Every mode writes TensorBoard scalars (`tf_spectrain.callbacks.Telemetry`), saves a
    checkpoint at every epoch end (`tf_spectrain.callbacks.PipelineCheckpoint`) and can resume
    from the newest one exactly: the training data of epoch `e` depends only on the seed and
    `e` (`tf_spectrain.data.load_epochs`), so a resumed run sees the same data as an
    uninterrupted one. A run resumed in the middle of an epoch finishes that epoch first.

    Args:
        run: the `Run` from `prepare`.

    Returns:
        A dict with `interrupted` (stopped by `request_stop` before the last epoch ended),
        `checkpoint` (the newest checkpoint written, or None), `images_per_second`,
        `history` (the Keras history dict), `devices`, `model` (the trained Keras model),
        `telemetry` (the `Telemetry` callback), `wall_time` (s, from the start of
        `prepare`) and, for pipelines, `cuts`. When interrupted it also has `stopped_at`
        (`(epoch, mini-batches done, mini-batches per epoch)`); otherwise `test_accuracy`,
        `test_loss` and, unless `--export none`, `export` (the saved model's path). For a
        language-modelling dataset the loss and accuracy are per token, and the result also
        has `test_perplexity`, `exp(test_loss)`. `images_per_second` counts examples
        (token sequences for a text set).

    Raises:
        NonFiniteLossError: training met a non-finite loss with `--on-nan stop`.
        CheckpointWriteError: a checkpoint could not be written.
    """
    config = run.config
    progress = RunProgress(run)
    telemetry = Telemetry(
        config.logdir,
        log_every=config.log_every,
        prediction_every=config.prediction_every,
        batch_size=config.batch_size,
        steps_per_epoch=run.steps_per_epoch,
    )
    callbacks = _callbacks(run, progress, telemetry)
    history = {}
    run.phase = "training"
    pipeline = isinstance(run.trainer, PipelineModel)
    if pipeline:  # 0: never stop
        run.trainer.stall_timeout = config.stall_timeout or None
    for start, skip, stop in _fit_segments(run):
        if run.stop_requested:
            break
        train_ds = data.load_epochs(
            config.dataset,
            config.batch_size,
            epochs=stop,
            start_epoch=start,
            skip_batches=skip,
            seed=config.seed,
            data_dir=config.data_dir,
            download=config.download,
            limit=config.limit,
        )
        for callback in (run.checkpoint, progress, telemetry):
            if callback is not None:
                callback.resume_batch = skip
        extra = {"on_nan": config.on_nan} if pipeline else {}
        segment = run.trainer.fit(
            train_ds,
            epochs=stop,
            initial_epoch=start,
            steps_per_epoch=run.steps_per_epoch - skip,
            validation_data=run.test_ds,
            shuffle=False,  # load_epochs already shuffles each epoch, seeded
            callbacks=callbacks,
            verbose=config.verbose,
            **extra,
        )
        for key, values in segment.history.items():
            history.setdefault(key, []).extend(values)
    run.phase = "finishing"
    interrupted = run.stop_requested and progress.position < (config.epochs, 0)
    result = {
        "interrupted": interrupted,
        "checkpoint": run.checkpoint.last_path if run.checkpoint is not None else None,
        "images_per_second": progress.images_per_second,
        "history": history,
        "devices": run.device_names,
        "model": run.model,
        "telemetry": telemetry,
    }
    if pipeline:
        result["cuts"] = run.trainer.cuts
    if interrupted:
        result["stopped_at"] = (*progress.position, run.steps_per_epoch)
        result["wall_time"] = time.perf_counter() - run.started
        return result
    test_loss, test_accuracy = run.trainer.evaluate(run.test_ds, verbose=0)
    result.update(test_accuracy=float(test_accuracy), test_loss=float(test_loss))
    if data.get_info(config.dataset).task == "language_model":
        # The loss is the mean cross-entropy per token (accuracy is per token too).
        result["test_perplexity"] = math.exp(test_loss)
    if config.export != "none":
        export_model(run.model, config.export)
        result["export"] = config.export
    result["wall_time"] = time.perf_counter() - run.started
    return result


def export_model(model, path):
    """Saves `model` to `path` atomically: a kill while saving never leaves a broken file.

    The model is saved to a hidden file beside `path`, then renamed to it.

    Args:
        model: the Keras model.
        path: the file to write (a `.keras` name).
    """
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".tmp-{os.getpid()}-{name}")
    try:
        model.save(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def run(config):
    """One whole run of `train.py`: `train(prepare(config))`, returning `train`'s dict."""
    return train(preparation.prepare(config))
