"""Tests for tf_spectrain.partition.cuts: `default_cuts` (by parameters and by compute)
against a brute-force enumeration, and the checks of user-given cuts."""

import itertools

import keras
import pytest
from partition_helpers import (
    _cnn_functional,
    _op_names,
    _tiny_resnet,
    _vgg_sequential,
)

from tf_spectrain.partition import (
    default_cuts,
    describe_stages,
    layer_costs,
    split_model,
)


@pytest.fixture(scope="module")
def resnet50():
    return keras.applications.ResNet50(
        weights=None, include_top=False, input_shape=(32, 32, 3)
    )


# ---------------------------------------------------------------------- default_cuts


def _best_cuts_by_enumeration(model, num_stages, allowed_names):
    """Cut names with the least max stage params, then sum of squares, then latest."""
    costs = {n: model.get_layer(n).count_params() for n in _op_names(model)}
    return _best_cuts_by_enumeration_of(costs, num_stages, allowed_names)


def _best_cuts_by_enumeration_of(costs, num_stages, allowed_names):
    """Cut names with the least max stage cost, then sum of squares, then latest."""
    names = list(costs)
    params = list(costs.values())
    positions = sorted(names.index(n) for n in allowed_names)
    best = None
    for cuts in itertools.combinations(positions, num_stages - 1):
        bounds = [-1, *cuts, len(names) - 1]
        stage = [sum(params[a + 1 : b + 1]) for a, b in zip(bounds, bounds[1:])]
        key = (max(stage), sum(c * c for c in stage), [-p for p in cuts])
        if best is None or key < best[0]:
            best = (key, [names[p] for p in cuts])
    return best[1]


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
def test_default_cuts_sequential_balances_params(num_stages):
    model = _vgg_sequential()
    # In a chain, one tensor crosses after every layer but the last.
    allowed = _op_names(model)[:-1]
    expected = _best_cuts_by_enumeration(model, num_stages, allowed)
    assert default_cuts(model, num_stages) == expected


@pytest.mark.parametrize("num_stages", [2, 3])
def test_default_cuts_resnet_cuts_between_blocks(num_stages):
    model = _tiny_resnet(False)
    # Written by hand: inside a block two tensors cross; after these, only one does.
    allowed = ["stem", "b1_add", "b1_out", "b2_add", "b2_out", "gap"]
    cuts = default_cuts(model, num_stages)
    assert cuts == _best_cuts_by_enumeration(model, num_stages, allowed)
    for spec in describe_stages(model, cuts):
        assert spec.num_inputs == 1 and spec.num_outputs == 1


def test_default_cuts_resnet50_lands_on_block_outputs(resnet50):
    cuts = default_cuts(resnet50, 4)
    assert len(cuts) == 3
    specs = describe_stages(resnet50, cuts)
    assert all(s.num_inputs == 1 and s.num_outputs == 1 for s in specs)
    assert all(c.endswith("_out") or c.endswith("_pool") for c in cuts), cuts
    biggest = max(s.num_params for s in specs)
    assert biggest < resnet50.count_params() / 2


def test_default_cuts_too_few_cut_points():
    # With the long skip only stem, long_add and gap have one tensor crossing after them.
    with pytest.raises(ValueError, match=r"only 3 layers .*\['stem', 'long_add', 'gap'\]"):
        default_cuts(_tiny_resnet(True), 5)


@pytest.mark.parametrize(
    "num_stages, error, match",
    [
        (0, ValueError, "num_stages=0"),
        (2.0, TypeError, "num_stages=2.0"),
        (True, TypeError, "num_stages=True"),
    ],
)
def test_default_cuts_bad_num_stages(num_stages, error, match):
    with pytest.raises(error, match=match):
        default_cuts(_vgg_sequential(), num_stages)


# -------------------------------------------------------------- cost="macs"


