"""Tests for tf_spectrain.costmodel.profile: per-stage sums of a profile worked out by
hand, bad cuts and bad profiles refused, a dict round trip."""


import pytest
from costmodel_helpers import CHAIN, L

from tf_spectrain.costmodel import ModelProfile

# --- profiles and stage sums --------------------------------------------------------------


@pytest.mark.parametrize(
    "cuts, expected",
    [
        # (first, last, forward, backward, weight bytes, input bytes, output bytes) per stage
        ([], [(0, 3, 5, 8, 200, 0, 0)]),
        (["l0"], [(0, 0, 1, 2, 100, 0, 10), (1, 3, 4, 6, 100, 10, 0)]),
        ([1], [(0, 1, 2, 3, 100, 0, 20), (2, 3, 3, 5, 100, 20, 0)]),
        ([0, 2], [(0, 0, 1, 2, 100, 0, 10), (1, 2, 3, 3, 40, 10, 5), (3, 3, 1, 3, 60, 5, 0)]),
        (
            ("l0", "l1", "l2"),
            [(0, 0, 1, 2, 100, 0, 10), (1, 1, 1, 1, 0, 10, 20), (2, 2, 2, 2, 40, 20, 5),
             (3, 3, 1, 3, 60, 5, 0)],
        ),
    ],
)
def test_stage_costs(cuts, expected):
    stages = CHAIN.stage_costs(cuts)
    got = [
        (s.first, s.last, s.forward_time, s.backward_time, s.weight_bytes, s.input_bytes,
         s.output_bytes)
        for s in stages
    ]
    assert got == expected
    assert [s.index for s in stages] == list(range(len(expected)))


@pytest.mark.parametrize(
    "cuts, error, match",
    [
        ("l1", TypeError, r"not a single string.*did you mean cuts=\['l1'\]"),
        (["l9"], ValueError, r"profile 'chain'.*'l9' is not one. Layers: \['l0', 'l1'"),
        ([3], ValueError, r"must be in \[0, 2\].*cuts=\[3\]"),
        ([-1], ValueError, r"must be in \[0, 2\]"),
        (["l3"], ValueError, r"last stage.*'l3' is the last layer"),
        ([1, 1], ValueError, r"in model order without repeats"),
        (["l2", "l0"], ValueError, r"positions \[2, 0\]"),
        ([0, "l1"], TypeError, r"all layer names \(str\) or all int"),
        ([True], TypeError, r"all layer names"),
        (None, TypeError, r"cuts=None"),
    ],
)
def test_bad_cuts(cuts, error, match):
    with pytest.raises(error, match=match):
        CHAIN.stage_costs(cuts)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: L("a", -1, 0), ValueError, r"forward_time=-1"),
        (lambda: L("a", 0, float("inf")), ValueError, r"backward_time=inf"),
        (lambda: L("a", 0, 0, output_bytes="big"), TypeError, r"output_bytes='big'"),
        (lambda: L("", 0, 0), ValueError, r"non-empty string"),  # a str, but empty
        (lambda: L(3, 0, 0), TypeError, r"`name` must be a str"),
        (lambda: ModelProfile([], 1), ValueError, r"at least one LayerProfile"),
        (lambda: ModelProfile([L("a", 0, 0), L("a", 1, 1)], 1), ValueError, r"Repeated: \['a'\]"),
        (lambda: ModelProfile([("a", 0, 0)], 1), TypeError, r"layers\[0\]"),
        (lambda: ModelProfile([L("a", 0, 0)], 0), ValueError, r"batch_size=0"),
        (lambda: ModelProfile(L("a", 0, 0), 1), TypeError, r"list of LayerProfile"),
        (lambda: ModelProfile.from_dict({"layers": []}), TypeError, r"'layers' and 'batch_size'"),
    ],
)
def test_bad_profiles(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_misspelt_cut_gets_a_hint():
    profile = ModelProfile([L("block1_pool", 1, 1), L("fc", 1, 1)], batch_size=1, name="vgg")
    with pytest.raises(ValueError, match=r"cuts=\['bloc1_pool'\]; did you mean 'block1_pool'\?"):
        profile.cut_positions(["bloc1_pool"])


def test_profile_round_trips_through_a_dict():
    again = ModelProfile.from_dict(CHAIN.to_dict())
    assert again.layers == CHAIN.layers
    assert (again.batch_size, again.name) == (CHAIN.batch_size, CHAIN.name)
