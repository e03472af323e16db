"""Checkpoint directories: atomic saves, retention, listing and verified loads.

Why a save never leaves a checkpoint that loads wrong: it is written into a hidden sibling
directory `.tmp-*` (`arrays.npz` first, `metadata.json` last), the files and the directory
are fsynced, and only then is the directory renamed to its final name, which is atomic on
POSIX. A process killed at any moment leaves complete checkpoints plus, at worst, one
`.tmp-*` directory, which readers ignore and the next save removes. Old checkpoints are
removed the same way: renamed to `.tmp-*` first, then deleted. One process writes to a
checkpoint directory at a time. The files themselves are described in
`tf_spectrain.checkpoint.format`. Pure Python and NumPy: neither TensorFlow nor Keras.
"""

import errno
import os
import shutil
import uuid

from tf_spectrain import checks
from tf_spectrain.checkpoint.format import (
    ARRAYS_FILE,
    METADATA_FILE,
    TMP_PREFIX,
    CheckpointError,
    UnreadableFile,
    check_arrays,
    check_metadata,
    checkpoint_name,
    encode_info,
    parse_name,
    read_arrays,
    read_info,
    write_arrays,
)


def save_checkpoint(directory, arrays, metadata, *, epoch, batch=0, keep=3):
    """Writes one checkpoint atomically into `directory`.

    Args:
        directory: the checkpoint directory (str or `os.PathLike`); created if missing.
        arrays: dict mapping non-empty str keys (e.g. `"stage0/variables/3"`) to arrays of a
            numeric or bool dtype, any shape (scalars and empty arrays included).
        metadata: a JSON-serialisable dict with str keys (the caller's: model fingerprint,
            cuts, mode, seed, ...). Tuples are stored as lists.
        epoch: int >= 0, the number of completed epochs.
        batch: int >= 0, mini-batches done in the epoch in progress (0 at epoch ends).
        keep: keep only the newest `keep` checkpoints (by `(epoch, batch)`; the one just
            written is never removed), or `None` to keep all.

    Returns:
        The path of the new checkpoint, `directory/ckpt-eEEEE-bBBBBBB`. A checkpoint that
        already had that name is replaced.

    Raises:
        TypeError: an argument has the wrong type, an array has an object, string or other
            dtype that cannot be stored without pickling, or `metadata` is not
            JSON-serialisable (the message names the offending key).
        ValueError: `epoch` or `batch` is negative, or `keep` is < 1.
        OSError: the directory cannot be created or written.
    """
    directory = checks.check_path("directory", directory)
    arrays = check_arrays(arrays)
    metadata = check_metadata(metadata)
    epoch = checks.check_int("epoch", epoch, 0, meaning="the number of completed epochs")
    batch = checks.check_int(
        "batch", batch, 0, meaning="the mini-batches done in the epoch in progress"
    )
    keep = check_keep(keep)

    os.makedirs(directory, exist_ok=True)
    _remove_leftovers(directory)
    name = checkpoint_name(epoch, batch)
    tmp = _hidden_name(directory, name, "new")
    os.mkdir(tmp)
    try:
        record = write_arrays(os.path.join(tmp, ARRAYS_FILE), arrays)
        _write_file(os.path.join(tmp, METADATA_FILE), encode_info(epoch, batch, metadata, record))
        _fsync_dir(tmp)
        final = os.path.join(directory, name)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(directory)
    _apply_retention(directory, keep, written=name)
    return final


def check_keep(keep):
    """`keep` checked as an int >= 1 (TypeError, ValueError), or None for all checkpoints."""
    return checks.check_int("keep", keep, 1, none_ok=True)


