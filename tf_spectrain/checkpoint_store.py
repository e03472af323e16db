"""Checkpoints on disk: atomic writes, retention and verified loads (pure Python + NumPy).

A checkpoint is a directory named `ckpt-e{epoch:04d}-b{batch:06d}` (names sort by
`(epoch, batch)`: `epoch` completed epochs, `batch` mini-batches done in the epoch in
progress) that holds two files:

- `arrays.npz`: every array as one `.npy` member of a standard NumPy `.npz` (never pickled);
- `metadata.json`: the format version, epoch and batch, the caller's metadata, and the size,
  SHA-256, keys, dtypes and shapes of `arrays.npz`.

Why a save never leaves a checkpoint that loads wrong: it is written into a hidden sibling
directory `.tmp-*` (`arrays.npz` first, `metadata.json` last), the files and the directory
are fsynced, and only then is the directory renamed to its final name, which is atomic on
POSIX. A process killed at any moment leaves complete checkpoints plus, at worst, one
`.tmp-*` directory, which readers ignore and the next save removes. Old checkpoints are
removed the same way: renamed to `.tmp-*` first, then deleted. One process writes to a
checkpoint directory at a time.

This module imports neither TensorFlow nor Keras: callers decide which arrays to save.
"""

import datetime
import errno
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import uuid
import zipfile
from collections import abc

import numpy as np

FORMAT_VERSION = 1

ARRAYS_FILE = "arrays.npz"
METADATA_FILE = "metadata.json"
TMP_PREFIX = ".tmp-"

