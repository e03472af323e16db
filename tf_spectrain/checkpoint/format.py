"""The on-disk format of one checkpoint: its name, its two files, and how they are verified.

A checkpoint is a directory named `ckpt-e{epoch:04d}-b{batch:06d}` (names sort by
`(epoch, batch)`: `epoch` completed epochs, `batch` mini-batches done in the epoch in
progress) that holds two files:

- `arrays.npz`: every array as one `.npy` member of a standard NumPy `.npz` (never pickled);
- `metadata.json`: the format version, epoch and batch, the caller's metadata, and the size,
  SHA-256, keys, dtypes and shapes of `arrays.npz`.

`tf_spectrain.checkpoint.store` writes and reads whole checkpoint directories with these.
Pure Python and NumPy: neither TensorFlow nor Keras.
"""

import datetime
import hashlib
import json
import os
import re
import zipfile
from collections import abc

import numpy as np

from tf_spectrain.checks import show

FORMAT_VERSION = 1

ARRAYS_FILE = "arrays.npz"
METADATA_FILE = "metadata.json"
TMP_PREFIX = ".tmp-"

_NAME_PATTERN = re.compile(r"ckpt-e(\d+)-b(\d+)")
_STORABLE_KINDS = "biufc"  # bool, signed and unsigned int, float, complex: no pickling
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


class UnreadableFile(CheckpointError):
    """A file of a checkpoint that is missing, corrupt or of another format version.

    Attributes:
        file: the file's path.
        problem: what is wrong with it, e.g. "is missing: the checkpoint is incomplete".
    """

    def __init__(self, file, problem):
        super().__init__(f"Checkpoint file {file} {problem}.")
        self.file = file
        self.problem = problem


# --- names --------------------------------------------------------------------------------


def checkpoint_name(epoch, batch):
    """The directory name of the checkpoint after `epoch` epochs and `batch` batches,
    e.g. `ckpt-e0003-b000017`."""
    return f"ckpt-e{epoch:04d}-b{batch:06d}"


def parse_name(name):
    """Reads `(epoch, batch)` from a directory name written by `checkpoint_name`.

    Args:
        name: a directory name (not a path).

    Returns:
        `(epoch, batch)` as ints, or None if `checkpoint_name` would not write `name` (another
        pattern, or other zero padding).
    """
    match = _NAME_PATTERN.fullmatch(name)
    if not match:
        return None
    position = int(match.group(1)), int(match.group(2))
    return position if checkpoint_name(*position) == name else None


# --- what can be stored -------------------------------------------------------------------


def check_arrays(arrays):
    """Checks `save_checkpoint`'s `arrays`.

    Args:
        arrays: a mapping of str keys to arrays (anything `np.asarray` converts).

    Returns:
        A dict of the same keys to NumPy arrays.

    Raises:
        TypeError: `arrays` is not a mapping, a key is not a str, or a value cannot be
            converted to an array or has a dtype that cannot be stored without pickling.
        ValueError: a key is empty, holds a NUL character or is not UTF-8 text.
    """
    if not isinstance(arrays, abc.Mapping):
        raise TypeError(
            "`arrays` must be a dict mapping str keys to NumPy arrays. Received: arrays of "
            f"type {type(arrays).__name__}"
        )
    checked = {}
    for key, value in arrays.items():
        if not isinstance(key, str):
            raise TypeError(
                f"`arrays` keys must be str. Received: key {show(key)} of type "
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
                f"({error}). Received: {show(value)}"
            ) from error
        if array.dtype.kind not in _STORABLE_KINDS:
            raise TypeError(
                f"`arrays[{key!r}]` must have a numeric or bool dtype; dtype {array.dtype} "
                f"cannot be stored without pickling. Received: {show(value)}"
            )
        checked[key] = array
    return checked


def check_metadata(metadata):
    """Checks `save_checkpoint`'s `metadata`.

    Args:
        metadata: a mapping of JSON-serialisable values (dicts with str keys, lists, tuples,
            str, int, float, bool, None).

    Returns:
        `metadata` as JSON stores it (a new dict; tuples as lists).

    Raises:
        TypeError: `metadata` is not a mapping, or not JSON-serialisable (the message names
            the offending key).
    """
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
    return f"{where} is {show(value)} of type {type(value).__name__}"


