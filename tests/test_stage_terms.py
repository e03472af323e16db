"""Tests for tf_spectrain.costmodel.stage_terms: every term of a candidate stage worked out by
hand on a four-layer profile, per mode and stage index, and bad arguments refused.

The expected numbers are written out below (with the arithmetic in comments), not computed
by the code under test. Pure Python: no TensorFlow.
"""

import math

import pytest
from costmodel_helpers import L

from tf_spectrain import schedule
from tf_spectrain.costmodel import ModelProfile, StageTerms

# Profiled at batch 2. Fields: forward s, backward s, output bytes/example, weight bytes,
# activation bytes/example. The model's inputs are 3 bytes per example.
P = ModelProfile(
    [
        L("a", 1.0, 2.0, 10.0, 100.0, 8.0),
        L("b", 2.0, 1.0, 20.0, 0.0, 20.0),
        L("c", 3.0, 3.0, 5.0, 40.0, 4.0),
        L("d", 1.0, 2.0, 0.0, 60.0, 2.0),
    ],
    batch_size=2,
    name="hand",
    input_bytes=3.0,
)
# Splits as (first, last, k) per stage: a | b c | d and a b | c d.
SPLIT3 = [(0, 0, 0), (1, 2, 1), (3, 3, 2)]
SPLIT2 = [(0, 1, 0), (2, 3, 1)]

FIELDS = (
    "forward", "backward", "recompute", "send", "param_bytes", "optimizer_bytes",
    "activation_bytes", "stash_bytes", "sent_bytes",
)


def row(forward, backward, recompute, send, params, optimizer, activation, stash, sent):
    return dict(zip(FIELDS, (forward, backward, recompute, send, params, optimizer,
                             activation, stash, sent)))


# Batch 2 (the profile's) on the three-stage split a | b c | d, link 10 B/s, latency 0.5 s.
# Per-mini-batch bytes at batch 2: inputs 6; a's output 20; c's output 10.
# Activations (own outputs) at batch 2: a 16; b + c = 48; d 4.
# Sends: stage 0 sends 20 B: 0.5 + 20 / 10 = 2.5; stage 1 sends 10 B (1.5) and returns the
# gradient of its 20 B input (2.5): 4.0; stage 2 returns 10 B: 1.5.
LINK = dict(bandwidth=10.0, latency=0.5)
CASES = [
    # --- vanilla: recomputes on stages 0 and 1 (not the last); in flight 3, 2, 1; no stash.
    #   stage 0 activations: 3 inputs kept (3 * 6) + one forward's outputs (16) = 34
    #   stage 1: 2 * 20 + 48 = 88; stage 2 reuses: 1 * (10 + 4) = 14
    ("vanilla", "paper", 2, 1.0, 1, LINK, SPLIT3, [
        row(1, 2, 1, 2.5, 100, 100, 34, 0, 20),
        row(5, 4, 5, 4.0, 40, 40, 88, 0, 10),
        row(1, 2, 0, 1.5, 60, 60, 14, 0, 0),
    ]),
    # --- paper spectrain: the same recompute and activations as vanilla; one predicted
    #   version per stage while it runs (s_f = 2, 1, 1; the last stage's s_f = s_b = 1).
    ("spectrain", "paper", 2, 1.0, 1, LINK, SPLIT3, [
        row(1, 2, 1, 2.5, 100, 100, 34, 100, 20),
        row(5, 4, 5, 4.0, 40, 40, 88, 40, 10),
        row(1, 2, 0, 1.5, 60, 60, 14, 60, 0),
    ]),
    # --- stash: reuses everywhere: in flight * (inputs + outputs):
    #   3 * (6 + 16) = 66, 2 * (20 + 48) = 136, 1 * (10 + 4) = 14; stashed versions
    #   N - k - 1 = 2, 1, 0 of the weights.
    ("stash", "paper", 2, 1.0, 1, LINK, SPLIT3, [
        row(1, 2, 0, 2.5, 100, 100, 66, 200, 20),
        row(5, 4, 0, 4.0, 40, 40, 136, 40, 10),
        row(1, 2, 0, 1.5, 60, 60, 14, 0, 0),
    ]),
    # --- consistent spectrain: reuses like stash; N - k predicted versions on stages 0, 1
    #   (3 and 2); the last stage predicts with s = 0, i.e. uses its current weights: none.
    ("spectrain", "consistent", 2, 1.0, 1, LINK, SPLIT3, [
        row(1, 2, 0, 2.5, 100, 100, 66, 300, 20),
        row(5, 4, 0, 4.0, 40, 40, 136, 80, 10),
        row(1, 2, 0, 1.5, 60, 60, 14, 0, 0),
    ]),
    # --- sync: one mini-batch in flight on every stage, reuse, no stash. Adam's 2 slots.
    #   activations 6 + 16 = 22, 20 + 48 = 68, 10 + 4 = 14
    ("sync", "paper", 2, 1.0, 2, LINK, SPLIT3, [
        row(1, 2, 0, 2.5, 100, 200, 22, 0, 20),
        row(5, 4, 0, 4.0, 40, 80, 68, 0, 10),
        row(1, 2, 0, 1.5, 60, 120, 14, 0, 0),
    ]),
    # --- batch 4 (times x 2, bytes x 2) on devices 2x faster (times / 2): the profile's
    #   times, twice the bytes. Free links: no send time, but the bytes are still counted.
    #   Two stages a b | c d in paper spectrain: s_f(0) = 1 (stage 0 recomputes), the last
    #   stage has s_f = s_b = 0, so it predicts nothing and stashes nothing.
    #   stage 0 recomputes: 2 inputs kept (2 * 3 * 4) + its outputs (8 + 20) * 4 = 136;
    #   stage 1 reuses: 1 * (80 + 24) = 104 (b's output 20 * 4 = 80 received, c's and d's
    #   outputs (4 + 2) * 4 = 24)
    ("spectrain", "paper", 4, 2.0, 1, dict(), SPLIT2, [
        row(3, 3, 3, 0.0, 100, 100, 136, 100, 80),
        row(4, 5, 0, 0.0, 100, 100, 104, 0, 0),
    ]),
    # --- batch 4 at the profile's speed: every time doubles. Vanilla, two stages.
    #   stage 0: f 6, b 6, recompute 6; 2 * (3 * 4) + (8 + 20) * 4 = 136; stage 1: 80 + 24
    ("vanilla", "paper", 4, 1.0, 0, dict(bandwidth=8.0), SPLIT2, [
        row(6, 6, 6, 10.0, 100, 0, 136, 0, 80),
        row(8, 10, 0, 10.0, 100, 0, 104, 0, 0),
    ]),
    # --- batch 1 (times / 2), the whole model as one stage: nothing to send or recompute.
    #   1 * (3 + 8 + 20 + 4 + 2) = 37
    ("spectrain", "paper", 1, 1.0, 1, LINK, [(0, 3, 0)], [
        row(3.5, 4, 0, 0.0, 200, 200, 37, 0, 0),
    ]),
]