def _macs_cuts_by_enumeration(model, num_stages):
    """For a chain: least max stage MACs, then sum of squares, then latest cuts, over the
    cuts where every stage has weights and every stage but the first starts with a layer
    with weights (a weightless layer, such as a pooling, stays with the stage before)."""
    names = _op_names(model)
    macs = layer_costs(model, "macs")
    costs = [macs[n] for n in names]
    weighted = [model.get_layer(n).count_params() > 0 for n in names]
    best = None
    for cuts in itertools.combinations(range(len(names) - 1), num_stages - 1):
        bounds = [-1, *cuts, len(names) - 1]
        if not all(any(weighted[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds)):
            continue
        if not all(weighted[p + 1] for p in cuts):
            continue
        stage = [sum(costs[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds)]
        key = (max(stage), sum(c * c for c in stage), [-p for p in cuts])
        if best is None or key < best[0]:
            best = (key, [names[p] for p in cuts])
    return best[1]


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("build", [_vgg_sequential, _cnn_functional])
def test_default_cuts_by_compute_balance_macs_with_weights_in_every_stage(build, num_stages):
    model = build()
    cuts = default_cuts(model, num_stages, by="macs")
    assert cuts == _macs_cuts_by_enumeration(model, num_stages)
    for stage in split_model(model, cuts):
        assert stage.count_params() > 0


def test_default_cuts_by_compute_differ_from_params_and_keep_pooling_before_the_cut():
    model = _vgg_sequential()
    # Parameters 112, 296 | 528, 51 (the dense fc holds the most); MACs per example
    # 6,912 + 64 (block1_conv, block1_pool) | 4,608 + 32 + 32 + 512 + 48 (the rest).
    assert default_cuts(model, 2) == ["flatten"]
    assert default_cuts(model, 2, by="macs") == ["block1_pool"]


def test_default_cuts_by_compute_too_few_weighted_candidates():
    # Only conv1..predictions carry weights: 4 weighted layers allow at most 4 stages.
    with pytest.raises(ValueError, match=r"layers with weights on both sides: \["):
        default_cuts(_cnn_functional(), 5, by="macs")


@pytest.mark.parametrize("by", ["flops", None, "MACS"])
def test_default_cuts_unknown_cost_is_named(by):
    with pytest.raises(
        ValueError,
        match=r"`by` must be one of \['params', 'macs', 'layers'\]\. " rf"Received: by={by!r}",
    ):
        default_cuts(_vgg_sequential(), 2, by=by)


@pytest.mark.parametrize("num_stages", [2, 3])
def test_default_cuts_by_layers_balances_layer_counts(num_stages):
    model = _vgg_sequential()
    allowed = _op_names(model)[:-1]  # a chain: one tensor crosses after every layer
    costs = {name: 1 for name in _op_names(model)}
    expected = _best_cuts_by_enumeration_of(costs, num_stages, allowed)
    assert default_cuts(model, num_stages, by="layers") == expected


# -------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "cuts, error, match",
    [
        (
            ["bloc1_pool"],
            ValueError,
            r"`cuts` must name layers of the model 'tiny_vgg'\. "
            r"Received: cuts=\['bloc1_pool'\]; did you mean 'block1_pool'\?",
        ),
        (["zzzzzzzz"], ValueError, r"Valid names .*'block1_conv'"),
        (
            ["block2_conv", "block1_pool"],
            ValueError,
            r"order.*'block1_pool' \(layer 1\) comes before 'block2_conv' \(layer 2\).*"
            r"in model order: \['block1_pool', 'block2_conv'\]",
        ),
        (["block1_pool", "fc", "block1_pool"], ValueError, "'block1_pool' more than once"),
        (["predictions"], ValueError, "'predictions' is the model's last layer"),
        (["image"], ValueError, "'image' is an input layer"),
        ("block1_pool", TypeError, r"did you mean cuts=\['block1_pool'\]"),
        ([3], TypeError, "only layer names .*3 of type int"),
        (None, TypeError, "list of layer names"),
    ],
)
def test_bad_cuts_are_rejected(cuts, error, match):
    model = _vgg_sequential()
    with pytest.raises(error, match=match):
        split_model(model, cuts)
    with pytest.raises(error, match=match):
        describe_stages(model, cuts)