_NAME_PATTERN = re.compile(r"ckpt-e(\d+)-b(\d+)")
_STORABLE_KINDS = "biufc"  # bool, signed and unsigned int, float, complex: no pickling
_SHOW_LIMIT = 120
_REQUIRED_FIELDS = {
    "epoch": int,
    "batch": int,
    "metadata": dict,
    "npz_size": int,
    "npz_sha256": str,
    "arrays": dict,
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupt, incomplete, or written by an incompatible run."""


# --- public API ---------------------------------------------------------------------------


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
    directory = _check_path("directory", directory)
    arrays = _check_arrays(arrays)
    metadata = _check_metadata(metadata)
    epoch = _check_count("epoch", epoch, "the number of completed epochs")
    batch = _check_count("batch", batch, "the mini-batches done in the epoch in progress")
    keep = _check_keep(keep)

    os.makedirs(directory, exist_ok=True)
    _remove_leftovers(directory)
    name = _checkpoint_name(epoch, batch)
    tmp = _hidden_name(directory, name, "new")
    os.mkdir(tmp)
    try:
        record = _write_arrays(os.path.join(tmp, ARRAYS_FILE), arrays)
        info = {
            "format_version": FORMAT_VERSION,
            "epoch": epoch,
            "batch": batch,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "metadata": metadata,
            **record,
        }
        _write_file(os.path.join(tmp, METADATA_FILE), json.dumps(info, indent=1).encode("utf-8"))
        _fsync_dir(tmp)
        final = os.path.join(directory, name)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(directory)
    _apply_retention(directory, keep, written=name)
    return final


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
    directory = _check_path("directory", directory)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        position = _parse_name(name)
        path = os.path.join(directory, name)
        if position is not None and os.path.isfile(os.path.join(path, METADATA_FILE)):
            found.append((position, path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory):
    """The newest complete checkpoint in `directory`.

    Args:
        directory: the checkpoint directory (str or `os.PathLike`).

    Returns:
        The path with the largest `(epoch, batch)`, or `None` if there is none.

    Raises:
        TypeError: `directory` is not a path.
    """
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
    path = _check_path("path", path)
    if not os.path.isdir(path):
        raise CheckpointError(
            f"Checkpoint {path} does not exist or is not a directory. Pass a path "
            "returned by latest_checkpoint() or list_checkpoints()."
        )
    info = _read_info(path)
    arrays = _read_arrays(path, info)
    info["path"] = path
    return arrays, info


def compare_metadata(saved, current, keys):
    """Describes how two metadata dicts differ on the given keys.

    Values are compared as JSON stores them (tuples equal lists; `True` differs from `1`).

    Args:
        saved: the metadata recorded in a checkpoint (`info["metadata"]`).
        current: the metadata of this run.
        keys: the names to compare, e.g. `["model", "cuts", "mode"]`.

    Returns:
        A list of human-readable differences, one per key, e.g.
        `"mode: the checkpoint has 'stash', this run has 'spectrain'"`; lists also say
        which elements differ. A key present on one side only is a difference. `[]` when
        everything matches.

    Raises:
        TypeError: `saved` or `current` is not a dict, or `keys` is not a list of str.
    """
    for name, value in (("saved", saved), ("current", current)):
        if not isinstance(value, abc.Mapping):
            raise TypeError(
                f"`{name}` must be a metadata dict. Received: {name} of type "
                f"{type(value).__name__}"
            )
    keys = _check_keys(keys)
    differences = []
    for key in keys:
        in_saved, in_current = key in saved, key in current
        if not in_saved and not in_current:
            continue
        if not in_saved:
            differences.append(
                f"{key}: the checkpoint does not record it, this run has {_show(current[key])}"
            )
        elif not in_current:
            differences.append(
                f"{key}: the checkpoint has {_show(saved[key])}, this run does not set it"
            )
        else:
            old, new = _as_json(saved[key]), _as_json(current[key])
            if not _same(old, new):
                differences.append(f"{key}: {_describe(old, new)}")
    return differences


def check_compatible(info, current, keys):
    """Refuses a checkpoint written by a run with other settings.

    Args:
        info: the info dict returned by `load_checkpoint`.
        current: the metadata of this run.
        keys: the metadata names that must match, e.g. `["model", "cuts", "mode"]`.

    Raises:
        CheckpointError: some of `keys` differ; the message names the checkpoint and lists
            every difference.
        TypeError: `info` is not a `load_checkpoint` info dict, or see `compare_metadata`.
    """
    if not isinstance(info, abc.Mapping) or not isinstance(info.get("metadata"), abc.Mapping):
        raise TypeError(
            "`info` must be the info dict returned by load_checkpoint(), with a "
            f"'metadata' dict. Received: {_show(info)}"
        )
    differences = compare_metadata(info["metadata"], current, keys)
    if differences:
        listing = "\n".join(f"  - {difference}" for difference in differences)
        raise CheckpointError(
            f"Checkpoint {info.get('path', '(unknown path)')} was written by a different "
            f"run:\n{listing}\nResume with the same settings, or write checkpoints to "
            "another directory (--checkpoint-dir)."
        )


def check_writable_dir(path, what="--checkpoint-dir"):
    """Creates `path` if missing and checks that a file can be written there.

    Cheap (one probe file, written and removed): meant to run before training starts.

    Args:
        path: the directory (str or `os.PathLike`).
        what: how the user named it, for messages (a flag or an argument name).

    Raises:
        TypeError: `path` is not a path.
        ValueError: `path` is a file, cannot be created, or is not writable; the message
            names `what`, `path` and the reason the system gave.
    """
    if not isinstance(what, str):
        raise TypeError(f"`what` must be a str. Received: what={what!r}")
    path = _check_path(what, path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"`{what}` must be a directory, but it is an existing file. Received: "
            f"{what}={path!r}. Remove the file or choose another directory."
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"`{what}` must be a directory that can be created. Received: {what}={path!r}; "
            f"creating it failed: {_reason(error)}"
        ) from error
    try:
        handle, probe = tempfile.mkstemp(prefix=TMP_PREFIX + "probe-", dir=path)
        try:
            os.write(handle, b"probe")
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as error:
        raise ValueError(
            f"`{what}` must be a directory where files can be written. Received: "
            f"{what}={path!r}; writing a file there failed: {_reason(error)}"
        ) from error


# --- validation ---------------------------------------------------------------------------


def _check_path(name, value):
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(
            f"`{name}` must be a path (str or os.PathLike). Received: {name}={_show(value)} "
            f"of type {type(value).__name__}"
        )
    if not value:
        raise ValueError(f"`{name}` must be a non-empty path. Received: {name}=''")
    return value


def _check_count(name, value, meaning):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"`{name}` must be an int >= 0 ({meaning}). Received: {name}={_show(value)} "
            f"of type {type(value).__name__}"
        )
    if value < 0:
        raise ValueError(f"`{name}` must be an int >= 0 ({meaning}). Received: {name}={value}")
    return int(value)


def _check_keep(keep):
    if keep is None:
        return None
    if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 1:
        raise ValueError(
            "`keep` must be an int >= 1 (how many checkpoints to keep) or None to keep all. "
            f"Received: keep={_show(keep)}"
        )
    return int(keep)


def _check_arrays(arrays):
    if not isinstance(arrays, abc.Mapping):
        raise TypeError(
            "`arrays` must be a dict mapping str keys to NumPy arrays. Received: arrays of "
            f"type {type(arrays).__name__}"
        )
    checked = {}
    for key, value in arrays.items():
        if not isinstance(key, str):
            raise TypeError(
                f"`arrays` keys must be str. Received: key {_show(key)} of type "
                f"{type(key).__name__}"
            )
        if not key or "\x00" in key or not _encodable(key):
            raise ValueError(
                "`arrays` keys must be non-empty UTF-8 text without NUL characters. "
                f"Received: key {key!r}"
            )
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"`arrays[{key!r}]` must be a numeric or bool array; NumPy cannot convert it "
                f"({error}). Received: {_show(value)}"
            ) from error
        if array.dtype.kind not in _STORABLE_KINDS:
            raise TypeError(
                f"`arrays[{key!r}]` must have a numeric or bool dtype; dtype {array.dtype} "
                f"cannot be stored without pickling. Received: {_show(value)}"
            )
        checked[key] = array
    return checked


def _check_metadata(metadata):
    if not isinstance(metadata, abc.Mapping):
        raise TypeError(
            "`metadata` must be a JSON-serialisable dict. Received: metadata of type "
            f"{type(metadata).__name__}"
        )
    problem = _json_problem(metadata, "metadata")
    if problem:
        raise TypeError(
            f"`metadata` must be JSON-serialisable (dicts with str keys, lists, str, int, "
            f"float, bool, None): {problem}"
        )
    return json.loads(json.dumps(metadata))


def _json_problem(value, where):
    """Where `value` stops being JSON (a message), or None if it is all JSON."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = _json_problem(item, f"{where}[{index}]")
            if problem:
                return problem
        return None
    if isinstance(value, abc.Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has key {key!r} of type {type(key).__name__}; keys must be str"
            problem = _json_problem(item, f"{where}[{key!r}]")
            if problem:
                return problem
        return None
    return f"{where} is {_show(value)} of type {type(value).__name__}"


def _check_keys(keys):
    if isinstance(keys, str):
        raise TypeError(
            f"`keys` must be a list of metadata names, not one str. Received: keys={keys!r}; "
            f"did you mean keys=[{keys!r}]?"
        )
    try:
        keys = list(keys)
    except TypeError:
        raise TypeError(
            f"`keys` must be a list of metadata names. Received: keys={_show(keys)}"
        ) from None
    bad = [key for key in keys if not isinstance(key, str)]
    if bad:
        raise TypeError(f"`keys` must all be str. Received: keys={_show(keys)}")
    return keys


def _encodable(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- names and directory housekeeping -----------------------------------------------------


def _checkpoint_name(epoch, batch):
    return f"ckpt-e{epoch:04d}-b{batch:06d}"


def _parse_name(name):
    """`(epoch, batch)` for a checkpoint name written by this module, else None."""
    match = _NAME_PATTERN.fullmatch(name)
    if not match:
        return None
    position = int(match.group(1)), int(match.group(2))
    return position if _checkpoint_name(*position) == name else None


def _hidden_name(directory, name, why):
    return os.path.join(
        directory, f"{TMP_PREFIX}{why}-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )


def _remove(path):
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
    if keep is None:
        return
    paths = list_checkpoints(directory)
    for path in paths[:-keep]:
        if os.path.basename(path) != written:
            hidden = _hidden_name(directory, os.path.basename(path), "removed")
            os.rename(path, hidden)  # atomic: never a half-deleted checkpoint under its name
            _remove(hidden)


# --- writing ------------------------------------------------------------------------------


def _write_arrays(path, arrays):
    """Writes the `.npz` (one uncompressed `.npy` member per key); returns its record."""
    with open(path, "wb") as file:
        with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as npz:
            for key, array in arrays.items():
                with npz.open(key + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
        file.flush()
        os.fsync(file.fileno())
    size, digest = _digest(path)
    return {
        "npz_size": size,
        "npz_sha256": digest,
        "arrays": {
            key: {"dtype": array.dtype.str, "shape": list(array.shape)}
            for key, array in arrays.items()
        },
    }


def _write_file(path, data):
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _fsync_dir(path):
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


def _digest(path):
    with open(path, "rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
        return os.fstat(file.fileno()).st_size, digest


# --- reading ------------------------------------------------------------------------------


def _read_info(path):
    file = os.path.join(path, METADATA_FILE)
    try:
        with open(file, "rb") as handle:
            info = json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError:
        raise _unusable(path, file, "is missing: the checkpoint is incomplete") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _unusable(path, file, f"is not valid JSON ({error})") from None
    if not isinstance(info, dict):
        raise _unusable(path, file, f"holds a JSON {type(info).__name__}, not an object")
    version = info.get("format_version")
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise _unusable(
            path,
            file,
            f"has format version {version!r}; this version of tf_spectrain reads "
            f"format version {FORMAT_VERSION} only",
        )
    for field, kind in _REQUIRED_FIELDS.items():
        value = info.get(field)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise _unusable(
                path, file, f"has no valid {field!r} field (a {kind.__name__}): got {_show(value)}"
            )
    position = _parse_name(os.path.basename(os.path.normpath(path)))
    if position is not None and position != (info["epoch"], info["batch"]):
        raise _unusable(
            path,
            file,
            f"records epoch {info['epoch']} and batch {info['batch']}, which do not match "
            "the directory name",
        )
    return info


def _read_arrays(path, info):
    file = os.path.join(path, ARRAYS_FILE)
    try:
        size, digest = _digest(file)
    except FileNotFoundError:
        raise _unusable(path, file, "is missing: the checkpoint is incomplete") from None
    if size != info["npz_size"]:
        raise _unusable(
            path,
            file,
            f"has {size} bytes but {METADATA_FILE} records {info['npz_size']}: it was "
            "truncated or changed",
        )
    if digest != info["npz_sha256"]:
        raise _unusable(
            path, file, f"is corrupt: its SHA-256 differs from the one {METADATA_FILE} records"
        )
    recorded = info["arrays"]
    try:
        with zipfile.ZipFile(file) as npz:
            members = npz.namelist()
            _check_members(path, file, members, recorded)
            arrays = {}
            for key, spec in recorded.items():
                with npz.open(key + ".npy") as member:
                    array = np.lib.format.read_array(member, allow_pickle=False)
                _check_array(path, file, key, array, spec)
                arrays[key] = array
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise _unusable(path, file, f"cannot be read as an .npz file ({error})") from None
    return arrays


def _check_members(path, file, members, recorded):
    stored = {name[: -len(".npy")] for name in members if name.endswith(".npy")}
    others = sorted(name for name in members if not name.endswith(".npy"))
    extra = sorted(stored - set(recorded)) + others
    missing = sorted(set(recorded) - stored)
    if extra or missing:
        raise _unusable(
            path,
            file,
            f"does not hold the arrays {METADATA_FILE} records (missing: {_show(missing)}; "
            f"not recorded: {_show(extra)})",
        )


def _check_array(path, file, key, array, spec):
    recorded = (spec.get("dtype"), spec.get("shape")) if isinstance(spec, dict) else None
    if (array.dtype.str, list(array.shape)) != recorded:
        raise _unusable(
            path,
            file,
            f"holds {key!r} with dtype {array.dtype.str} and shape {list(array.shape)}, but "
            f"{METADATA_FILE} records {_show(spec)}",
        )


def _unusable(path, file, problem):
    return CheckpointError(f"Checkpoint file {file} {problem}. {_fallback_advice(path)}")


def _fallback_advice(path):
    """What to do with an unusable checkpoint: which directory to delete, what comes next."""
    path = os.path.normpath(path)
    parent, name = os.path.split(path)
    position = _parse_name(name)
    if position is None:
        return f"Delete or replace {path}."
    older = [
        other
        for other in list_checkpoints(parent or os.curdir)
        if _parse_name(os.path.basename(other)) < position
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


# --- comparing metadata -------------------------------------------------------------------


def _as_json(value):
    """`value` as JSON would store it (tuples become lists), when it is JSON at all."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


def _same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # an exotic object whose == fails or is ambiguous: not the same
        return False


def _describe(old, new):
    text = f"the checkpoint has {_show(old)}, this run has {_show(new)}"
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{text} ({len(old)} elements vs {len(new)})"
        indices = [i for i, (x, y) in enumerate(zip(old, new)) if not _same(x, y)]
        shown = "; ".join(f"element {i}: {_show(old[i])} vs {_show(new[i])}" for i in indices[:3])
        more = f"; and {len(indices) - 3} more" if len(indices) > 3 else ""
        return f"{text} ({shown}{more})"
    if isinstance(old, dict) and isinstance(new, dict):
        names = sorted(set(old) ^ set(new)) + sorted(
            key for key in set(old) & set(new) if not _same(old[key], new[key])
        )
        return f"{text} (differs in {', '.join(repr(name) for name in names)})"
    return text


def _show(value):
    text = repr(value)
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 3] + "..."


def _reason(error):
    return error.strerror or str(error)