@pytest.mark.parametrize(
    "mode, target, batch, speed, slots, link, split, expected",
    CASES,
    ids=[f"{c[0]}-{c[1]}-b{c[2]}-x{c[3]}-{len(c[6])}stages" for c in CASES],
)
def test_estimates_by_hand(mode, target, batch, speed, slots, link, split, expected):
    terms = StageTerms(
        P, batch, len(split), mode=mode, spectrain_target=target, optimizer_slots=slots,
        relative_speed=speed, **link,
    )
    for (first, last, k), want in zip(split, expected):
        est = terms.estimate(first, last, k)
        assert (est.index, est.first, est.last) == (k, first, last)
        got = {f: getattr(est, f) for f in FIELDS}
        assert got == pytest.approx(want), f"stage {k}"
        assert est.seconds == pytest.approx(sum(want[f] for f in FIELDS[:4]))
        assert est.memory_bytes == pytest.approx(
            want["param_bytes"] + want["optimizer_bytes"] + want["activation_bytes"]
            + want["stash_bytes"]
        )
        # The planner's fast path agrees with the full estimate.
        assert terms.seconds(first, last, k) == pytest.approx(est.seconds)


def test_gpipe_micro_batches_pay_the_latency_per_micro_batch():
    # sync with 4 micro-batches, link 10 B/s, latency 0.5 s, batch 2, split a | b c | d:
    # stage 0 sends 20 B: 4 * 0.5 + 2 = 4; stage 1: (4 * 0.5 + 1) + (4 * 0.5 + 2) = 7;
    # stage 2: 4 * 0.5 + 1 = 3. Memory: one mini-batch's worth, as with M = 1.
    terms = StageTerms(P, 2, 3, mode="sync", micro_batches=4, **LINK)
    sends = [terms.estimate(f, la, k).send for f, la, k in SPLIT3]
    assert sends == pytest.approx([4.0, 7.0, 3.0])
    acts = [terms.estimate(f, la, k).activation_bytes for f, la, k in SPLIT3]
    assert acts == pytest.approx([22, 68, 14])


def test_a_cut_that_crosses_no_bytes_costs_no_latency():
    # x's output is 0 bytes per example, y's 4.
    profile = ModelProfile([L("x", 1, 1, 0.0), L("y", 1, 1, 4.0), L("z", 1, 1)], batch_size=1)
    terms = StageTerms(profile, 1, 2, mode="sync", bandwidth=2.0, latency=0.25)
    assert terms.estimate(0, 0, 0).send == 0.0  # x's output is 0 bytes: no hand-off
    assert terms.estimate(0, 1, 0).send == pytest.approx(0.25 + 4 / 2)
    assert terms.estimate(2, 2, 1).send == pytest.approx(0.25 + 4 / 2)


