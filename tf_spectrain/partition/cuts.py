"""Cut points: check the ones a user names, or plan balanced ones.

A cut is the name of a layer that ENDS a stage; `N - 1` cuts make `N` stages. Internally
a cut is the layer's position in the model's topological order (see `graph.py`).
"""

import keras

from tf_spectrain import checks
from tf_spectrain.messages import did_you_mean
from tf_spectrain.partition.costs import COSTS, graph_costs
from tf_spectrain.partition.graph import read_graph
from tf_spectrain.partition.masks import positions_keeping_masks
from tf_spectrain.partition.planner import plan_cuts

BY = COSTS + ("layers",)
"""What `default_cuts` can balance: parameters, multiply-accumulates or layer counts."""

AUTO = "auto"
"""`PipelineModel(cuts="auto")`: plan the cuts from measured time (the default)."""


def check_cut_names(cuts, allow_auto=False):
    """Checks that `cuts` is a list of layer names: the one check of a cut list's types.

    Args:
        cuts: the value received as `cuts`.
        allow_auto: whether `AUTO` (`"auto"`) is accepted too (`PipelineModel`'s `cuts`).

    Returns:
        `cuts`, as given.

    Raises:
        TypeError: if `cuts` is a single string (other than an allowed `"auto"`; the
            message suggests a list of it), not a list or tuple, or holds a non-string.
    """
    valid = f"'{AUTO}' or a list of layer names" if allow_auto else "a list of layer names"
    if isinstance(cuts, str):
        if allow_auto and cuts == AUTO:
            return cuts
        raise TypeError(
            f"`cuts` must be {valid}{'' if allow_auto else ', not a single string'}. "
            f"Received: cuts={cuts!r}; did you mean cuts=[{cuts!r}]?"
        )
    if not isinstance(cuts, (list, tuple)):
        raise TypeError(
            f"`cuts` must be {valid}. Received: cuts={cuts!r} of type {type(cuts).__name__}"
        )
    for name in cuts:
        if not isinstance(name, str):
            raise TypeError(
                "`cuts` must contain only layer names (strings). "
                f"Received: cuts={list(cuts)!r} including {name!r} of type "
                f"{type(name).__name__}"
            )
    return cuts


def resolve_cuts(graph, cuts):
    """Checks `cuts` against a model graph and returns their positions.

    Args:
        graph: a `ModelGraph` from `read_graph`.
        cuts: list (or tuple) of layer names, each ending a stage, in model order.

    Returns:
        The list of positions of the cut layers, strictly increasing.

    Raises:
        TypeError: if `cuts` is not a list of strings.
        ValueError: if a name is not a layer of the model, is an input layer, is
            repeated, the cuts are out of order, or a cut leaves the last stage empty.
    """
    check_cut_names(cuts)
    names = graph.names
    where = {name: p for p, name in enumerate(names)}
    positions = []
    for name in cuts:
        if name not in where:
            raise ValueError(_unknown_name_message(graph, cuts, name))
        positions.append(where[name])
    _check_order(cuts, positions, names)
    if positions and positions[-1] == len(names) - 1:
        raise ValueError(
            f"`cuts` must leave at least one layer for the last stage, but "
            f"'{names[-1]}' is the model's last layer, so the last stage would be empty. "
            f"Remove it from `cuts` or cut earlier. Received: cuts={list(cuts)}"
        )
    return positions


