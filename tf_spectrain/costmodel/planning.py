"""Cut points that make the fastest pipeline under the cost model (pure Python).

`tf_spectrain.partition.plan_cuts` balances per-layer costs that simply add up. A pipeline
stage also pays for its hand-offs, and those depend on where it starts and ends (a cut
after a pooling layer sends a quarter of what a cut before it sends), and for the forward
it recomputes in some modes, and its memory depends on the mode, the micro-batches, the
`sync` schedule and recomputation; `stage_terms.StageTerms` prices every candidate stage
whole.

Dynamic programming over the layer chain, in `O(N * L**2)` for L cut candidates and N
stages:

1. the smallest possible time of the slowest stage (compute, recompute and sends): the
   steady state's seconds per mini-batch when hand-offs do not overlap compute; stages
   whose memory exceeds their device's limit are not candidates;
2. among the cuts that reach it, the least total time over all stages (fewer bytes sent
   and nothing wasted), ties going to the earliest cuts.

- `best_cuts(profile, hardware, batch_size, ...)`: just the cut names.
- `plan_partition(profile, num_stages, batch_size, ...)`: a `PartitionPlan` with each
  stage's predicted time and memory.
"""

import math

from tf_spectrain import checks
from tf_spectrain.costmodel.plan import PartitionPlan, size
from tf_spectrain.costmodel.predict import check_arguments, check_recompute_flag
from tf_spectrain.costmodel.stage_terms import STASHING, StageTerms

_REL_TOL = 1e-12


class MemoryLimitError(ValueError):
    """No cut list fits every stage into its device's `memory_limit`."""


