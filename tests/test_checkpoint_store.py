"""Tests for tf_spectrain.checkpoint.store: naming, ordering, retention, leftovers of killed
writers, corruption reported with the fallback, input validation, kills.

What a checkpoint is on disk (round trips, the recorded info, format version 1) is in
test_checkpoint_format.py.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tf_spectrain.checkpoint import store
from tf_spectrain.checkpoint.format import (
    ARRAYS_FILE,
    METADATA_FILE,
    CheckpointError,
)

HERE = os.path.dirname(os.path.abspath(__file__))
WRITER = os.path.join(HERE, "checkpoint_writer.py")


def _save(directory, epoch, batch=0, keep=None, **arrays):
    arrays = arrays or {"w": np.full((3,), epoch * 100 + batch, np.float32)}
    return store.save_checkpoint(
        directory, arrays, {"run": "test"}, epoch=epoch, batch=batch, keep=keep
    )


def _position(path):
    _, info = store.load_checkpoint(path)
    return info["epoch"], info["batch"]


def _hidden(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith(".tmp-"))


def test_module_imports_neither_tensorflow_nor_keras():
    # The storage modules and what they import (tf_spectrain.checks, .messages), without
    # the __init__.py of the packages, which import TensorFlow.
    code = (
        "import sys, checkpoint_writer\n"
        "checkpoint_writer.load_pure('tf_spectrain.checkpoint.store')\n"
        "checkpoint_writer.load_pure('tf_spectrain.checkpoint.compat')\n"
        "checkpoint_writer.load_pure('tf_spectrain.checkpoint.layout')\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=HERE
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- naming, ordering, retention ----------------------------------------------------------

POSITIONS = [(10, 0), (9, 5), (9, 0), (0, 3), (2, 0), (0, 0), (1, 12), (9, 123456), (100, 2)]


def test_list_and_latest_order_by_epoch_then_batch(tmp_path):
    for epoch, batch in POSITIONS:
        _save(str(tmp_path), epoch, batch)
    listed = store.list_checkpoints(str(tmp_path))
    assert [_position(path) for path in listed] == sorted(POSITIONS)
    assert [os.path.basename(p) for p in listed][:2] == ["ckpt-e0000-b000000", "ckpt-e0000-b000003"]
    assert store.latest_checkpoint(str(tmp_path)) == listed[-1]
    assert _position(listed[-1]) == (100, 2)


def test_listing_ignores_foreign_entries(tmp_path):
    real = _save(str(tmp_path), 1)
    for name in ("ckpt-e3-b0", "ckpt-e0005-b000000.bak", "notes", "ckpt-e0009-b000000x"):
        os.mkdir(tmp_path / name)
        (tmp_path / name / METADATA_FILE).write_text("{}")
    (tmp_path / "ckpt-e0007-b000000").write_text("a file, not a directory")
    assert store.list_checkpoints(str(tmp_path)) == [real]


@pytest.mark.parametrize("directory", ["missing", "missing/deeper", "a_file"])
def test_no_checkpoints_gives_empty_list_and_none(tmp_path, directory):
    (tmp_path / "a_file").write_text("x")
    assert store.list_checkpoints(str(tmp_path / directory)) == []
    assert store.latest_checkpoint(str(tmp_path / directory)) is None


@pytest.mark.parametrize("keep, saves", [(1, 4), (2, 5), (3, 3), (3, 7), (None, 6)])
def test_keep_retains_the_newest(tmp_path, keep, saves):
    steps = [divmod(step, 4) for step in range(saves)]
    for epoch, batch in steps:
        _save(str(tmp_path), epoch, batch, keep=keep)
    expected = steps if keep is None else steps[-keep:]
    assert [_position(p) for p in store.list_checkpoints(str(tmp_path))] == expected
    assert _hidden(str(tmp_path)) == []


def test_keep_never_removes_the_checkpoint_just_written(tmp_path):
    for epoch in (5, 6, 7):
        _save(str(tmp_path), epoch, keep=2)
    path = _save(str(tmp_path), 1, keep=2)  # older than the others, e.g. a restarted run
    assert os.path.isdir(path)
    assert [_position(p) for p in store.list_checkpoints(str(tmp_path))] == [(1, 0), (6, 0), (7, 0)]


def test_saving_an_existing_name_replaces_it(tmp_path):
    _save(str(tmp_path), 2, w=np.zeros(3))
    path = _save(str(tmp_path), 2, v=np.full((2,), 5, np.int64))
    arrays, _ = store.load_checkpoint(path)
    assert list(arrays) == ["v"]
    np.testing.assert_array_equal(arrays["v"], [5, 5])
    assert store.list_checkpoints(str(tmp_path)) == [path]
    assert _hidden(str(tmp_path)) == []


# --- leftovers of killed writers ----------------------------------------------------------


def test_tmp_leftovers_are_ignored_then_removed_by_the_next_save(tmp_path):
    directory = str(tmp_path)
    older = _save(directory, 1)
    # A writer killed mid-save leaves a hidden directory, possibly complete-looking.
    leftover = tmp_path / ".tmp-new-ckpt-e0002-b000000-123-abcd"
    leftover.mkdir()
    (leftover / ARRAYS_FILE).write_bytes(b"half")
    (leftover / METADATA_FILE).write_text("{}")
    (tmp_path / ".tmp-probe-x").write_text("")
    # A final-named directory without metadata.json is not a complete checkpoint.
    (tmp_path / "ckpt-e0003-b000000").mkdir()
    (tmp_path / "ckpt-e0003-b000000" / ARRAYS_FILE).write_bytes(b"half")
    assert store.list_checkpoints(directory) == [older]
    assert store.latest_checkpoint(directory) == older

    newer = _save(directory, 1, 1)
    assert _hidden(directory) == []
    assert store.list_checkpoints(directory) == [older, newer]


# --- corruption ---------------------------------------------------------------------------


def _set_record(path, **changes):
    file = os.path.join(path, METADATA_FILE)
    with open(file) as handle:
        info = json.load(handle)
    info.update(changes)
    with open(file, "w") as handle:
        json.dump(info, handle)


def _replace_npz(path, arrays=None, data=None):
    """Writes another arrays.npz (with np.savez, or raw bytes) and records its size and hash."""
    npz = os.path.join(path, ARRAYS_FILE)
    if arrays is not None:
        with open(npz, "wb") as handle:
            np.savez(handle, **arrays)
    else:
        with open(npz, "wb") as handle:
            handle.write(data)
    with open(npz, "rb") as handle:
        content = handle.read()
    _set_record(path, npz_size=len(content), npz_sha256=hashlib.sha256(content).hexdigest())


def _truncate(path):
    npz = os.path.join(path, ARRAYS_FILE)
    with open(npz, "rb") as handle:
        content = handle.read()
    with open(npz, "wb") as handle:
        handle.write(content[: len(content) // 2])


def _flip_byte(path):
    npz = os.path.join(path, ARRAYS_FILE)
    with open(npz, "r+b") as handle:
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 0x01]))


def _write_metadata(text):
    def corrupt(path):
        with open(os.path.join(path, METADATA_FILE), "w") as handle:
            handle.write(text)

    return corrupt


def _delete(name):
    return lambda path: os.remove(os.path.join(path, name))


def _record(**changes):
    return lambda path: _set_record(path, **changes)


def _npz_of(**arrays):
    return lambda path: _replace_npz(path, arrays)


NPZ, META = ARRAYS_FILE, METADATA_FILE
A, B = np.ones(4, np.float32), np.int64(2)  # the shapes and dtypes the checkpoint records
CORRUPTIONS = {  # case: (how to corrupt, the file the error must name, what it must say)
    "truncated npz": (_truncate, NPZ, "truncated"),
    "one byte flipped in npz": (_flip_byte, NPZ, "SHA-256"),
    "missing npz": (_delete(NPZ), NPZ, "missing"),
    "missing metadata": (_delete(META), META, "missing"),
    "garbled metadata": (_write_metadata('{"format_version": 1, "epo'), META, "not valid JSON"),
    "metadata not an object": (_write_metadata("[1, 2]"), META, "not an object"),
    "newer format version": (_record(format_version=2), META, "format version 2"),
    "format version missing": (_record(format_version=None), META, "format version None"),
    "epoch not an int": (_record(epoch="two"), META, "'epoch'"),
    "epoch differs from name": (_record(epoch=5), META, "do not match"),
    "npz with an extra key": (_npz_of(a=A, b=B, extra=np.ones(1)), NPZ, "not recorded: ['extra']"),
    "npz missing a key": (_npz_of(a=A), NPZ, "missing: ['b']"),
    "npz with another dtype": (_npz_of(a=A.astype(np.float64), b=B), NPZ, "dtype <f8"),
    "npz with another shape": (_npz_of(a=A[:3], b=B), NPZ, "shape [3]"),
    "npz not a zip": (lambda p: _replace_npz(p, data=b"no zip" * 50), NPZ, "cannot be read"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_raises_naming_the_file_and_the_fallback(tmp_path, case):
    corrupt, file, fragment = CORRUPTIONS[case]
    arrays = {"a": np.arange(4, dtype=np.float32), "b": B}
    previous = store.save_checkpoint(str(tmp_path), arrays, {}, epoch=1)
    path = store.save_checkpoint(str(tmp_path), arrays, {}, epoch=2)
    corrupt(path)
    with pytest.raises(CheckpointError) as error:
        store.load_checkpoint(path)
    message = str(error.value)
    assert os.path.join(path, file) in message
    assert fragment in message
    assert f"Delete the checkpoint directory {path} to fall back" in message
    assert f"to fall back to the previous checkpoint {previous}." in message
    store.load_checkpoint(previous)  # the fallback itself is fine


def test_corrupt_only_checkpoint_says_training_restarts(tmp_path):
    path = _save(str(tmp_path), 0, 4)
    _flip_byte(path)
    with pytest.raises(CheckpointError, match="no older checkpoint exists"):
        store.load_checkpoint(path)


@pytest.mark.parametrize("where", ["missing", "a_file"])
def test_load_of_a_non_checkpoint_path_raises(tmp_path, where):
    (tmp_path / "a_file").write_text("x")
    target = str(tmp_path / where)
    with pytest.raises(CheckpointError, match="does not exist or is not a directory") as error:
        store.load_checkpoint(target)
    assert target in str(error.value)


# --- input validation ---------------------------------------------------------------------

GOOD = {"arrays": {"w": np.ones(2)}, "metadata": {"mode": "spectrain"}, "epoch": 1}
BAD_SAVES = [
    ({"directory": 123}, TypeError, "directory=123"),
    ({"directory": ""}, ValueError, "non-empty path"),
    ({"arrays": [np.ones(2)]}, TypeError, "arrays of type list"),
    ({"arrays": {1: np.ones(2)}}, TypeError, "key 1 of type int"),
    ({"arrays": {"": np.ones(2)}}, ValueError, "key ''"),
    ({"arrays": {"w": np.array(["a", "b"])}}, TypeError, "`arrays['w']` must have a numeric"),
    ({"arrays": {"w": np.array(["a", "b"])}}, TypeError, "dtype <U1 cannot be stored"),
    ({"arrays": {"w": np.array([{}, 1], dtype=object)}}, TypeError, "dtype object"),
    ({"arrays": {"w": None}}, TypeError, "dtype object"),
    ({"arrays": {"w": [[1.0], [1.0, 2.0]]}}, TypeError, "`arrays['w']` must be a numeric"),
    ({"metadata": "spectrain"}, TypeError, "metadata of type str"),
    ({"metadata": {"cuts": {"a"}}}, TypeError, "metadata['cuts'] is {'a'} of type set"),
    ({"metadata": {"run": {"seed": np.int64(3)}}}, TypeError, "metadata['run']['seed']"),
    ({"metadata": {"cuts": ["a", object]}}, TypeError, "metadata['cuts'][1]"),
    ({"metadata": {1: "a"}}, TypeError, "key 1 of type int"),
    ({"epoch": -1}, ValueError, "epoch=-1"),
    ({"epoch": 1.5}, TypeError, "epoch=1.5"),
    ({"epoch": True}, TypeError, "epoch=True"),
    ({"batch": -2}, ValueError, "batch=-2"),
    ({"batch": "3"}, TypeError, "batch='3'"),
    ({"keep": 0}, ValueError, "keep=0"),
    ({"keep": 2.0}, TypeError, "keep=2.0"),  # a float: TypeError (issue 10, step 3)
]


@pytest.mark.parametrize("override, error, fragment", BAD_SAVES)
def test_save_rejects_bad_input_and_writes_nothing(tmp_path, override, error, fragment):
    kwargs = {"directory": str(tmp_path / "ckpts"), **GOOD, **override}
    with pytest.raises(error) as raised:
        store.save_checkpoint(**kwargs)
    assert fragment in str(raised.value)
    assert not os.path.exists(tmp_path / "ckpts")


def test_save_accepts_numpy_integers_for_epoch_and_batch(tmp_path):
    path = store.save_checkpoint(
        str(tmp_path), GOOD["arrays"], {}, epoch=np.int64(4), batch=np.int32(2)
    )
    assert _position(path) == (4, 2)


# --- the kill test ------------------------------------------------------------------------

BATCHES_PER_EPOCH = 3  # as in checkpoint_writer.py
KEEP = 2
# (saves that complete before the kill, how the kill is timed, seconds of extra delay):
# "in_save" waits until the save's .tmp- directory exists; "after_start" counts from the
# moment the writer announced the save.
KILL_PLAN = [
    (1, "in_save", 0.0),
    (0, "after_start", 0.0),
    (2, "in_save", 0.005),
    (1, "after_start", 0.02),
    (0, "in_save", 0.0),
    (3, "after_start", 0.05),
    (1, "in_save", 0.015),
]


def _expected_value(epoch, batch):
    return epoch * 100 + batch


def _verify_directory(directory):
    """Every listed checkpoint loads and holds the values of its own (epoch, batch)."""
    listed = store.list_checkpoints(directory)
    assert store.latest_checkpoint(directory) == (listed[-1] if listed else None)
    assert len(listed) <= KEEP + 1  # a kill between rename and retention leaves one extra
    infos = []
    for path in listed:
        arrays, info = store.load_checkpoint(path)
        infos.append(info)
        value = _expected_value(info["epoch"], info["batch"])
        assert info["metadata"] == {"writer": "kill-test", "value": value}
        assert sorted(arrays) == [
            "data/order", "stage0/kernel", "stage1/count", "stage1/kernel", "stage1/odd"
        ]
        assert arrays["stage0/kernel"].shape == (1_000_000,)
        assert np.all(arrays["stage0/kernel"] == np.float32(value))
        assert np.all(arrays["stage1/kernel"] == float(value))
        assert arrays["stage1/count"] == value
        assert np.all(arrays["stage1/odd"] == (value % 2 == 1))
        assert np.all(arrays["data/order"] == value % 256)
    return [(info["epoch"], info["batch"]) for info in infos]


def _start_writer(directory, count=None):
    command = [sys.executable, WRITER, directory] + ([str(count)] if count else [])
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _next_line(process, prefix):
    line = process.stdout.readline()
    if not line.startswith(prefix):
        process.kill()
        raise AssertionError(f"writer said {line!r}, expected {prefix!r}: {process.stderr.read()}")
    return line.split(" ", 1)[1].strip()


def _wait_for_hidden_dir(directory, old, timeout=5.0):
    """Waits until the writer's save has created its .tmp- directory (not one of `old`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(name.startswith(".tmp-new-") for name in set(os.listdir(directory)) - old):
            return True
        time.sleep(0.0005)
    return False