def default_cuts(model, num_stages, by="params"):
    """Picks cut layers that give stages of about equal parameter counts, compute or layers.

    These are the static cuts, for comparison and for models that cannot be profiled;
    `PipelineModel(cuts="auto")` plans from measured time instead.

    Candidate cuts are the layers after which exactly one floating-point tensor crosses
    (and any number of integer or boolean ones, such as token ids or a padding mask), so
    VGG-style models are cut between layers, ResNets at the outputs of residual blocks
    and the zoo's text models at their blocks' `_out` layers (or the adds inside
    transformer blocks); cuts that would lose a Keras mask are not candidates (see
    `split_model`). Among those, `plan_cuts` minimises the largest stage's cost (then
    evens out the rest; ties go to later cuts, so weightless layers such as pooling stay
    with the layer before them).

    With `by="macs"` weightless layers cost something too, so the candidates are thinned
    first: of consecutive candidates with no layer with weights between them only the last
    is kept (a cut after the pooling rather than before it), and candidates after which no
    layer has weights are dropped. Every stage then has weights to train. `by="layers"`
    gives every layer a cost of 1 (stages of about equal layer counts).

    Args:
        model: a functional `keras.Model` or a built `keras.Sequential`.
        num_stages: int >= 1, the number of stages.
        by: what to balance, one of `BY`: `"params"` (the parameter counts, the default),
            `"macs"` (the compute per example, see `layer_costs`) or `"layers"`.

    Returns:
        A list of `num_stages - 1` layer names, in model order, for `split_model`.

    Raises:
        TypeError: if `model` is not a Keras model or `num_stages` not an int.
        ValueError: if `by` is unknown, the model cannot be split (see `read_graph`),
            or it has fewer candidate cut layers than `num_stages - 1`.
    """
    num_stages = checks.check_int("num_stages", num_stages, 1)
    checks.check_one_of("by", by, BY)
    graph = read_graph(model)
    names = graph.names
    last = len(names) - 1
    keeping = positions_keeping_masks(graph)
    allowed = [p for p in keeping if len(_floating(graph.crossing(p))) == 1]
    if by == "macs":
        allowed = _with_weights_between(allowed, [c.count_params() > 0 for c in graph.calls])
    if len(allowed) < num_stages - 1:
        candidates = [names[p] for p in allowed]
        weights = " and layers with weights on both sides" if by == "macs" else ""
        masks = " (and keep every Keras mask)" if len(keeping) < last else ""
        raise ValueError(
            f"Cannot cut model '{model.name}' into num_stages={num_stages} stages: that "
            f"needs {num_stages - 1} cut layers, but only {len(allowed)} layers have "
            f"exactly one floating-point tensor crossing after them{weights}{masks}: "
            f"{candidates}. Use fewer stages or pass `cuts` explicitly."
        )
    costs = [1] * len(names) if by == "layers" else graph_costs(graph, by)
    return [names[p] for p in plan_cuts(costs, num_stages, allowed)]


def _floating(tensors):
    """The floating-point tensors among `tensors` (token ids and masks are not)."""
    return [t for t in tensors if keras.backend.is_float_dtype(t.dtype)]


def _with_weights_between(allowed, weighted):
    """The candidates of `allowed` that leave weights on both sides of every cut."""
    kept = []
    for p in allowed:
        start = kept[-1] + 1 if kept else 0
        if kept and not any(weighted[start : p + 1]):
            kept[-1] = p  # nothing to train between the two: cut at the later one
        elif any(weighted[start : p + 1]):
            kept.append(p)
    while kept and not any(weighted[kept[-1] + 1 :]):
        kept.pop()
    return kept


def _unknown_name_message(graph, cuts, name):
    """Why `name` of `cuts` is not a layer a stage can end at, with a hint where one helps."""
    received = f"Received: cuts={list(cuts)!r}"
    if name in graph.input_layer_names:
        return (
            f"`cuts` must name layers that end a stage, but '{name}' is an input layer, "
            f"so the first stage would be empty. {received}"
        )
    if name in graph.nested_models:
        inner = graph.nested_models[name]
        return (
            f"`cuts` must name layers of the model '{graph.model.name}', but '{name}' is a "
            "nested model, which is split into its own layers: name one of them instead, "
            f"such as '{inner[-1]}' ({len(inner)} layers, from '{inner[0]}'). {received}"
        )
    message = f"`cuts` must name layers of the model '{graph.model.name}'. {received}"
    hint = did_you_mean(name, graph.names)
    if hint:
        return message + hint
    return f"{message}. Valid names (model.summary() lists them): {_preview(graph.names)}"


def _check_order(cuts, positions, names):
    """Raises a ValueError for a repeated cut or cuts out of model order."""
    seen = set()
    for name in cuts:
        if name in seen:
            raise ValueError(
                f"`cuts` names layer '{name}' more than once, which would make an empty "
                f"stage. Each cut must be a different layer. Received: cuts={list(cuts)}"
            )
        seen.add(name)
    for k in range(1, len(cuts)):
        if positions[k] < positions[k - 1]:
            in_order = [names[p] for p in sorted(positions)]
            raise ValueError(
                f"`cuts` must follow the order of the layers in the model, but "
                f"'{cuts[k]}' (layer {positions[k]}) comes before "
                f"'{cuts[k - 1]}' (layer {positions[k - 1]}). "
                f"Received: cuts={list(cuts)}; in model order: {in_order}"
            )


def _preview(names, limit=12):
    """The first `limit` names, then how many more there are."""
    if len(names) <= limit:
        return names
    return names[:limit] + [f"... ({len(names) - limit} more)"]
