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


# --- micro-batches in every mode, the sync schedule and recomputation ---------------------

# Batch 2 on a | b c | d with LINK, as CASES: forward 1, 5, 1; backward 2, 4, 2; weights
# 100, 40, 60 (one optimizer slot each); sent 20, 10, 0 bytes. Per mini-batch: inputs kept
# 6, 20, 10 and own outputs 16, 48, 4. A micro-batch is 1 / M of each.
# Sends with M micro-batches (latency 0.5 once per micro-batch, 10 B/s):
#   M = 1: 2.5, 4.0, 1.5;  M = 2: 3, (1 + 1) + (1 + 2) = 5, 2;  M = 4: 4, 7, 3.
# In flight, in micro-batches: async N - k mini-batches of M each (3M, 2M, M); sync gpipe
# M on every stage; sync 1f1b min(3 - k, M). A stage that reuses its forward keeps
# n * (inputs + outputs) / M; one that recomputes n * inputs / M + outputs / M.
OPTION_CASES = [
    # sync, gpipe, M = 4, recompute always: every stage recomputes (1, 5, 1), the last too.
    #   (4 * 6 + 16) / 4 = 10; (4 * 20 + 48) / 4 = 32; (4 * 10 + 4) / 4 = 11
    ("sync", "paper", 4, "gpipe", "always", [4, 4, 4], [
        row(1, 2, 1, 4, 100, 100, 10, 0, 20),
        row(5, 4, 5, 7, 40, 40, 32, 0, 10),
        row(1, 2, 1, 3, 60, 60, 11, 0, 0),
    ]),
    # sync, 1f1b, M = 4: 3, 2, 1 of the 4 micro-batches in flight, reusing the forward:
    #   3 * 22 / 4 = 16.5; 2 * 68 / 4 = 34; 1 * 14 / 4 = 3.5 (gpipe: 22, 68, 14)
    ("sync", "paper", 4, "1f1b", "auto", [3, 2, 1], [
        row(1, 2, 0, 4, 100, 100, 16.5, 0, 20),
        row(5, 4, 0, 7, 40, 40, 34, 0, 10),
        row(1, 2, 0, 3, 60, 60, 3.5, 0, 0),
    ]),
    # sync, 1f1b, M = 4, recompute always: (3 * 6 + 16) / 4 = 8.5; (2 * 20 + 48) / 4 = 22;
    #   (10 + 4) / 4 = 3.5
    ("sync", "paper", 4, "1f1b", "always", [3, 2, 1], [
        row(1, 2, 1, 4, 100, 100, 8.5, 0, 20),
        row(5, 4, 5, 7, 40, 40, 22, 0, 10),
        row(1, 2, 1, 3, 60, 60, 3.5, 0, 0),
    ]),
    # vanilla, M = 4: 12, 8, 4 micro-batches in flight; stages 0 and 1 recompute:
    #   12 * 6 / 4 + 16 / 4 = 22; 8 * 20 / 4 + 48 / 4 = 52; the last reuses: 4 * 14 / 4 = 14
    ("vanilla", "paper", 4, "gpipe", "auto", [12, 8, 4], [
        row(1, 2, 1, 4, 100, 100, 22, 0, 20),
        row(5, 4, 5, 7, 40, 40, 52, 0, 10),
        row(1, 2, 0, 3, 60, 60, 14, 0, 0),
    ]),
    # stash, M = 4: the same bytes as M = 1 (3 * 22 = 66, 2 * 68 = 136, 14) and the same
    #   stashed versions (2, 1, 0 per mini-batch); only the sends pay more latency.
    ("stash", "paper", 4, "gpipe", "auto", [12, 8, 4], [
        row(1, 2, 0, 4, 100, 100, 66, 200, 20),
        row(5, 4, 0, 7, 40, 40, 136, 40, 10),
        row(1, 2, 0, 3, 60, 60, 14, 0, 0),
    ]),
    # stash, M = 1, recompute always: 3 * 6 + 16 = 34; 2 * 20 + 48 = 88; 10 + 4 = 14;
    #   the stashed versions stay (explicit copies).
    ("stash", "paper", 1, "gpipe", "always", [3, 2, 1], [
        row(1, 2, 1, 2.5, 100, 100, 34, 200, 20),
        row(5, 4, 5, 4.0, 40, 40, 88, 40, 10),
        row(1, 2, 1, 1.5, 60, 60, 14, 0, 0),
    ]),
    # consistent spectrain, M = 4, recompute always: (12 * 6 + 16) / 4 = 22;
    #   (8 * 20 + 48) / 4 = 52; (4 * 10 + 4) / 4 = 11; predicted versions 3, 2, 0 as M = 1.
    ("spectrain", "consistent", 4, "gpipe", "always", [12, 8, 4], [
        row(1, 2, 1, 4, 100, 100, 22, 300, 20),
        row(5, 4, 5, 7, 40, 40, 52, 80, 10),
        row(1, 2, 1, 3, 60, 60, 11, 0, 0),
    ]),
    # paper spectrain, M = 2, recompute always: 6, 4, 2 micro-batches in flight:
    #   (6 * 6 + 16) / 2 = 26; (4 * 20 + 48) / 2 = 64; (2 * 10 + 4) / 2 = 12
    ("spectrain", "paper", 2, "gpipe", "always", [6, 4, 2], [
        row(1, 2, 1, 3, 100, 100, 26, 100, 20),
        row(5, 4, 5, 5, 40, 40, 64, 40, 10),
        row(1, 2, 1, 2, 60, 60, 12, 60, 0),
    ]),
]


