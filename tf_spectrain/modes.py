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
import difflib

from tf_spectrain import schedule

MODES = ("sync", "vanilla", "stash", "spectrain")
TARGETS = schedule.TARGETS


def _choice_error(name, value, choices):
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ValueError(f"`{name}` must be one of {list(choices)}. Received: {name}={value!r}{hint}")


def check_mode(mode, target="paper"):
    """Raises a ValueError unless `mode` and `target` are valid."""
    if mode not in MODES:
        raise _choice_error("mode", mode, MODES)
    if target not in TARGETS:
        raise _choice_error("spectrain_target", target, TARGETS)


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
        return self.backward_steps is None

    def same_weights(self, updates_between, updates_before):
        """True when forward and backward weights are bitwise equal for one mini-batch.

        Args:
            updates_between: updates the stage applies between the F and the B.
            updates_before: updates applied before the F (0 means the momentum is still 0,
                so every prediction equals the current weights).
        """
        if self.reuses_forward:
            return True
        if updates_between:
            return False
        return self.forward_steps == self.backward_steps or updates_before == 0


def pass_plan(mode, k, num_stages, target="paper"):
    """Returns the `PassPlan` of stage `k` of `num_stages` in `mode`."""
    check_mode(mode, target)
    s_f, s_b = schedule.version_gaps(k, num_stages, target)
    if mode in ("sync", "stash"):
        return PassPlan(0, None)
    if mode == "vanilla":
        return PassPlan(0, 0)
    return PassPlan(s_f, s_b)
