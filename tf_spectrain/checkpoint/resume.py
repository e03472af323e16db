"""What `train.py` does with a checkpoint directory: resume from it, or refuse to overwrite it.

`restore_latest` restores the newest checkpoint for `--resume`, `apply_learning_rate` gives
the restored optimizers the run's `--lr`, and `refuse_existing` stops a new run from writing
over another run's checkpoints. Their messages speak of train.py's flags.
"""

import math

import keras

from tf_spectrain import checks
from tf_spectrain.checkpoint import compat, state, store
from tf_spectrain.checkpoint.format import UnreadableFile, read_info


def restore_latest(trainer, directory, facts):
    """Restores the newest checkpoint of `directory` into `trainer`, or says there is none.

    Args:
        trainer: the compiled `PipelineModel` or `keras.Model` of the run.
        directory: the run's checkpoint directory (`--checkpoint-dir`).
        facts: the run's settings that the checkpoint must share (its `metadata`).

    Returns:
        The restored checkpoint's info dict (see `restore_checkpoint`: `epoch`, `batch`,
        `path`, ...), or None if `directory` holds no checkpoint yet (a line says so).

    Raises:
        CheckpointError: the newest checkpoint is corrupt or belongs to another run.
    """
    path = store.latest_checkpoint(directory)
    if path is None:
        print(f"--resume: no checkpoint in {directory} yet; starting from scratch.", flush=True)
        return None
    try:
        return state.restore_checkpoint(trainer, path, metadata=facts)
    except compat.IncompatibleCheckpoint as error:
        raise compat.IncompatibleCheckpoint(
            f"{error} (train.py: another --checkpoint-dir, or another --logdir)"
        ) from None


def refuse_other_settings(directory, facts, **settings):
    """Refuses, before the model is built (or cuts planned), a newest checkpoint of
    `directory` that another run wrote: `restore_latest` then checks the rest.

    Args:
        directory: the run's checkpoint directory (`--checkpoint-dir`).
        facts: the run's settings that the checkpoint must share (its `metadata`).
        **settings: described-run fields to compare where the checkpoint records them,
            e.g. `kind="pipeline", mode="sync", spectrain_target="paper"`.

    Raises:
        CheckpointError: some differ (the message lists them all). Nothing is raised for
            no checkpoint or an unreadable one (`restore_latest` names the file).
    """
    path = store.latest_checkpoint(directory)
    if path is None:
        return
    try:
        info = dict(read_info(path), path=path)
    except UnreadableFile:
        return
    saved = state.flatten_metadata(info["metadata"])
    current = dict(settings, **{f"extra.{k}": v for k, v in facts.items()})
    keys = [k for k in settings if k in saved] + [f"extra.{k}" for k in sorted(facts)]
    try:
        compat.check_compatible(dict(info, metadata=saved), current, keys)
    except compat.IncompatibleCheckpoint as error:
        raise compat.IncompatibleCheckpoint(
            f"{error} (train.py: another --checkpoint-dir, or another --logdir)"
        ) from None


def saved_cuts(directory):
    """The cuts the newest checkpoint of `directory` was trained at, for `--resume`.

    A pipeline with planned cuts (`--cuts auto`) on devices for as many stages resumes at
    the saved cuts, not at a fresh plan (timings vary between runs, so a new plan could
    differ); on devices for another number of stages it plans anew, and the restore
    re-cuts the checkpoint (`restore_checkpoint`).

    Args:
        directory: the run's checkpoint directory.

    Returns:
        The list of cut layer names, or None when there is no readable checkpoint or it
        holds no cuts (the restore then says what is wrong, if anything).
    """
    path = store.latest_checkpoint(directory)
    if path is None:
        return None
    try:
        cuts = read_info(path)["metadata"].get("cuts")
    except (UnreadableFile, KeyError, AttributeError):
        return None
    return list(cuts) if isinstance(cuts, list) else None


def apply_learning_rate(trainer, lr):
    """Gives the restored optimizers this run's `--lr` (the checkpoint holds the old one).

    Momentum and weight decay are settings of the optimizer objects, built from this run's
    flags, so they follow the command line already; the learning rate is a variable that
    the checkpoint restored, and is set back here, so that resuming with a lower `--lr`
    (say, after a non-finite loss) does what it says. A line says so when it changes.

    Args:
        trainer: the restored `PipelineModel` or `keras.Model`.
        lr: the learning rate from now on, a finite number > 0.

    Raises:
        TypeError: `lr` is not a number.
        ValueError: `lr` is not finite or not > 0.
    """
    lr = checks.check_number("lr", lr, 0, strict=True)
    optimizers = state.trainer_optimizers(trainer)
    saved = float(keras.ops.convert_to_numpy(optimizers[0].learning_rate))
    for optimizer in optimizers:
        optimizer.learning_rate = lr
    if not math.isclose(saved, lr, rel_tol=1e-6):  # the saved value is a float32
        print(f"--resume: learning rate {saved:g} in the checkpoint, {lr:g} from now on (--lr).")


def refuse_existing(directory):
    """Refuses to start a new run in a checkpoint directory that already holds checkpoints.

    Args:
        directory: the run's checkpoint directory (`--checkpoint-dir`).

    Raises:
        ValueError: `directory` holds a checkpoint; the message names the newest and says
            how to resume it or where else to write.
    """
    existing = store.latest_checkpoint(directory)
    if existing is not None:
        raise ValueError(
            f"--checkpoint-dir {directory} already holds checkpoints (the "
            f"newest is {existing}). Add --resume to continue that run, or choose another "
            "--checkpoint-dir (or --logdir); nothing there is overwritten."
        )