@pytest.mark.parametrize(
    "mode, target, micro, sched, recompute, in_flight, expected",
    OPTION_CASES,
    ids=[f"{c[0]}-{c[1]}-M{c[2]}-{c[3]}-{c[4]}" for c in OPTION_CASES],
)
def test_micro_batches_schedule_and_recompute_by_hand(
    mode, target, micro, sched, recompute, in_flight, expected
):
    terms = StageTerms(
        P, 2, 3, mode=mode, spectrain_target=target, micro_batches=micro, schedule=sched,
        recompute=recompute, **LINK,
    )
    assert [terms.in_flight(k) for k in range(3)] == in_flight
    for (first, last, k), want in zip(SPLIT3, expected):
        est = terms.estimate(first, last, k)
        got = {f: getattr(est, f) for f in FIELDS}
        assert got == pytest.approx(want), f"stage {k}"
        assert terms.seconds(first, last, k) == pytest.approx(est.seconds)
        assert terms.memory_bytes(first, last, k) == pytest.approx(est.memory_bytes)


def test_1f1b_keeps_at_most_n_minus_k_of_the_micro_batches():
    # N = 4 one-layer stages of P at batch 8 (4x the profile's): per mini-batch, inputs and
    # outputs kept are 3 * 8 + 8 * 8 = 88, 10 * 8 + 20 * 8 = 240, 20 * 8 + 4 * 8 = 192,
    # 5 * 8 + 2 * 8 = 56. GPipe keeps all 8 micro-batches (a whole mini-batch's bytes);
    # 1F1B-flush keeps min(4 - k, 8) = 4, 3, 2, 1 of them: 4/8, 3/8, 2/8, 1/8 of those bytes.
    split = [(k, k, k) for k in range(4)]
    gpipe = StageTerms(P, 8, 4, mode="sync", micro_batches=8, **LINK)
    flush = StageTerms(P, 8, 4, mode="sync", micro_batches=8, schedule="1f1b", **LINK)
    assert [gpipe.in_flight(k) for k in range(4)] == [8, 8, 8, 8]
    assert [flush.in_flight(k) for k in range(4)] == [4, 3, 2, 1]
    assert [gpipe.estimate(*s).activation_bytes for s in split] == pytest.approx(
        [88, 240, 192, 56]
    )
    assert [flush.estimate(*s).activation_bytes for s in split] == pytest.approx(
        [44, 90, 48, 7]
    )
    for s in split:
        g, f = gpipe.estimate(*s), flush.estimate(*s)
        assert f.activation_bytes < g.activation_bytes
        # The same time per mini-batch and the same weights, slots and stashes.
        assert f.seconds == pytest.approx(g.seconds)
        assert f.memory_bytes - f.activation_bytes == pytest.approx(
            g.memory_bytes - g.activation_bytes
        )
    # With M = 2 <= N - k on stages 0..2, 1F1B-flush keeps both micro-batches there too;
    # only the last stage (1 of 2) keeps less.
    flush2 = StageTerms(P, 8, 4, mode="sync", micro_batches=2, schedule="1f1b")
    assert [flush2.in_flight(k) for k in range(4)] == [2, 2, 2, 1]
    assert [flush2.estimate(*s).activation_bytes for s in split] == pytest.approx(
        [88, 240, 192, 28]
    )


@pytest.mark.parametrize("mode", ["sync", "vanilla", "stash", "spectrain"])
def test_recompute_always_adds_one_forward_on_every_stage(mode):
    auto = StageTerms(P, 2, 3, mode=mode, **LINK)
    always = StageTerms(P, 2, 3, mode=mode, recompute="always", **LINK)
    # forwards 1, 5, 1 (CASES): "always" pays each once more, the last stage included.
    for (first, last, k), forward in zip(SPLIT3, [1, 5, 1]):
        assert always.recomputes(k)
        assert always.estimate(first, last, k).recompute == pytest.approx(forward)
        extra = 0.0 if auto.recomputes(k) else forward
        assert always.seconds(first, last, k) == pytest.approx(
            auto.seconds(first, last, k) + extra
        )
        # The weight versions do not change; the activations never grow.
        assert always.estimate(first, last, k).stash_bytes == auto.estimate(
            first, last, k
        ).stash_bytes
        assert always.estimate(first, last, k).activation_bytes <= auto.estimate(
            first, last, k
        ).activation_bytes


