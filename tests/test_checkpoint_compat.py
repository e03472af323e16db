"""Tests for tf_spectrain.checkpoint.compat: what differs between a checkpoint and a run."""

import numpy as np
import pytest

from tf_spectrain.checkpoint import compat, store
from tf_spectrain.checkpoint.format import CheckpointError

GOOD = {"arrays": {"w": np.ones(2)}, "metadata": {"mode": "spectrain"}, "epoch": 1}

# --- comparing metadata -------------------------------------------------------------------

SAVED = {"model": "vgg16", "cuts": ["a", "b"], "mode": "stash", "seed": 1, "augment": True,
         "optimizer": {"lr": 0.1, "momentum": 0.9}}
COMPARISONS = [
    # (changes to this run's metadata, keys compared, expected [(key, fragments)])
    ({}, list(SAVED), []),
    ({"cuts": ("a", "b")}, ["cuts"], []),
    ({"mode": "spectrain"}, ["mode"],
     [("mode", ["the checkpoint has 'stash', this run has 'spectrain'"])]),
    ({"mode": "spectrain"}, ["model", "seed"], []),
    ({"cuts": ["a", "c"]}, ["cuts"],
     [("cuts", ["['a', 'b']", "['a', 'c']", "element 1: 'b' vs 'c'"])]),
    ({"cuts": ["a", "b", "c"]}, ["cuts"], [("cuts", ["2 elements vs 3"])]),
    ({"seed": 2, "model": "resnet"}, ["seed", "model"],
     [("seed", ["has 1, this run has 2"]), ("model", ["'vgg16'", "'resnet'"])]),
    ({"augment": 1}, ["augment"], [("augment", ["has True, this run has 1"])]),
    ({"optimizer": {"lr": 0.2, "momentum": 0.9}}, ["optimizer"],
     [("optimizer", ["differs in 'lr'"])]),
    ({"seed": None}, ["seed"], [("seed", ["this run has None"])]),
    ({"new": 3}, ["new"], [("new", ["the checkpoint does not record it, this run has 3"])]),
    ({"absent": None}, ["absent_everywhere"], []),
]


@pytest.mark.parametrize("changes, keys, expected", COMPARISONS)
def test_compare_metadata(changes, keys, expected):
    current = {**SAVED, **changes}
    differences = compat.compare_metadata(SAVED, current, keys)
    assert len(differences) == len(expected), differences
    for difference, (key, fragments) in zip(differences, expected, strict=True):
        assert difference.startswith(f"{key}: ")
        for fragment in fragments:
            assert fragment in difference


def test_compare_metadata_counts_a_key_missing_from_this_run():
    current = {key: value for key, value in SAVED.items() if key != "mode"}
    assert compat.compare_metadata(SAVED, current, ["mode"]) == [
        "mode: the checkpoint has 'stash', this run does not set it"
    ]


def test_check_compatible_lists_every_difference(tmp_path):
    path = store.save_checkpoint(str(tmp_path), GOOD["arrays"], SAVED, epoch=2)
    _, info = store.load_checkpoint(path)
    compat.check_compatible(info, dict(SAVED), ["model", "cuts", "mode"])  # no error
    current = {**SAVED, "mode": "spectrain", "cuts": ["a", "c"]}
    with pytest.raises(CheckpointError) as error:
        compat.check_compatible(info, current, ["model", "cuts", "mode"])
    message = str(error.value)
    assert f"Checkpoint {path} was written by a different run" in message
    assert "\n  - cuts: " in message and "\n  - mode: " in message
    assert "  - model" not in message


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: compat.compare_metadata(SAVED, SAVED, "mode"), "did you mean keys=['mode']"),
        (lambda: compat.compare_metadata(SAVED, SAVED, [1]), "`keys` must all be str"),
        (lambda: compat.compare_metadata(SAVED, ["mode"], ["mode"]), "`current` must be a"),
        (lambda: compat.check_compatible({"path": "x"}, SAVED, ["mode"]), "`info` must be the"),
    ],
)
def test_comparison_rejects_bad_arguments(call, fragment):
    with pytest.raises(TypeError) as error:
        call()
    assert fragment in str(error.value)
