"""`tf_spectrain.app.preparation`'s pure rule: how many mini-batches train.py runs per call."""

import pytest

from tf_spectrain.app.preparation import graph_calls


@pytest.mark.parametrize("setting, devices, expected", [
    ("auto", ["/CPU:0", "/CPU:1"], 1),  # a CPU-only machine: pass by pass
    ("auto", ["/job:worker/replica:0/task:1/device:CPU:0"], 1),
    ("auto", ["/GPU:0", "/GPU:1"], "auto"),  # accelerators: compile's "auto" (windows)
    ("auto", ["/job:worker/replica:0/task:1/device:GPU:0", "/CPU:0"], "auto"),
    (8, ["/CPU:0", "/CPU:1"], 8),  # asked for: as given
    (1, ["/GPU:0"], 1),
])
def test_auto_runs_windows_on_accelerators_and_pass_by_pass_on_a_cpu(setting, devices,
                                                                     expected):
    assert graph_calls(setting, devices) == expected