def test_micro_batches_leave_asynchronous_versions_and_reusing_bytes_alone():
    for mode, target in [("stash", "paper"), ("spectrain", "consistent"),
                         ("spectrain", "paper"), ("vanilla", "paper")]:
        one = StageTerms(P, 2, 3, mode=mode, spectrain_target=target)
        four = StageTerms(P, 2, 3, mode=mode, spectrain_target=target, micro_batches=4)
        for first, last, k in SPLIT3:
            assert four.batches_in_flight(k) == one.batches_in_flight(k) == 3 - k
            assert four.in_flight(k) == 4 * one.in_flight(k)
            a, b = one.estimate(first, last, k), four.estimate(first, last, k)
            assert b.stash_bytes == a.stash_bytes
            assert b.seconds == pytest.approx(a.seconds)  # free links: no latency to pay
            if not one.recomputes(k):
                assert b.activation_bytes == pytest.approx(a.activation_bytes)


def test_two_byte_activations_halve_activation_and_hand_off_bytes_not_weights():
    # A profile as profile_model measures a mixed_float16 model: every layer's outputs
    # and hand-offs 2 bytes per element instead of 4 (the model's inputs stay float32),
    # the weights float32.
    half = ModelProfile(
        [L(x.name, x.forward_time, x.backward_time, x.output_bytes / 2, x.weight_bytes,
           x.activation_bytes / 2) for x in P.layers],
        batch_size=2, name="half", input_bytes=P.input_bytes,
    )
    for mode in ("sync", "stash", "spectrain"):
        full = StageTerms(P, 2, 3, mode=mode, optimizer_slots=2)
        mixed = StageTerms(half, 2, 3, mode=mode, optimizer_slots=2)
        for first, last, k in SPLIT3[1:]:  # stages whose inputs are hand-offs
            a, b = full.estimate(first, last, k), mixed.estimate(first, last, k)
            assert b.activation_bytes == pytest.approx(a.activation_bytes / 2)
            assert b.sent_bytes == pytest.approx(a.sent_bytes / 2)
            assert (b.param_bytes, b.optimizer_bytes, b.stash_bytes) == (
                a.param_bytes, a.optimizer_bytes, a.stash_bytes,
            )
        # Stage 0 keeps the float32 inputs (6 bytes at batch 2) and half its outputs
        # (16 -> 8): sync and stash keep both for 1 and 3 mini-batches; paper spectrain
        # recomputes: 3 inputs and one forward's outputs.
        want_full, want_mixed = {
            "sync": (6 + 16, 6 + 8), "stash": (3 * (6 + 16), 3 * (6 + 8)),
            "spectrain": (3 * 6 + 16, 3 * 6 + 8),
        }[mode]
        assert full.estimate(0, 0, 0).activation_bytes == pytest.approx(want_full)
        assert mixed.estimate(0, 0, 0).activation_bytes == pytest.approx(want_mixed)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(schedule="pipedream"), r"`schedule` must be one of \['gpipe', '1f1b'\]\. "
         r"Received: schedule='pipedream'"),
        (dict(mode="stash", schedule="1f1b"),
         r"`schedule` must be 'gpipe' unless mode='sync'.*Received: schedule='1f1b' with "
         r"mode='stash'"),
        (dict(mode="spectrain", schedule="1f1b"), r"schedule='1f1b' with mode='spectrain'"),
        (dict(recompute="never"), r"`recompute` must be one of \['auto', 'always'\]\. "
         r"Received: recompute='never'"),
        (dict(recompute=True), r"Received: recompute=True"),
        (dict(schedule=None), r"Received: schedule=None"),
    ],
)
def test_bad_schedule_and_recompute_are_refused(kwargs, match):
    args = dict(profiles=P, batch_size=2, num_stages=2, mode="sync")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        StageTerms(**args)


def test_1f1b_in_sync_and_micro_batches_in_every_mode_are_accepted():
    from tf_spectrain.schedule.options import PipelineOptions

    assert PipelineOptions("sync", "paper", 4, "1f1b", "always").micro_batches == 4
    for mode in ("vanilla", "stash", "spectrain"):
        assert PipelineOptions(mode, "paper", 3, "gpipe", "auto").micro_batches == 3
