"""Pure planning of default cut points: balance per-layer costs over pipeline stages.

No TensorFlow or Keras here: `plan_cuts` sees a list of per-layer costs (parameter
counts, in topological order) and the positions where a stage may end, and picks the
stage ends.
"""

import math
import numbers


def plan_cuts(costs, num_stages, allowed=None):
    """Chooses where to cut a chain of layers into `num_stages` balanced stages.

    A "position" is an index into `costs`; cutting at position `p` ends a stage after
    layer `p`, so `num_stages - 1` strictly increasing cut positions split the layers into
    `num_stages` non-empty consecutive stages. The choice, in order of priority:

    1. the largest stage cost is as small as possible (the pipeline runs at the pace of
       its slowest stage);
    2. among those splits, the sum of squared stage costs is smallest (the most even one,
       so the small stages do not all pile up at one end);
    3. among those, the cut list that is largest lexicographically (later cuts). Ties come
       from weightless layers (activations, pooling, flatten): this rule keeps such a
       layer with the stage of the layer it follows, so cuts land after a pooling layer
       (where the crossing tensor is smallest) and after a residual block's final
       activation.

    Each of the three is solved exactly by dynamic programming over the allowed
    positions, in `O(num_stages * len(allowed) ** 2)` time.

    Args:
        costs: sequence of non-negative finite numbers, the cost of each layer in order
            (for instance its parameter count).
        num_stages: int >= 1, how many stages to make.
        allowed: optional iterable of positions (ints indexing `costs`) after which a
            stage may end. `None` allows every position. The last position always ends
            the last stage, so listing it is allowed and has no effect.

    Returns:
        A sorted list of `num_stages - 1` cut positions taken from `allowed`. Stage `k`
        holds layers `cuts[k-1] + 1 .. cuts[k]` (with `cuts[-1] = -1` and the last stage
        ending at `len(costs) - 1`).

    Raises:
        TypeError: if `costs` is not a sequence of numbers or `num_stages` is not an int.
        ValueError: if a cost is negative or not finite, `num_stages` is out of range, a
            position in `allowed` is out of range, or there are fewer usable positions
            in `allowed` than the `num_stages - 1` cuts needed.
    """
    costs = _check_costs(costs)
    _check_num_stages(num_stages, len(costs))
    ends = _check_allowed(allowed, len(costs), num_stages)
    if num_stages == 1:
        return []

    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # Candidate stage ends, the last one always being the end of the model.
    ends = ends + [len(costs) - 1]
    bound = _min_max_cost(prefix, ends, num_stages)
    return _even_cuts_within(prefix, ends, num_stages, bound)


def _stage_cost(prefix, start, end):
    """Cost of the layers `start..end` (inclusive)."""
    return prefix[end + 1] - prefix[start]


def _start_of(ends, j):
    """First layer after `ends[j]`; `j == len(ends)` stands for the model's start."""
    return 0 if j == len(ends) else ends[j] + 1


def _min_max_cost(prefix, ends, num_stages):
    """The smallest achievable largest-stage cost."""
    # `best[j]` (for `s` stages): the smallest largest-stage cost of splitting the layers
    # after `ends[j]` into `s` stages; `j == len(ends)` stands for all the layers.
    n_ends = len(ends)
    last = n_ends - 1
    inf = math.inf
    # best[j] for the current s; index n_ends stands for "start at layer 0", and
    # best[last] stays inf: nothing is left after the model's last layer.
    best = [inf] * (n_ends + 1)
    for j in range(n_ends + 1):
        if j != last:
            best[j] = _stage_cost(prefix, _start_of(ends, j), ends[last])
    for _ in range(2, num_stages + 1):
        new = [inf] * (n_ends + 1)
        for j in range(n_ends + 1):
            first = j + 1 if j != n_ends else 0
            for e in range(first, last):
                cost = max(_stage_cost(prefix, _start_of(ends, j), ends[e]), best[e])
                if cost < new[j]:
                    new[j] = cost
        best = new
    return best[n_ends]


