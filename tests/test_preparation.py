"""`tf_spectrain.app.preparation`'s pure rule: how train.py's trainer runs its passes."""

import pytest

from tf_spectrain.app.preparation import graph_calls


@pytest.mark.parametrize("setting, eager, devices, expected", [
    ("auto", False, ["/CPU:0", "/CPU:1"], (1, True)),  # a CPU-only machine: pass by pass
    # on workers (--cluster): compile's "auto", windows of one (runtime.loop.window_size)
    ("auto", False, ["/job:worker/replica:0/task:1/device:CPU:0"], ("auto", False)),
    ("auto", False, ["/CPU:0", "/job:worker/replica:0/task:0/device:CPU:0"], ("auto", False)),
    ("auto", False, ["/job:localhost/replica:0/task:0/device:CPU:0"], (1, True)),
    ("auto", False, ["/GPU:0", "/GPU:1"], ("auto", False)),  # accelerators: windows
    ("auto", False, ["/job:worker/replica:0/task:1/device:GPU:0", "/CPU:0"], ("auto", False)),
    (8, False, ["/CPU:0", "/CPU:1"], (8, False)),  # asked for: as given
    (1, False, ["/CPU:0"], (1, False)),  # windows of one, asked for
    (1, False, ["/GPU:0"], (1, False)),
    ("auto", True, ["/GPU:0"], ("auto", True)),  # --run-eagerly: pass by pass anywhere
])
def test_auto_runs_windows_on_accelerators_and_workers_and_pass_by_pass_on_a_cpu(
        setting, eager, devices, expected):
    assert graph_calls(setting, eager, devices) == expected