def list_checkpoints(directory):
    """Lists the complete checkpoints in `directory`, oldest first.

    A checkpoint is complete when its directory has a checkpoint name and holds
    `metadata.json` (written last, before the atomic rename). `.tmp-*` directories and
    anything else are ignored. Contents are not verified here: `load_checkpoint` does that.

    Args:
        directory: the checkpoint directory (str or `os.PathLike`).

    Returns:
        A list of checkpoint paths sorted by `(epoch, batch)`; `[]` if there are none or
        `directory` does not exist.

    Raises:
        TypeError: `directory` is not a path.
    """
    directory = checks.check_path("directory", directory)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        position = parse_name(name)
        path = os.path.join(directory, name)
        if position is not None and os.path.isfile(os.path.join(path, METADATA_FILE)):
            found.append((position, path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory):
    """The path of the newest complete checkpoint in `directory`, or None if there is none.

    Raises TypeError if `directory` is not a path."""
    paths = list_checkpoints(directory)
    return paths[-1] if paths else None


def load_checkpoint(path):
    """Loads and verifies one checkpoint.

    Args:
        path: a checkpoint directory, e.g. from `latest_checkpoint`.

    Returns:
        `(arrays, info)`: `arrays` maps every key to its array as saved; `info` is the
        `metadata.json` dict: `"format_version"`, `"epoch"`, `"batch"`, `"metadata"` (the
        caller's dict), `"created"`, `"npz_size"`, `"npz_sha256"`, `"arrays"` (key ->
        dtype and shape), plus `"path"`.

    Raises:
        TypeError: `path` is not a path.
        CheckpointError: the checkpoint is missing, incomplete, corrupt or of another
            format version. The message names the file, says what is wrong and which
            checkpoint directory to delete to fall back to the previous one.
    """
    path = checks.check_path("path", path)
    if not os.path.isdir(path):
        raise CheckpointError(
            f"Checkpoint {path} does not exist or is not a directory. Pass a path "
            "returned by latest_checkpoint() or list_checkpoints()."
        )
    try:
        info = read_info(path)
        arrays = read_arrays(path, info)
    except UnreadableFile as error:
        raise CheckpointError(f"{error} {_fallback_advice(path)}") from None
    info["path"] = path
    return arrays, info


def _fallback_advice(path):
    """What to do with an unusable checkpoint: which directory to delete, what comes next."""
    path = os.path.normpath(path)
    parent, name = os.path.split(path)
    position = parse_name(name)
    if position is None:
        return f"Delete or replace {path}."
    older = [
        other
        for other in list_checkpoints(parent or os.curdir)
        if parse_name(os.path.basename(other)) < position
    ]
    if older:
        return (
            f"Delete the checkpoint directory {path} to fall back to the previous "
            f"checkpoint {older[-1]}."
        )
    return (
        f"Delete the checkpoint directory {path}; no older checkpoint exists in "
        f"{parent or os.curdir}, so training would start from scratch."
    )


# --- directory housekeeping ---------------------------------------------------------------


def _hidden_name(directory, name, why):
    """A fresh `.tmp-*` path in `directory` for checkpoint `name` (`why`: new, removed...)."""
    return os.path.join(
        directory, f"{TMP_PREFIX}{why}-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )


def _remove(path):
    """Deletes a file or directory tree, ignoring errors."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def _remove_leftovers(directory):
    """Removes `.tmp-*` entries: saves and removals cut short by a killed process."""
    for name in os.listdir(directory):
        if name.startswith(TMP_PREFIX):
            _remove(os.path.join(directory, name))


def _publish(tmp, final):
    """Renames `tmp` to `final`; an existing `final` is first renamed out of the way."""
    replaced = None
    if os.path.lexists(final):
        replaced = _hidden_name(os.path.dirname(final), os.path.basename(final), "replaced")
        os.rename(final, replaced)
    try:
        os.rename(tmp, final)
    except OSError:
        if replaced:
            os.rename(replaced, final)
        raise
    if replaced:
        _remove(replaced)


def _apply_retention(directory, keep, written):
    """Removes all but the newest `keep` checkpoints, never the one named `written`."""
    if keep is None:
        return
    paths = list_checkpoints(directory)
    for path in paths[:-keep]:
        if os.path.basename(path) != written:
            hidden = _hidden_name(directory, os.path.basename(path), "removed")
            os.rename(path, hidden)  # atomic: never a half-deleted checkpoint under its name
            _remove(hidden)


def _write_file(path, data):
    """Writes `data` to `path`, flushed and fsynced."""
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _fsync_dir(path):
    """Fsyncs a directory (so that renames in it are durable), where the system can."""
    if os.name == "nt":  # Windows cannot open directories; its renames are journaled
        return
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    except OSError as error:
        if error.errno != errno.EINVAL:  # EINVAL: the file system cannot sync directories
            raise
    finally:
        os.close(handle)
