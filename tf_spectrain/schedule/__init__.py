"""Pipeline schedules as data: per-stage instruction lists and the weight versions they imply.

This package is pure Python (no TensorFlow): it says *what* each stage does and in which
order, never *how*. The pipeline runtime walks these lists; tests and benchmarks inspect
them. See SPECTRAIN.md, sections 3 and 4.

Each stage `k` of an `N`-stage pipeline runs a list of `Op`s over the `T` mini-batches of
an epoch: `async_ops` (one forward, one backward) or `sync_ops` (sequential SGD: GPipe or
1F1B-flush).

Modules: `instructions` (`Op`, the op lists, weight versions and version gaps) and `clock`
(the lock-step clock table, drawn as text, and its bubble). Every name is re-exported here.
"""

from tf_spectrain.schedule.clock import bubble_fraction, clock_table, format_table
from tf_spectrain.schedule.instructions import (
    BACKWARD,
    FORWARD,
    KINDS,
    SYNC_SCHEDULES,
    TARGETS,
    UPDATE,
    Op,
    async_ops,
    backward_version,
    forward_version,
    max_in_flight,
    max_stashed,
    op_lists,
    sync_ops,
    version_gaps,
    versions_seen,
    warmup_forwards,
)

__all__ = [
    "BACKWARD",
    "FORWARD",
    "KINDS",
    "SYNC_SCHEDULES",
    "TARGETS",
    "UPDATE",
    "Op",
    "async_ops",
    "backward_version",
    "bubble_fraction",
    "clock_table",
    "forward_version",
    "format_table",
    "max_in_flight",
    "max_stashed",
    "op_lists",
    "sync_ops",
    "version_gaps",
    "versions_seen",
    "warmup_forwards",
]
