"""Tests for tf_spectrain.checkpoint.format: what a checkpoint is on disk. Arrays keep their
values, dtypes and shapes through a save and a load, the metadata file records what was
saved, and checkpoints of format version 1 written before the package existed still load
and are written byte for byte the same.

Naming, retention, corruption and interrupted writes are in test_checkpoint_store.py.
"""

import hashlib
import json
import os
import zipfile

import numpy as np
import pytest

from tf_spectrain.checkpoint import store
from tf_spectrain.checkpoint.format import ARRAYS_FILE, FORMAT_VERSION, METADATA_FILE

HERE = os.path.dirname(os.path.abspath(__file__))


# --- round trip ---------------------------------------------------------------------------

ARRAY_CASES = {
    "float32 matrix": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "float64 with nan and inf": np.array([np.nan, np.inf, -np.inf, -0.0, 1e-300]),
    "int64 extremes": np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max]),
    "uint8 image": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
    "bool": np.array([[True, False], [False, True]]),
    "float32 scalar": np.float32(2.5),
    "int64 scalar": np.int64(-7),
    "bool scalar": np.bool_(True),
    "empty float32": np.zeros((0,), np.float32),
    "empty 2d int64": np.zeros((3, 0), np.int64),
    "fortran order": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "non-contiguous slice": np.arange(20, dtype=np.int64)[::3],
    "float16": np.array([0.5, -65504.0], np.float16),
    "complex64": np.array([1 + 2j, 3.5 - 1j], np.complex64),
    "python list": [[1.0, 2.0], [3.0, 4.0]],
}


@pytest.mark.parametrize("name", sorted(ARRAY_CASES))
def test_round_trip_keeps_values_dtype_and_shape(tmp_path, name):
    value = ARRAY_CASES[name]
    key = "stage0/variables/3"
    path = store.save_checkpoint(str(tmp_path), {key: value, "other": np.ones(2)}, {}, epoch=1)
    arrays, _ = store.load_checkpoint(path)
    expected = np.asarray(value)
    assert sorted(arrays) == ["other", key]
    assert arrays[key].dtype == expected.dtype
    assert arrays[key].shape == expected.shape
    np.testing.assert_array_equal(arrays[key], expected)


def test_awkward_keys_round_trip_and_the_npz_is_standard(tmp_path):
    # Keys that would clash with np.savez's own arguments or with the ".npy" suffix.
    arrays = {
        "file": np.arange(3),
        "allow_pickle": np.ones(2, bool),
        "a": np.float32(1.0),
        "a.npy": np.float32(2.0),
        "stage1/optimizer/momentum/0": np.full((2, 2), 3.0),
        "spaces and ünïcode": np.uint8(9),
    }
    path = store.save_checkpoint(tmp_path, arrays, {}, epoch=0)  # a PathLike works too
    loaded, _ = store.load_checkpoint(path)
    assert sorted(loaded) == sorted(arrays)
    for key, value in arrays.items():
        np.testing.assert_array_equal(loaded[key], value)
        assert loaded[key].dtype == np.asarray(value).dtype
    with np.load(os.path.join(path, ARRAYS_FILE), allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(arrays)
        np.testing.assert_array_equal(npz["stage1/optimizer/momentum/0"], np.full((2, 2), 3.0))


def test_info_records_what_was_saved(tmp_path):
    metadata = {"model": "vgg16", "cuts": ("block1_pool", "block3_pool"), "seed": 7,
                "lr": 0.01, "flags": {"augment": True, "extra": None}}
    path = store.save_checkpoint(
        str(tmp_path), {"x": np.zeros((2, 3), np.float32)}, metadata, epoch=3, batch=17
    )
    _, info = store.load_checkpoint(path)
    assert os.path.basename(path) == "ckpt-e0003-b000017"
    assert info["path"] == path
    assert info["format_version"] == FORMAT_VERSION == 1
    assert (info["epoch"], info["batch"]) == (3, 17)
    assert info["metadata"] == json.loads(json.dumps(metadata))  # tuples stored as lists
    assert info["arrays"] == {"x": {"dtype": np.dtype(np.float32).str, "shape": [2, 3]}}
    npz = os.path.join(path, ARRAYS_FILE)
    with open(npz, "rb") as file:
        assert info["npz_sha256"] == hashlib.sha256(file.read()).hexdigest()
    assert info["npz_size"] == os.path.getsize(npz)
    assert isinstance(info["created"], str) and info["created"].startswith("20")
    with open(os.path.join(path, METADATA_FILE)) as file:
        assert json.load(file)["metadata"]["cuts"] == ["block1_pool", "block3_pool"]


# --- checkpoints written before tf_spectrain.checkpoint existed --------------------------

# Written by tf_spectrain/checkpoint_store.py as it was before issue 10 (format version 1).
OLD_CHECKPOINT = os.path.join(HERE, "data", "checkpoint_format1", "ckpt-e0001-b000002")


OLD_ARRAYS = {
    "stage0/variables/0": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
    "stage0/optimizer/0": np.int64(7),
    "stage1/variables/0": np.array([True, False]),
    "stage1/variables/1": np.zeros((0, 2), np.float64),
}


OLD_METADATA = {"kind": "pipeline", "cuts": ["dense0"], "mode": "spectrain", "extra": {"seed": 7}}


def test_a_checkpoint_of_the_old_module_still_loads():
    arrays, info = store.load_checkpoint(OLD_CHECKPOINT)
    assert (info["epoch"], info["batch"]) == (1, 2)
    assert info["metadata"] == OLD_METADATA
    assert sorted(arrays) == sorted(OLD_ARRAYS)
    for key, value in OLD_ARRAYS.items():
        assert arrays[key].dtype == value.dtype and arrays[key].shape == value.shape
        np.testing.assert_array_equal(arrays[key], value)


def test_the_format_is_unchanged_byte_for_byte(tmp_path):
    """The same arrays and metadata give the same files, but for times and the checksum."""
    path = store.save_checkpoint(tmp_path, OLD_ARRAYS, OLD_METADATA, epoch=1, batch=2, keep=None)
    assert sorted(os.listdir(path)) == sorted(os.listdir(OLD_CHECKPOINT))
    with zipfile.ZipFile(os.path.join(path, ARRAYS_FILE)) as new, zipfile.ZipFile(
        os.path.join(OLD_CHECKPOINT, ARRAYS_FILE)
    ) as old:
        assert new.namelist() == old.namelist()
        for member in old.namelist():  # the .npy bytes; the zip entries differ in their times
            assert new.read(member) == old.read(member)
    assert os.path.getsize(os.path.join(path, ARRAYS_FILE)) == os.path.getsize(
        os.path.join(OLD_CHECKPOINT, ARRAYS_FILE)
    )

    def without_times(directory):
        with open(os.path.join(directory, METADATA_FILE), "rb") as file:
            text = file.read().decode("utf-8")
        info = json.loads(text)
        lines = [
            line for line in text.splitlines()
            if not line.startswith((' "created"', ' "npz_sha256"'))
        ]
        return lines, list(info)

    assert without_times(path) == without_times(OLD_CHECKPOINT)