def _encodable(text):
    """True if `text` can be encoded as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- writing ------------------------------------------------------------------------------


def write_arrays(path, arrays):
    """Writes `arrays` as an `.npz` file at `path` (one uncompressed `.npy` member per key).

    The file is flushed and fsynced before this returns.

    Args:
        path: the file to write.
        arrays: a dict of NumPy arrays, as `check_arrays` returns it.

    Returns:
        The record of the file for `metadata.json`: `npz_size`, `npz_sha256`, `arrays`
        (key -> dtype and shape).
    """
    with open(path, "wb") as file:
        with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as npz:
            for key, array in arrays.items():
                with npz.open(key + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
        file.flush()
        os.fsync(file.fileno())
    size, digest = file_digest(path)
    return {
        "npz_size": size,
        "npz_sha256": digest,
        "arrays": {
            key: {"dtype": array.dtype.str, "shape": list(array.shape)}
            for key, array in arrays.items()
        },
    }


def encode_info(epoch, batch, metadata, record):
    """Encodes the `metadata.json` of a checkpoint of `(epoch, batch)`.

    Args:
        epoch: completed epochs.
        batch: mini-batches done in the epoch in progress.
        metadata: the caller's metadata, as `check_metadata` returns it.
        record: what `write_arrays` returned.

    Returns:
        The file's bytes: UTF-8 JSON with the format version, position, creation time (UTC),
        `metadata` and `record`'s fields.
    """
    info = {
        "format_version": FORMAT_VERSION,
        "epoch": epoch,
        "batch": batch,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "metadata": metadata,
        **record,
    }
    return json.dumps(info, indent=1).encode("utf-8")


def file_digest(path):
    """Measures and hashes the file at `path`.

    Args:
        path: the file.

    Returns:
        `(size in bytes, SHA-256 hex digest)`.

    Raises:
        OSError: if the file cannot be read (e.g. `FileNotFoundError`).
    """
    with open(path, "rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
        return os.fstat(file.fileno()).st_size, digest


# --- reading ------------------------------------------------------------------------------


def read_info(path):
    """Reads and checks the `metadata.json` of the checkpoint directory `path`.

    Args:
        path: the checkpoint directory.

    Returns:
        The info dict (see `tf_spectrain.checkpoint.load_checkpoint`), without `"path"`.

    Raises:
        UnreadableFile: the file is missing, not JSON, of another format version, lacks a
            field, or records another position than the directory's name.
    """
    file = os.path.join(path, METADATA_FILE)
    try:
        with open(file, "rb") as handle:
            info = json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError:
        raise UnreadableFile(file, "is missing: the checkpoint is incomplete") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UnreadableFile(file, f"is not valid JSON ({error})") from None
    if not isinstance(info, dict):
        raise UnreadableFile(file, f"holds a JSON {type(info).__name__}, not an object")
    version = info.get("format_version")
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise UnreadableFile(
            file,
            f"has format version {version!r}; this version of tf_spectrain reads "
            f"format version {FORMAT_VERSION} only",
        )
    for field, kind in _REQUIRED_FIELDS.items():
        value = info.get(field)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UnreadableFile(
                file, f"has no valid {field!r} field (a {kind.__name__}): got {show(value)}"
            )
    position = parse_name(os.path.basename(os.path.normpath(path)))
    if position is not None and position != (info["epoch"], info["batch"]):
        raise UnreadableFile(
            file,
            f"records epoch {info['epoch']} and batch {info['batch']}, which do not match "
            "the directory name",
        )
    return info


def read_arrays(path, info):
    """Reads the `arrays.npz` of the checkpoint directory `path` and verifies it.

    Args:
        path: the checkpoint directory.
        info: its info dict, from `read_info`.

    Returns:
        A dict mapping every key to its array as saved.

    Raises:
        UnreadableFile: the file is missing, has another size or SHA-256 than `info`
            records, does not hold exactly the recorded arrays, or cannot be read.
    """
    file = os.path.join(path, ARRAYS_FILE)
    try:
        size, digest = file_digest(file)
    except FileNotFoundError:
        raise UnreadableFile(file, "is missing: the checkpoint is incomplete") from None
    if size != info["npz_size"]:
        raise UnreadableFile(
            file,
            f"has {size} bytes but {METADATA_FILE} records {info['npz_size']}: it was "
            "truncated or changed",
        )
    if digest != info["npz_sha256"]:
        raise UnreadableFile(
            file, f"is corrupt: its SHA-256 differs from the one {METADATA_FILE} records"
        )
    recorded = info["arrays"]
    try:
        with zipfile.ZipFile(file) as npz:
            _check_members(file, npz.namelist(), recorded)
            arrays = {}
            for key, spec in recorded.items():
                with npz.open(key + ".npy") as member:
                    array = np.lib.format.read_array(member, allow_pickle=False)
                _check_array(file, key, array, spec)
                arrays[key] = array
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise UnreadableFile(file, f"cannot be read as an .npz file ({error})") from None
    return arrays


def _check_members(file, members, recorded):
    """Refuses an `.npz` whose members are not exactly the recorded arrays."""
    stored = {name[: -len(".npy")] for name in members if name.endswith(".npy")}
    others = sorted(name for name in members if not name.endswith(".npy"))
    extra = sorted(stored - set(recorded)) + others
    missing = sorted(set(recorded) - stored)
    if extra or missing:
        raise UnreadableFile(
            file,
            f"does not hold the arrays {METADATA_FILE} records (missing: {show(missing)}; "
            f"not recorded: {show(extra)})",
        )


def _check_array(file, key, array, spec):
    """Refuses an array whose dtype or shape is not the recorded one."""
    recorded = (spec.get("dtype"), spec.get("shape")) if isinstance(spec, dict) else None
    if (array.dtype.str, list(array.shape)) != recorded:
        raise UnreadableFile(
            file,
            f"holds {key!r} with dtype {array.dtype.str} and shape {list(array.shape)}, but "
            f"{METADATA_FILE} records {show(spec)}",
        )
