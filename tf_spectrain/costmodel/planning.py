"""Cut points that make the fastest pipeline under the cost model (pure Python).

`tf_spectrain.partition.plan_cuts` balances per-layer costs that simply add up. A pipeline
stage also pays for its hand-offs, and those depend on where it starts and ends (a cut
after a pooling layer sends a quarter of what a cut before it sends), so the search here
prices every candidate stage whole: its forward and backward (plus the recomputed forward
when asked) and the transfers at both of its ends.

Dynamic programming over the layer chain, in `O(N * L**2)` for L layers and N stages:

1. the smallest possible time of the slowest stage (compute plus its sends): the steady
   state's seconds per mini-batch when hand-offs do not overlap compute;
2. among the cuts that reach it, the least total time over all stages (fewer bytes sent
   and nothing wasted), ties going to the earliest cuts.
"""

import math

from tf_spectrain import checks
from tf_spectrain.costmodel.predict import check_arguments, time_scale

_REL_TOL = 1e-12


def best_cuts(profile, hardware, batch_size, num_stages=None, recompute=False, allowed=None):
    """Chooses the cuts that minimise the slowest stage's compute plus hand-offs.

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware` (its speed, bandwidth and latency price the stages).
        batch_size: examples per mini-batch, an int >= 1.
        num_stages: an int in `1 .. min(len(profile), hardware.num_gpus)`; None means
            `min(len(profile), hardware.num_gpus)`.
        recompute: whether every stage but the last recomputes its forward in its
            backward (see `predict.pipeline_times`).
        allowed: optional list of layer names or positions after which a stage may end;
            None allows every layer but the last.

    Returns:
        A list of `num_stages - 1` layer names, in model order, for `predict_pipeline` or
        `tf_spectrain.PipelineModel(cuts=...)`.

    Raises:
        TypeError, ValueError: for invalid arguments, or too few allowed positions.
    """
    batch_size = check_arguments(profile, hardware, batch_size)
    checks.check_bool("recompute", recompute)
    most = min(len(profile), hardware.num_gpus)
    if num_stages is None:
        num_stages = most
    num_stages = checks.check_int("num_stages", num_stages, 1, meaning="pipeline stages")
    if num_stages > most:
        raise ValueError(
            f"`num_stages` must be at most {most}: one device per stage "
            f"(hardware.num_gpus={hardware.num_gpus}) and one layer per stage "
            f"({len(profile)} layers). Received: num_stages={num_stages}"
        )
    ends = _allowed_ends(profile, allowed, num_stages)
    price = _StagePricer(profile, hardware, batch_size, recompute)
    bound = _min_max(price, ends, num_stages)
    cuts = _least_total_within(price, ends, num_stages, bound)
    return [profile.layers[p].name for p in cuts]


class _StagePricer:
    """Seconds per mini-batch of a stage over layers `first..last`, hand-offs included."""

    def __init__(self, profile, hardware, batch_size, recompute):
        scale = time_scale(profile, hardware, batch_size)
        self._fwd = [0.0]
        self._bwd = [0.0]
        for layer in profile.layers:
            self._fwd.append(self._fwd[-1] + layer.forward_time * scale)
            self._bwd.append(self._bwd[-1] + layer.backward_time * scale)
        self._send = [
            hardware.transfer_time(layer.output_bytes * batch_size) for layer in profile.layers
        ]
        self._recompute = recompute
        self.last_layer = len(profile.layers) - 1

    def __call__(self, first, last):
        forward = self._fwd[last + 1] - self._fwd[first]
        cost = forward + self._bwd[last + 1] - self._bwd[first]
        if last != self.last_layer:
            cost += self._send[last] + (forward if self._recompute else 0.0)
        if first > 0:
            cost += self._send[first - 1]
        return cost


def _allowed_ends(profile, allowed, num_stages):
    """Sorted positions where a stage other than the last may end."""
    if allowed is None:
        ends = list(range(len(profile) - 1))
    else:
        if isinstance(allowed, (str, bytes)) or not isinstance(allowed, (list, tuple, set)):
            raise TypeError(
                "`allowed` must be a list of layer names or positions. "
                f"Received: allowed={allowed!r}"
            )
        # Each one is checked as a one-cut list: a known name, or a position that leaves
        # the last layer to the last stage.
        ends = sorted({profile.cut_positions([cut])[0] for cut in allowed})
    if len(ends) < num_stages - 1:
        raise ValueError(
            f"Cannot make num_stages={num_stages} stages: that needs {num_stages - 1} cut "
            f"positions but only {len(ends)} are allowed. Use fewer stages or allow more."
        )
    return ends


def _min_max(price, ends, num_stages):
    """The least possible slowest-stage time."""
    # `best[s][j]`: the least slowest-stage time splitting the layers that start at
    # `starts[j]` (after cut `ends[j-1]`, or layer 0 for j = 0) into `s` stages.
    last = price.last_layer
    starts = [0] + [e + 1 for e in ends]
    best = [price(a, last) for a in starts]  # one stage: everything to the end
    for _ in range(2, num_stages + 1):
        new = [math.inf] * len(starts)
        for j, a in enumerate(starts):
            for e_index in range(j, len(ends)):
                end = ends[e_index]
                if end < a:
                    continue
                new[j] = min(new[j], max(price(a, end), best[e_index + 1]))
        best = new
    return best[0]


def _least_total_within(price, ends, num_stages, bound):
    """Cuts with every stage within `bound` and the least total time; earliest on ties."""
    limit = bound * (1 + _REL_TOL)
    last = price.last_layer
    starts = [0] + [e + 1 for e in ends]
    tables = [None, [price(a, last) if price(a, last) <= limit else math.inf for a in starts]]
    for s in range(2, num_stages + 1):
        row = [math.inf] * len(starts)
        for j, a in enumerate(starts):
            for e_index in range(j, len(ends)):
                end = ends[e_index]
                cost = price(a, end) if end >= a else math.inf
                if cost <= limit:
                    row[j] = min(row[j], cost + tables[s - 1][e_index + 1])
        tables.append(row)
    cuts, j = [], 0
    for s in range(num_stages, 1, -1):
        a = starts[j]
        for e_index in range(j, len(ends)):
            end = ends[e_index]
            cost = price(a, end) if end >= a else math.inf
            if cost <= limit and math.isclose(
                cost + tables[s - 1][e_index + 1], tables[s][j], rel_tol=_REL_TOL, abs_tol=0.0
            ):
                cuts.append(end)
                j = e_index + 1
                break
    return cuts
