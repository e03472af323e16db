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
| nesterov                | current   | reuse (stashed)               |
| 2bw                     | current   | reuse (stashed)               |

`nesterov` differs from `stash` in its optimizer (each stage's Nesterov form, with the
momentum raised by the stage's delay: `nesterov_coefficient`) and `2bw` in its updates (one
per `accumulate` mini-batches: `applies_update`); SPECTRAIN.md section 6e.
"""

import dataclasses

from tf_spectrain import checks, schedule

PIPELINE_MODES = ("sync", "vanilla", "stash", "spectrain", "nesterov", "2bw")
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
    if mode in ("sync", "stash", "nesterov", "2bw"):
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
    Vanilla, stash and nesterov do not predict; they are measured against the version
    SpecTrain's paper rule aims at, so their distance is exactly the staleness SpecTrain
    corrects. `2bw` is measured against the stage's next version (the paper's delay of one
    update) on every stage but the last, whose passes are never stale.
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
    if mode == "2bw":
        stale = int(k < num_stages - 1)
        return stale, stale
    return s_f, s_b


def stage_delay(k, num_stages):
    """The delay `s_k = N - 1 - k` of stage k: updates between its F(i) and its U(i).

    Raises as `pass_plan` for `k` or `num_stages` out of range."""
    s_f, _ = schedule.version_gaps(k, num_stages, "consistent")
    return s_f


def nesterov_coefficient(base, k, num_stages):
    """Stage k's momentum (SGD) or `beta_1` (NAdam) in mode "nesterov" (SPECTRAIN.md 6e).

    `base + s_k * (0.99 - base) / N`, with the stage's delay `s_k = N - 1 - k`: the last
    stage keeps `base`, earlier stages move towards 0.99 (the paper's code's constants). A
    `base` of 0.99 or more is kept on every stage.

    Args:
        base: the optimizer's own momentum or `beta_1`, a float in [0, 1).
        k: the stage index, `0 <= k < num_stages`.
        num_stages: `N`, an int >= 1.

    Returns:
        The coefficient, a float.

    Raises:
        ValueError: if `base` is outside [0, 1), or `k`, `num_stages` are out of range.
    """
    delay = stage_delay(k, num_stages)
    if not 0.0 <= base < 1.0:
        raise ValueError(f"The momentum (or `beta_1`) must be in [0, 1). Received: {base!r}")
    if base >= 0.99:
        return float(base)
    return base + delay * (0.99 - base) / num_stages


def check_accumulate(accumulate, mode, num_stages=None):
    """Checks `accumulate`, 2bw's mini-batches per update (SPECTRAIN.md 6e).

    Args:
        accumulate: None (mode "2bw": one update per N mini-batches) or an int >= 1.
        mode: the pipeline mode (checked already).
        num_stages: N once known (the cuts are made), else None.

    Returns:
        The mini-batches per update: 1 outside "2bw"; `accumulate`, or N for None, in it
        (None while N is unknown).

    Raises:
        ValueError: if `accumulate` is given outside mode "2bw", or is below N in it.
        TypeError: if it is not an int.
    """
    if accumulate is None:
        return num_stages if mode == "2bw" else 1
    checks.check_int("accumulate", accumulate, 1, meaning="mini-batches per update")
    if mode != "2bw":
        raise ValueError(
            "`accumulate` is the mini-batches per update of mode '2bw'. Received: "
            f"accumulate={accumulate!r} with mode={mode!r}; leave it at None, or use "
            "mode='2bw'")
    if num_stages is not None and accumulate < num_stages:
        raise ValueError(
            f"`accumulate` must be at least the number of stages ({num_stages}) in mode "
            "'2bw': with fewer mini-batches per update, an early stage's backward would "
            "need a third weight version, and 2BW keeps two. Received: "
            f"accumulate={accumulate!r}")
    return int(accumulate)


def applies_update(i, num_batches, accumulate):
    """Whether mini-batch i's `U(i)` applies the stage's gradient (else it keeps adding up).

    Every `U(i)` applies with `accumulate = 1`; with `A > 1` (mode "2bw"), `U(i)` applies
    the group's mean gradient when `(i + 1) % A == 0` or i is the epoch's last mini-batch.

    Args:
        i: the mini-batch index in its epoch, an int >= 0.
        num_batches: the epoch's mini-batches `T`, an int > i.
        accumulate: `A`, an int >= 1.

    Returns:
        True or False.
    """
    return (i + 1) % accumulate == 0 or i == num_batches - 1