def best_cuts(
    profile, hardware, batch_size, num_stages=None, recompute=False, allowed=None, replicas=1
):
    """Chooses the cuts that minimise the slowest stage's compute plus hand-offs.

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware` (its speed and links price the stages: stage k on device
            k, or `r * N + k` for replica r, a hop between hosts over the inter-host link).
        batch_size: examples per mini-batch, an int >= 1 (split over the replicas).
        num_stages: an int in `1 .. min(len(profile), hardware.num_gpus // replicas)`;
            None means that largest value.
        recompute: which stages recompute their forward in their backward (see
            `predict.pipeline_times`): False (none), True (every stage but the last) or
            "always" (every stage).
        allowed: optional list of layer names or positions after which a stage may end;
            None allows every layer but the last.
        replicas: `R`, copies of the pipeline (`predict.predict_hybrid`), an int >= 1:
            every stage also pays the all-reduce of its gradients over its R copies (all
            N rings taken to run at once).

    Returns:
        A list of `num_stages - 1` layer names, in model order, for `predict_pipeline` or
        `tf_spectrain.PipelineModel(cuts=...)`.

    Raises:
        TypeError, ValueError: for invalid arguments, or too few allowed positions.
    """
    batch_size = check_arguments(profile, hardware, batch_size)
    recompute = check_recompute_flag(recompute)
    replicas = checks.check_int(
        "replicas", replicas, 1, hardware.num_gpus, meaning="copies of the pipeline, at most "
        "hardware.num_gpus"
    )
    most = min(len(profile), hardware.num_gpus // replicas)
    if num_stages is None:
        num_stages = most
    num_stages = checks.check_int("num_stages", num_stages, 1, meaning="pipeline stages")
    if num_stages > most:
        raise ValueError(
            f"`num_stages` must be at most {most}: one device per stage and replica "
            f"(hardware.num_gpus={hardware.num_gpus}, replicas={replicas}) and one layer "
            f"per stage ({len(profile)} layers). Received: num_stages={num_stages}"
        )
    n = num_stages
    terms = StageTerms(
        profile,
        batch_size,
        num_stages,
        # Paper SpecTrain recomputes on every stage but the last; sync only when "always".
        mode="spectrain" if recompute is True else "sync",
        recompute="always" if recompute == "always" else "auto",
        bandwidth=hardware.bandwidth,
        latency=hardware.latency,
        relative_speed=hardware.relative_speed,
        replicas=replicas,
        hop_links=[
            hardware.links([(r * n + k, r * n + k + 1) for r in range(replicas)])
            for k in range(n - 1)
        ],
        ring_links=hardware.ring_links([[r * n + k for r in range(replicas)] for k in range(n)]),
    )
    ends = _allowed_ends(profile, allowed, num_stages)
    return [profile.layers[p].name for p in _search(terms, ends, None)]


def plan_partition(
    profile,
    num_stages,
    batch_size,
    mode="spectrain",
    spectrain_target="paper",
    micro_batches=1,
    bandwidth=math.inf,
    latency=0.0,
    memory_limit=None,
    optimizer_slots=1,
    allowed=None,
    devices=None,
    profile_seconds=0.0,
    schedule="gpipe",
    recompute="auto",
    accumulate=None,
):
    """Plans the cuts of a pipeline and predicts each stage's time and memory.

    Args:
        profile: a `ModelProfile`, or a list of one per stage's device (see `StageTerms`).
        num_stages: `N`, an int in `1 .. len(profile)`.
        batch_size: examples per mini-batch, an int >= 1.
        mode, spectrain_target, micro_batches, schedule, recompute: the pipeline's, as
            `PipelineModel` takes them (they decide recomputation and what stays in
            memory; see `StageTerms`): `micro_batches` in any mode, `schedule` "gpipe" or
            (sync only) "1f1b", `recompute` "auto" or "always".
        accumulate: mode "2bw"'s mini-batches per update, an int >= `num_stages`, or
            None for `num_stages` (its stages hold the group's gradient sum).
        bandwidth, latency: the link between neighbouring devices (bytes/s, seconds).
        memory_limit: None, bytes per device (a number), or a list of `N` numbers (None
            entries: no limit); plans with a stage over its limit are left out.
        optimizer_slots: optimizer variables per weight (1: momentum SGD).
        allowed: optional list of layer names or positions after which a stage may end;
            None allows every layer but the last.
        devices: optional list of `N` device names, for the plan's table.
        profile_seconds: how long profiling took, for the plan's table.

    Returns:
        A `PartitionPlan`.

    Raises:
        MemoryLimitError: if no cut list fits `memory_limit` (the message gives what the
            plan that needs least memory needs).
        TypeError, ValueError: for invalid arguments.
    """
    terms = StageTerms(
        profile, batch_size, num_stages, mode, spectrain_target, micro_batches,
        bandwidth, latency, optimizer_slots, schedule=schedule, recompute=recompute,
        accumulate=accumulate,
    )
    first_profile = terms.profiles[0]
    if num_stages > len(first_profile):
        raise ValueError(
            f"`num_stages` must be at most the number of layers ({len(first_profile)}): every "
            f"stage needs a layer. Received: num_stages={num_stages}"
        )
    limits = _check_limits(memory_limit, num_stages)
    ends = _allowed_ends(first_profile, allowed, num_stages)
    cuts = _search(terms, ends, limits)
    if cuts is None:
        raise MemoryLimitError(_memory_message(terms, ends, limits))
    bounds = [-1] + cuts + [terms.last_layer]
    stages = [terms.estimate(bounds[k] + 1, bounds[k + 1], k) for k in range(num_stages)]
    return PartitionPlan(
        names=first_profile.names,
        stages=stages,
        batch_size=terms.batch_size,
        mode=mode,
        spectrain_target=spectrain_target,
        micro_batches=terms.micro_batches,
        schedule=schedule,
        recompute=recompute,
        accumulate=accumulate,
        devices=devices,
        memory_limits=limits,
        profile_seconds=profile_seconds,
        model_name=first_profile.name,
    )


def _check_limits(memory_limit, num_stages):
    """One limit (bytes, or None for none) per stage."""
    if memory_limit is None:
        return [None] * num_stages
    if isinstance(memory_limit, (list, tuple)):
        if len(memory_limit) != num_stages:
            raise ValueError(
                f"`memory_limit` must be a number of bytes or a list of one per stage "
                f"({num_stages}). Received: memory_limit={list(memory_limit)}"
            )
        return [
            None if m is None else checks.check_number("memory_limit", m, 0.0, strict=True)
            for m in memory_limit
        ]
    limit = checks.check_number(
        "memory_limit", memory_limit, 0.0, strict=True, meaning="bytes per device"
    )
    return [limit] * num_stages


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


def _search(terms, ends, limits):
    """The best cut positions, or None when no cut list fits the memory limits."""
    num_stages = terms.num_stages
    fits = _memory_fit(terms, limits)

    def price(first, last, k):
        if fits is not None and last > fits(first, k):
            return math.inf
        return terms.seconds(first, last, k)

    bound = _min_max(price, terms.last_layer, ends, num_stages)
    if math.isinf(bound):
        return None
    return _least_total_within(price, terms.last_layer, ends, num_stages, bound)


def _memory_fit(terms, limits):
    """`fits(first, k)`: the last layer a stage `k` from `first` may end at within its limit.

    A stage's memory only grows as it takes more layers, so a binary search finds it;
    results are cached. None when there are no limits.
    """
    if limits is None or all(limit is None for limit in limits):
        return None
    cache = {}

    def fits(first, k):
        if limits[k] is None:
            return terms.last_layer
        if (first, k) not in cache:
            lo, hi = first - 1, terms.last_layer  # fits(first) is in [first - 1, last]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if terms.memory_bytes(first, mid, k) <= limits[k]:
                    lo = mid
                else:
                    hi = mid - 1
            cache[(first, k)] = lo
        return cache[(first, k)]

    return fits


def _min_max(price, last, ends, num_stages):
    """The least possible largest stage price, `price(first, last, k)`."""
    # `best[j]` for `s` stages left: the least largest price of splitting the layers from
    # `starts[j]` (after cut `ends[j-1]`, or layer 0 for j = 0) into stages N-s .. N-1.
    starts = [0] + [e + 1 for e in ends]
    best = [price(a, last, num_stages - 1) if a <= last else math.inf for a in starts]
    for s in range(2, num_stages + 1):
        k = num_stages - s
        new = [math.inf] * len(starts)
        for j, a in enumerate(starts):
            for e_index in range(j, len(ends)):
                end = ends[e_index]
                if end < a or best[e_index + 1] == math.inf:
                    continue
                new[j] = min(new[j], max(price(a, end, k), best[e_index + 1]))
        best = new
    return best[0]


def _least_total_within(price, last, ends, num_stages, bound):
    """Cuts with every stage within `bound` and the least total price; earliest on ties."""
    limit = bound * (1 + _REL_TOL)
    starts = [0] + [e + 1 for e in ends]

    def within(a, end, k):
        cost = price(a, end, k) if a <= end else math.inf
        return cost if cost <= limit else math.inf

    tables = [None, [within(a, last, num_stages - 1) for a in starts]]
    for s in range(2, num_stages + 1):
        k = num_stages - s
        row = [math.inf] * len(starts)
        for j, a in enumerate(starts):
            for e_index in range(j, len(ends)):
                row[j] = min(row[j], within(a, ends[e_index], k) + tables[s - 1][e_index + 1])
        tables.append(row)
    cuts, j = [], 0
    for s in range(num_stages, 1, -1):
        a, k = starts[j], num_stages - s
        for e_index in range(j, len(ends)):
            total = within(a, ends[e_index], k) + tables[s - 1][e_index + 1]
            if total < math.inf and math.isclose(
                total, tables[s][j], rel_tol=_REL_TOL, abs_tol=0.0
            ):
                cuts.append(ends[e_index])
                j = e_index + 1
                break
    return cuts


def _memory_message(terms, ends, limits):
    """Says what the plan needing least memory (relative to the limits) would need."""

    def ratio(first, last, k):
        limit = limits[k]
        return 0.0 if limit is None else terms.memory_bytes(first, last, k) / limit

    bound = _min_max(ratio, terms.last_layer, ends, terms.num_stages)
    cuts = _least_total_within(ratio, terms.last_layer, ends, terms.num_stages, bound)
    bounds = [-1] + cuts + [terms.last_layer]
    names = terms.profiles[0].names
    needs = []
    for k in range(terms.num_stages):
        need = terms.estimate(bounds[k] + 1, bounds[k + 1], k).memory_bytes
        limit = "no limit" if limits[k] is None else f"limit {size(limits[k])}"
        needs.append(f"stage {k}: {size(need)} ({limit})")
    return (
        f"No cuts of model '{terms.profiles[0].name}' into {terms.num_stages} stages fit "
        f"`memory_limit` in mode '{terms.mode}' at batch size {terms.batch_size}. The plan "
        f"that needs least memory, cuts={[names[p] for p in cuts]}, needs "
        f"{'; '.join(needs)}. Use {', '.join(_memory_hints(terms))} or raise `memory_limit`."
    )


def _memory_hints(terms):
    """What else would keep less in memory than the options planned for."""
    hints = ["more stages", "a smaller batch"]
    if terms.mode != "sync":
        hints.append("mode 'sync' (it keeps one mini-batch in flight)")
    elif terms.schedule == "gpipe":
        hints.append("schedule='1f1b' with micro_batches (stage k keeps at most N - k of them)")
    if terms.mode in STASHING and terms.num_stages >= 4:
        hints.append("mode '2bw' (at most one stashed weight version per stage)")
    if terms.recompute == "auto":
        hints.append("recompute='always' (stages keep only their inputs)")
    return hints
