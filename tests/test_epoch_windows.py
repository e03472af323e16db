"""`schedule.windows.EpochWindows` cut by a table: what each window reports, after a stop too.

Pure Python: the windows of an epoch (and of an epoch stopped after some windows) must hold
exactly the ops of the (shorter) epoch's lists, each stage's in its own order, and each
window must report at most K mini-batches, so that Keras' per-batch hooks (run once per
window) see every mini-batch when K = 1, a stop's drain included.
"""

import pytest

from tf_spectrain.schedule import op_lists
from tf_spectrain.schedule.windows import EpochWindows


def cut(mode, n, t, k, stop_after=None):
    """Every window of an epoch, stopped after `stop_after` windows; `(windows, fed)`."""
    windows = EpochWindows(lambda length: op_lists(mode, n, length), t, k,
                           report_stage=0 if mode == "sync" else n - 1)
    got = []
    for window in windows:
        got.append(window)
        if stop_after is not None and len(got) == stop_after:
            windows.stop()
    return got, windows.fed


# (mode, stages, mini-batches, K, stop after this many windows or None,
#  the (first, stop) each window reports, mini-batches fed)
TABLE = [
    ("stash", 3, 6, 1, None, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)], 6),
    ("stash", 3, 6, 2, None, [(0, 2), (2, 4), (4, 6)], 6),
    ("stash", 3, 8, 8, None, [(0, 8)], 8),
    # Stopped after the first window: stage 0 had fed N = 3 (its warm-up), one per window.
    ("stash", 3, 8, 1, 1, [(0, 1), (1, 2), (2, 3)], 3),
    # N = 4: the first window feeds 4; the second (it reports mini-batch 1) none.
    ("spectrain", 4, 10, 1, 2, [(0, 1), (1, 2), (2, 3), (3, 4)], 4),
    ("spectrain", 4, 10, 2, 1, [(0, 2), (2, 4)], 4),
    ("sync", 3, 6, 1, 2, [(0, 1), (1, 2)], 2),
]


@pytest.mark.parametrize("mode, n, t, k, stop_after, reports, fed", TABLE)
def test_windows_report_at_most_k_and_hold_the_epochs_ops(mode, n, t, k, stop_after, reports,
                                                          fed):
    windows, got_fed = cut(mode, n, t, k, stop_after)
    assert [(w.first, w.stop) for w in windows if w.stop > w.first] == reports
    assert got_fed == fed
    # Every op of the epoch of `fed` mini-batches once, each stage's in its list's order.
    lists = op_lists(mode, n, fed)
    for stage, ops in enumerate(lists):
        assert [op for w in windows for s, op in w.program if s == stage] == ops