def _even_cuts_within(prefix, ends, num_stages, bound):
    """Cuts with every stage cost <= `bound` and the least sum of squared stage costs."""
    # Ties go to the latest cut at each step, which yields the lexicographically
    # largest cut list among the optimal ones.
    n_ends = len(ends)
    last = n_ends - 1
    inf = math.inf

    # table[s][j]: least sum of squares splitting the layers after ends[j] into s stages.
    table = [None, [inf] * (n_ends + 1)]
    for j in range(n_ends + 1):
        if j != last:
            cost = _stage_cost(prefix, _start_of(ends, j), ends[last])
            if cost <= bound:
                table[1][j] = cost * cost
    for s in range(2, num_stages + 1):
        row = [inf] * (n_ends + 1)
        for j in range(n_ends + 1):
            first = j + 1 if j != n_ends else 0
            for e in range(first, last):
                cost = _stage_cost(prefix, _start_of(ends, j), ends[e])
                if cost <= bound and table[s - 1][e] < inf:
                    row[j] = min(row[j], cost * cost + table[s - 1][e])
        table.append(row)

    cuts = []
    j = n_ends
    for s in range(num_stages, 1, -1):
        first = j + 1 if j != n_ends else 0
        for e in reversed(range(first, last)):
            cost = _stage_cost(prefix, _start_of(ends, j), ends[e])
            if cost <= bound and cost * cost + table[s - 1][e] == table[s][j]:
                cuts.append(ends[e])
                j = e
                break
    return cuts


def _check_costs(costs):
    if isinstance(costs, (str, bytes)) or not hasattr(costs, "__len__"):
        raise TypeError(
            "`costs` must be a sequence of numbers, one per layer. "
            f"Received: costs={costs!r}"
        )
    costs = list(costs)
    if not costs:
        raise ValueError("`costs` must name at least one layer. Received: costs=[]")
    for i, c in enumerate(costs):
        if isinstance(c, bool) or not isinstance(c, numbers.Real):
            raise TypeError(
                "`costs` must contain only numbers. "
                f"Received: costs[{i}]={c!r} of type {type(c).__name__}"
            )
        if not math.isfinite(c) or c < 0:
            raise ValueError(
                "`costs` must contain non-negative finite numbers. "
                f"Received: costs[{i}]={c!r}"
            )
    return costs


def _check_num_stages(num_stages, num_layers):
    if isinstance(num_stages, bool) or not isinstance(num_stages, numbers.Integral):
        raise TypeError(
            "`num_stages` must be an int >= 1. "
            f"Received: num_stages={num_stages!r} of type {type(num_stages).__name__}"
        )
    if not 1 <= num_stages <= num_layers:
        raise ValueError(
            f"`num_stages` must be between 1 and the number of layers ({num_layers}), "
            f"since every stage needs at least one layer. Received: num_stages={num_stages}"
        )


def _check_allowed(allowed, num_layers, num_stages):
    """Returns the sorted positions where a non-final stage may end."""
    if allowed is None:
        positions = set(range(num_layers))
    else:
        if isinstance(allowed, (str, bytes)):
            raise TypeError(
                "`allowed` must be an iterable of int positions. "
                f"Received: allowed={allowed!r}"
            )
        positions = set()
        for p in allowed:
            if isinstance(p, bool) or not isinstance(p, numbers.Integral):
                raise TypeError(
                    "`allowed` must contain int positions. "
                    f"Received: {p!r} of type {type(p).__name__} in allowed"
                )
            if not 0 <= p < num_layers:
                raise ValueError(
                    f"`allowed` positions must be in [0, {num_layers - 1}] "
                    f"(one per layer). Received: {p} in allowed"
                )
            positions.add(int(p))
    usable = sorted(p for p in positions if p != num_layers - 1)
    if len(usable) < num_stages - 1:
        raise ValueError(
            f"Cannot make num_stages={num_stages} stages: that needs {num_stages - 1} "
            f"cut positions but only {len(usable)} are allowed ({usable}). "
            "Use fewer stages or allow more positions."
        )
    return usable
