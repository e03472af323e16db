"""Pipeline schedules as data: per-stage instruction lists and the weight versions they imply.

This package is pure Python (no TensorFlow): it says *what* each stage does and in which
order, never *how*. The pipeline runtime walks these lists; tests and benchmarks inspect
them. See SPECTRAIN.md, sections 3 and 4.

Each stage `k` of an `N`-stage pipeline runs a list of `Op`s over the `T` mini-batches of
an epoch. In the asynchronous schedule (one forward, one backward) stage k first runs
`w_k = min(N - k, T)` warm-up forwards, then alternates backward and forward; `U(i)`, the
stage's weight update, follows each `B(i)`. For N = 3 in lock-step slots (`clock_table`):

    stage 0: F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 ...
    stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 ...
    stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 ...

The synchronous schedule (sequential SGD, or GPipe with micro-batches) runs all forwards of
a mini-batch, then all its backwards, then one update, so the pipeline fills and drains
once per mini-batch.

Modules: `instructions` (`Op`, the op lists, weight versions and version gaps) and `clock`
(the lock-step clock table, drawn as text, and its bubble). Every name is re-exported here.
"""

from tf_spectrain.schedule.clock import bubble_fraction, clock_table, format_table
from tf_spectrain.schedule.instructions import (
    BACKWARD,
    FORWARD,
    KINDS,
    TARGETS,
    UPDATE,
    Op,
    async_ops,
    backward_version,
    forward_version,
    max_stashed,
    sync_ops,
    version_gaps,
    versions_seen,
    warmup_forwards,
)

__all__ = [
    "BACKWARD",
    "FORWARD",
    "KINDS",
    "TARGETS",
    "UPDATE",
    "Op",
    "async_ops",
    "backward_version",
    "bubble_fraction",
    "clock_table",
    "forward_version",
    "format_table",
    "max_stashed",
    "sync_ops",
    "version_gaps",
    "versions_seen",
    "warmup_forwards",
]