@pytest.mark.parametrize("num_stages", [1, 2, 3, 5])
def test_which_stages_recompute_and_how_many_batches_are_in_flight(num_stages):
    n = num_stages
    for k in range(n):
        last = k == n - 1
        by_mode = {
            ("sync", "paper"): False,
            ("stash", "paper"): False,
            ("spectrain", "consistent"): False,
            ("vanilla", "paper"): not last,
            ("spectrain", "paper"): not last,
        }
        for (mode, target), recomputes in by_mode.items():
            terms = StageTerms(P, 1, n, mode=mode, spectrain_target=target)
            assert terms.recomputes(k) is recomputes, (mode, target, k)
            # 1F1B: stage k runs N - k forwards before its first backward (SPECTRAIN.md 3).
            assert terms.in_flight(k) == (1 if mode == "sync" else n - k)
            assert terms.in_flight(k) == (
                1 if mode == "sync" else schedule.max_stashed(k, n, 10 * n)
            )


def test_stashed_versions_follow_the_version_gaps():
    # Paper spectrain on N = 4: s_f = 3, 2, 2, 1 and s_b = 0, 0, 1, 1 (SPECTRAIN.md 4): every
    # stage predicts, one version at a time. On N = 2: s_f = 1, 0; s_b = 0, 0.
    one = ModelProfile([L(f"l{p}", 1, 1, 1.0, 10.0) for p in range(4)], batch_size=1)
    paper4 = StageTerms(one, 1, 4, mode="spectrain")
    assert [paper4.estimate(k, k, k).stash_bytes for k in range(4)] == [10, 10, 10, 10]
    paper2 = StageTerms(one, 1, 2, mode="spectrain")
    assert [paper2.estimate(0, 1, 0).stash_bytes, paper2.estimate(2, 3, 1).stash_bytes] == [
        20, 0,
    ]
    consistent = StageTerms(one, 1, 4, mode="spectrain", spectrain_target="consistent")
    assert [consistent.estimate(k, k, k).stash_bytes for k in range(4)] == [40, 30, 20, 0]
    stash = StageTerms(one, 1, 4, mode="stash")
    assert [stash.estimate(k, k, k).stash_bytes for k in range(4)] == [30, 20, 10, 0]
    for mode in ("sync", "vanilla"):
        terms = StageTerms(one, 1, 4, mode=mode)
        assert [terms.estimate(k, k, k).stash_bytes for k in range(4)] == [0, 0, 0, 0]


def test_one_profile_per_stage_prices_each_stage_on_its_own_device():
    # Stage 1's device measured every layer 4x slower.
    slow = ModelProfile(
        [L(x.name, 4 * x.forward_time, 4 * x.backward_time, x.output_bytes, x.weight_bytes,
           x.activation_bytes) for x in P.layers],
        batch_size=2, name="slow", input_bytes=3.0,
    )
    terms = StageTerms([P, slow], 2, 2, mode="sync")
    # a b: 1 + 2 forward, 2 + 1 backward on P; c d: 4 * (3 + 1), 4 * (3 + 2) on slow.
    s0, s1 = terms.estimate(0, 1, 0), terms.estimate(2, 3, 1)
    assert (s0.forward, s0.backward) == pytest.approx((3, 3))
    assert (s1.forward, s1.backward) == pytest.approx((16, 20))
    # The same layers as stage 0 on stage 1's device: 4x.
    assert terms.seconds(0, 1, 1) == pytest.approx(24)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(profiles=[P, "p"]), TypeError, r"`profiles` must be a ModelProfile or a list"),
        (dict(profiles="p"), TypeError, r"`profiles` must be a ModelProfile or a list"),
        (dict(profiles=[P]), ValueError, r"one profile per stage: 2 stages but 1 profiles"),
        (dict(profiles=[]), ValueError, r"2 stages but 0 profiles"),
        (
            dict(profiles=[P, ModelProfile([L("a", 1, 1), L("b", 1, 1), L("c", 1, 1),
                                            L("e", 1, 1)], 2, name="other")]),
            ValueError,
            r"same layers: profiles\[1\] \('other'\) differs from profiles\[0\] \('hand'\)",
        ),
        (dict(mode="async"), ValueError, r"`mode` must be one of \['sync', 'vanilla'"),
        (dict(spectrain_target="exact"), ValueError, r"`spectrain_target` must be one of"),
        (dict(batch_size=0), ValueError, r"batch_size"),
        (dict(num_stages=0), ValueError, r"num_stages"),
        (dict(micro_batches=0), ValueError, r"micro_batches"),
        (dict(bandwidth=0.0), ValueError, r"bandwidth"),
        (dict(latency=-1.0), ValueError, r"latency"),
        (dict(optimizer_slots=-1), ValueError, r"optimizer_slots"),
        (dict(relative_speed=0.0), ValueError, r"relative_speed"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    args = dict(profiles=P, batch_size=2, num_stages=2)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        StageTerms(**args)


def test_infinite_bandwidth_is_allowed_and_free():
    terms = StageTerms(P, 2, 2, mode="sync", bandwidth=math.inf)
    assert terms.estimate(0, 1, 0).send == 0.0
    assert terms.estimate(0, 1, 0).sent_bytes == 40  # b's 20 bytes/example at batch 2