@pytest.mark.exclusive  # kills timed to land in a save
def test_sigkill_during_saves_never_leaves_a_checkpoint_that_loads_wrong(tmp_path):
    directory = str(tmp_path / "ckpts")
    last_reported = None  # (epoch, batch) of the newest save the writer reported complete
    kills_that_hit_a_save = 0
    hidden_after_kill = []
    for completed, timing, delay in KILL_PLAN:
        writer = _start_writer(directory)
        try:
            for index in range(completed + 1):
                _next_line(writer, "saving ")
                if index < completed:
                    path = _next_line(writer, "saved ")
                    last_reported = _position(path)
                    assert not set(hidden_after_kill) & set(os.listdir(directory))  # cleaned
            if timing == "in_save":
                _wait_for_hidden_dir(directory, old=set(hidden_after_kill))
            time.sleep(delay)
        finally:
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(timeout=30)
            writer.stdout.close()
            writer.stderr.close()
        assert writer.returncode == -signal.SIGKILL

        left_before = set(hidden_after_kill)
        hidden_after_kill = _hidden(directory)
        kills_that_hit_a_save += bool(set(hidden_after_kill) - left_before)
        positions = _verify_directory(directory)  # hidden leftovers are ignored
        if last_reported is not None:
            assert positions and positions[-1] >= last_reported  # completed saves survive

    assert kills_that_hit_a_save >= 1, "no kill landed during a save"

    # A run that finishes normally cleans up and keeps exactly KEEP consecutive checkpoints.
    writer = _start_writer(directory, count=2)
    output, errors = writer.communicate(timeout=60)
    assert writer.returncode == 0, errors
    assert _hidden(directory) == []
    positions = _verify_directory(directory)
    steps = [epoch * BATCHES_PER_EPOCH + batch for epoch, batch in positions]
    assert len(steps) == KEEP and steps[1] == steps[0] + 1
    assert positions[-1] > last_reported
