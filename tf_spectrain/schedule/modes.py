"""Staleness modes as data: which weights each pass of a stage uses (SPECTRAIN.md section 4).

Pure Python, no TensorFlow. A `PassPlan` says, for one stage, how many optimizer steps ahead
the forward and the backward weights are predicted (`W + s * m`; `s = 0` is the current
weights), and whether the backward reuses the forward's weights and activations.

| mode                    | forward   | backward                      |
|-------------------------|-----------|-------------------------------|
| sync                    | current   | reuse (same as forward)       |
| vanilla                 | current   | current at B time (recompute) |
| stash                   | current   | reuse (stashed)               |
| spectrain, paper        | `s_f(k)`  | `s_b(k)` at B time (recompute)|
| spectrain, consistent   | `N-1-k`   | reuse (stashed prediction)    |
"""

import dataclasses

from tf_spectrain import checks, schedule

PIPELINE_MODES = ("sync", "vanilla", "stash", "spectrain")
"""The pipeline modes, in the order the command line and the docs list them."""
MODES = PIPELINE_MODES  # the name the pipeline code has always used
BASELINES = ("single", "dp")
"""The baselines a pipeline is compared with: one device, and data parallelism."""
ALL_MODES = PIPELINE_MODES + BASELINES
"""Every mode `train.py` and the benchmarks train in."""
TARGETS = schedule.TARGETS
SCHEDULES = schedule.SYNC_SCHEDULES
"""The orders of a sync mini-batch's micro-batches (`schedule=`, `--schedule`)."""
RECOMPUTE = ("auto", "always")
"""When a stage recomputes its forward in the backward (`recompute=`, `--recompute`)."""
ON_NAN = ("stop", "skip")
"""What a non-finite loss does in `fit` (`on_nan`, `--on-nan`): stop, or skip the update."""


def check_mode(mode, target="paper"):
    """Raises ValueError unless `mode` is in `PIPELINE_MODES` and `target` in `TARGETS`."""
    checks.check_one_of("mode", mode, PIPELINE_MODES)
    checks.check_one_of("spectrain_target", target, TARGETS)


def check_schedule(order, mode):
    """Checks a micro-batch schedule against the pipeline mode.

    Args:
        order: the schedule, one of `SCHEDULES`.
        mode: the pipeline mode (checked already).

    Raises:
        ValueError: unless `order` is one of `SCHEDULES`, and `"gpipe"` outside sync mode.
    """
    checks.check_one_of("schedule", order, SCHEDULES)
    if order != "gpipe" and mode != "sync":
        raise ValueError(
            "`schedule` must be 'gpipe' unless mode='sync': it orders the micro-batches of "
            "sync mode, and the asynchronous modes run their own one-forward-one-backward "
            f"order. Received: schedule={order!r} with mode={mode!r}"
        )


@dataclasses.dataclass(frozen=True)
class PassPlan:
    """Which weights stage k's passes use.

    Attributes:
        forward_steps: `s` of the forward's weights `W + s * m` (0: the current weights).
        backward_steps: `s` of the backward's weights, taken when the backward runs, or
            None when the backward reuses the forward's weights (and so its activations).
    """

    forward_steps: int
    backward_steps: int | None

    @property
    def reuses_forward(self):
        """True when the backward reuses the forward's weights and activations."""
        return self.backward_steps is None

    def same_weights(self, updates_between):
        """Tells whether a backward can reuse its forward's activations.

        That is when it reuses the forward's weights by definition, or when both passes
        compute the same weights from the same state: no update in between and the same
        version gap (the last stage, where F and B run back to back with s_f = s_b; and
        vanilla's first mini-batches). Reusing then costs no extra weight copy.

        Args:
            updates_between: updates the stage applies between the F and the B.

        Returns:
            True if the backward can reuse the forward's activations, else False.
        """
        if self.reuses_forward:
            return True
        return updates_between == 0 and self.forward_steps == self.backward_steps


def pass_plan(mode, k, num_stages, target="paper"):
    """Gives the `PassPlan` of stage `k` of `num_stages` in `mode` (see the module's table).

    Args:
        mode: one of `PIPELINE_MODES`.
        k: the stage index, `0 <= k < num_stages`.
        num_stages: the number of stages, an int >= 1.
        target: the SpecTrain target, "paper" or "consistent" (checked for every mode).

    Returns:
        A `PassPlan`.

    Raises:
        ValueError: for an unknown `mode` or `target`, or `k` or `num_stages` out of range.
        TypeError: if `k` or `num_stages` is not an int.
    """
    check_mode(mode, target)
    s_f, s_b = schedule.version_gaps(k, num_stages, target)
    if mode in ("sync", "stash"):
        return PassPlan(0, None)
    if mode == "vanilla":
        return PassPlan(0, 0)
    return PassPlan(s_f, s_b)


def probe_horizons(mode, k, num_stages, target="paper"):
    """Gives how many updates ahead of its own weight version each pass of stage k aims.

    The telemetry measures a pass's weight error against the weights the stage holds
    when it reaches the version `v + h` (`v`: the version the stage is at when the pass
    runs, `h`: the horizon returned here). For SpecTrain the horizon is the prediction's
    own version gap, so the error says how well `W + s * m` foresaw the real weights.
    Vanilla and stash do not predict; they are measured against the version SpecTrain's
    paper rule aims at, so their distance is exactly the staleness SpecTrain corrects.
    A horizon of 0 means nothing to measure (the pass aims at the weights it has).

    Args:
        mode: one of `PIPELINE_MODES` (sync: always `(0, 0)`).
        k: the stage index, `0 <= k < num_stages`.
        num_stages: the number of stages, an int >= 1.
        target: the SpecTrain target, "paper" or "consistent".

    Returns:
        `(h_forward, h_backward)`. `h_backward` refers to the backward's own version
        `i`; where the backward reuses the forward's weights (stash, consistent) the
        measured weights are the forward's.

    Raises:
        ValueError: for an unknown `mode` or `target`, or `k` or `num_stages` out of range.
        TypeError: if `k` or `num_stages` is not an int.
    """
    check_mode(mode, target)
    if mode == "sync":
        return 0, 0
    s_f, s_b = schedule.version_gaps(k, num_stages, "paper")
    if mode == "spectrain" and target == "consistent":
        return num_stages - 1 - k, 0
    return s_f, s_b

