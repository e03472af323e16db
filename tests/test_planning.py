"""Tests for tf_spectrain.costmodel.planning: `best_cuts` and `plan_partition` by hand and
against a brute-force search over every cut list, and `PartitionPlan`'s views of a plan."""

import itertools
import json
import math
import random

import pytest
from costmodel_helpers import CHAIN, L, hw

from tf_spectrain import costmodel
from tf_spectrain.costmodel import ModelProfile

# --- choosing cuts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layers, num_stages, recompute, expected",
    [
        # compute alone would cut after b (4 | 4), but b's output costs 10 s to send:
        # after a: 2.1 | 6.1, after c: 6.1 | 2.1; equal totals, the earliest wins
        ([("a", 2, 0, 1), ("b", 2, 0, 100), ("c", 2, 0, 1), ("d", 2, 0, 0)], 2, False, ["a"]),
        # cheap hand-off after the pooling layer p: 2.1 | 2.1 beats 12 | 12
        ([("a", 1, 1, 100), ("p", 0, 0, 1), ("b", 2, 0, 0)], 2, False, ["p"]),
        # free links: 2 | 2 (cut after b) beats 1 | 3
        ([("a", 1, 0, 0), ("b", 1, 0, 0), ("c", 0, 2, 0)], 2, False, ["b"]),
        # recomputing the forward on stage 0: 2 | 3 (after a) beats 4 | 2
        ([("a", 1, 0, 0), ("b", 1, 0, 0), ("c", 0, 2, 0)], 2, True, ["a"]),
        # three stages of 1 | 1 | 1
        ([("a", 1, 0, 0), ("b", 1, 0, 0), ("c", 1, 0, 0)], 3, False, ["a", "b"]),
        # a forward-heavy last layer: True (the last stage keeps its forward): after a
        # 2 | 4, after b 4 | 2, the earliest wins; "always" recomputes c too: 2 | 6, 4 | 4
        ([("a", 0, 2, 0), ("b", 0, 2, 0), ("c", 2, 0, 0)], 2, True, ["a"]),
        ([("a", 0, 2, 0), ("b", 0, 2, 0), ("c", 2, 0, 0)], 2, "always", ["b"]),
    ],
)
def test_best_cuts_by_hand(layers, num_stages, recompute, expected):
    profile = ModelProfile([L(n, f, b, out) for n, f, b, out in layers], batch_size=1)
    machine = hw(num_gpus=3, bandwidth=10.0)
    cuts = costmodel.best_cuts(profile, machine, 1, num_stages, recompute=recompute)
    assert cuts == expected


def _stage_times(profile, cuts, bandwidth, recompute):
    """Each stage's compute plus its sends, computed directly from the layers."""
    bounds = [-1] + list(cuts) + [len(profile) - 1]
    times = []
    for k in range(len(bounds) - 1):
        part = profile.layers[bounds[k] + 1 : bounds[k + 1] + 1]
        forward = sum(layer.forward_time for layer in part)
        time = forward + sum(layer.backward_time for layer in part)
        if k < len(bounds) - 2:
            time += forward * recompute + profile.layers[bounds[k + 1]].output_bytes / bandwidth
        if k > 0:
            time += profile.layers[bounds[k]].output_bytes / bandwidth
        times.append(time)
    return times


@pytest.mark.parametrize("seed", range(8))
def test_best_cuts_match_brute_force(seed):
    rng = random.Random(seed)
    size = rng.randint(3, 8)
    layers = [
        L(f"x{p}", rng.choice([0, rng.uniform(0, 3)]), rng.uniform(0, 3), rng.uniform(0, 30))
        for p in range(size)
    ]
    profile = ModelProfile(layers, batch_size=1)
    num_stages = rng.randint(1, min(4, size))
    recompute = rng.random() < 0.5
    best_key = None
    for cuts in itertools.combinations(range(size - 1), num_stages - 1):
        times = _stage_times(profile, cuts, 10.0, recompute)
        key = (max(times), sum(times))
        if best_key is None or key[0] < best_key[0] - 1e-9 or (
            abs(key[0] - best_key[0]) <= 1e-9 and key[1] < best_key[1] - 1e-9
        ):
            best_key = key
    machine = hw(num_gpus=4, bandwidth=10.0)
    got = costmodel.best_cuts(profile, machine, 1, num_stages, recompute=recompute)
    got_times = _stage_times(profile, profile.cut_positions(got), 10.0, recompute)
    assert max(got_times) == pytest.approx(best_key[0])
    assert sum(got_times) == pytest.approx(best_key[1])
    # ... and the cost model agrees on the slowest stage (no overlap, free latency).
    steady = costmodel.predict_pipeline(profile, machine, 1, got, recompute=recompute)
    assert steady.seconds_per_batch == pytest.approx(best_key[0])


def test_best_cuts_defaults_and_limits():
    machine = hw(num_gpus=3)
    assert len(costmodel.best_cuts(CHAIN, machine, 1)) == 2  # min(4 layers, 3 devices) stages
    # after l1: max(2 + 3 + 2, 3 + 5 + 2) = 10; after l2: max(4 + 5 + 0.5, 1 + 3 + 0.5) = 9.5
    assert costmodel.best_cuts(CHAIN, machine, 1, allowed=["l1", 2], num_stages=2) == ["l2"]
    with pytest.raises(ValueError, match=r"`num_stages` must be at most 3"):
        costmodel.best_cuts(CHAIN, machine, 1, num_stages=4)
    with pytest.raises(ValueError, match=r"needs 2 cut positions but only 1"):
        costmodel.best_cuts(CHAIN, machine, 1, num_stages=3, allowed=["l1"])
    with pytest.raises(ValueError, match=r"'l3' is the last layer"):
        costmodel.best_cuts(CHAIN, machine, 1, allowed=["l3"])
    with pytest.raises(TypeError, match=r"allowed='l1'"):
        costmodel.best_cuts(CHAIN, machine, 1, allowed="l1")


# --- plan_partition against a brute-force search ------------------------------------------

MIB = 2.0**20
MODES = [
    ("sync", "paper"), ("vanilla", "paper"), ("stash", "paper"),
    ("spectrain", "paper"), ("spectrain", "consistent"),
]


def _bf_stage(profiles, batch, mode, target, num_stages, first, last, k, link,
              options=("gpipe", "auto")):
    """`(seconds, memory bytes)` of layers first..last as stage k, from the layers directly
    (the rules of stage_terms' docstring and SPECTRAIN.md sections 3 and 4)."""
    bandwidth, latency, micro, slots = link
    sched, recompute = options
    prof, ref = profiles[k], profiles[0]
    part = prof.layers[first : last + 1]
    scale = batch / prof.batch_size
    forward = sum(x.forward_time for x in part) * scale
    backward = sum(x.backward_time for x in part) * scale
    recomputes = recompute == "always" or (
        (mode == "vanilla" or (mode, target) == ("spectrain", "paper")) and k < num_stages - 1
    )

    def transfer(num_bytes):
        return 0.0 if num_bytes == 0 else micro * latency + num_bytes / bandwidth

    out = ref.layers[last].output_bytes * batch if last < len(ref) - 1 else 0.0
    received = ref.layers[first - 1].output_bytes * batch if first > 0 else 0.0
    seconds = forward + backward + (forward if recomputes else 0.0)
    seconds += transfer(out) + transfer(received)
    params = sum(x.weight_bytes for x in part)
    # Mini-batches in flight (1F1B warm-up forwards), then micro-batches of batch / micro.
    in_flight = 1 if mode == "sync" else num_stages - k
    if mode == "sync" and sched == "1f1b":
        micros = min(num_stages - k, micro)
    else:
        micros = in_flight * micro
    kept = (received if first > 0 else prof.input_bytes * batch) / micro
    own = sum(x.activation_bytes for x in part) * batch / micro
    activations = micros * kept + own if recomputes else micros * (kept + own)
    s_f, s_b = k // 2 + num_stages - 1 - k, k // 2  # the paper's gaps
    if mode == "stash":
        versions = in_flight - 1
    elif (mode, target) == ("spectrain", "consistent"):
        versions = in_flight if num_stages - 1 - k > 0 else 0
    elif mode == "spectrain":
        versions = 1 if s_f or s_b else 0
    else:
        versions = 0
    return seconds, params * (1 + slots) + activations + versions * params


def _bf_plans(profiles, batch, mode, target, num_stages, link, ends, options=("gpipe", "auto")):
    """Every cut list over `ends`, with its stages' (seconds, memory)."""
    size = len(profiles[0])
    plans = []
    for cuts in itertools.combinations(ends, num_stages - 1):
        bounds = [-1, *cuts, size - 1]
        stages = [
            _bf_stage(profiles, batch, mode, target, num_stages, bounds[k] + 1, bounds[k + 1],
                      k, link, options)
            for k in range(num_stages)
        ]
        plans.append((list(cuts), stages))
    return plans


def _fits(stages, limits):
    return all(lim is None or mem <= lim for (_, mem), lim in zip(stages, limits))


def _bf_optima(plans, key):
    """The cut lists with the least max of `key`, then the least sum of it (rel. 1e-9)."""
    best = min(max(key(k, s) for k, s in enumerate(st)) for _, st in plans)
    close = [
        (c, st) for c, st in plans
        if math.isclose(max(key(k, s) for k, s in enumerate(st)), best, rel_tol=1e-9)
    ]
    total = min(sum(key(k, s) for k, s in enumerate(st)) for _, st in close)
    optima = [
        c for c, st in close
        if math.isclose(sum(key(k, s) for k, s in enumerate(st)), total, rel_tol=1e-9,
                        abs_tol=1e-12)
    ]
    return best, optima


def _random_profiles(rng, num_stages):
    size = rng.randint(num_stages, 7)
    layers = [
        L(
            f"x{p}",
            rng.choice([0.0, rng.uniform(0, 3)]),
            rng.uniform(0, 3),
            rng.choice([0.0, rng.uniform(0, 2 * MIB)]),
            rng.choice([0.0, rng.uniform(0, 4 * MIB)]),
            rng.uniform(0, MIB),
        )
        for p in range(size)
    ]
    base = ModelProfile(layers, batch_size=rng.randint(1, 4), name="rand",
                        input_bytes=rng.uniform(0, MIB))
    if rng.random() < 0.5:
        return base, [base] * num_stages
    # Stage 1 (and on) on another kind of device: every layer a different factor slower.
    other = ModelProfile(
        [
            L(x.name, x.forward_time * rng.uniform(1, 3), x.backward_time * rng.uniform(1, 3),
              x.output_bytes, x.weight_bytes, x.activation_bytes)
            for x in layers
        ],
        batch_size=base.batch_size, name="rand", input_bytes=base.input_bytes,
    )
    profiles = [base] + [other] * (num_stages - 1)
    return profiles, profiles


@pytest.mark.parametrize("mode, target", MODES)
@pytest.mark.parametrize("seed", range(8))
def test_plan_partition_matches_brute_force(seed, mode, target):
    rng = random.Random(1000 * seed + MODES.index((mode, target)))
    num_stages = rng.randint(1, 4)
    given, profiles = _random_profiles(rng, num_stages)
    size = len(profiles[0])
    batch = rng.randint(1, 8)
    bandwidth = rng.choice([math.inf, rng.uniform(0.5, 4) * MIB])
    latency = rng.choice([0.0, rng.uniform(0, 0.5)])
    micro = rng.randint(1, 5)  # any mode
    slots = rng.choice([0, 1, 2])
    link = (bandwidth, latency, micro, slots)
    options = (rng.choice(["gpipe", "1f1b"]) if mode == "sync" else "gpipe",
               rng.choice(["auto", "always"]))
    if rng.random() < 0.3 and size - 1 > num_stages - 1:
        allowed = sorted(rng.sample(range(size - 1), rng.randint(num_stages - 1, size - 1)))
    else:
        allowed = None
    ends = list(range(size - 1)) if allowed is None else allowed
    plans = _bf_plans(profiles, batch, mode, target, num_stages, link, ends, options)
    names = profiles[0].names

    # Memory limits: none; one number that leaves out about half of the cut lists (halfway
    # between two plans' peaks, not on one: sums in another order may round either way);
    # one per stage, some of them None.
    peaks = sorted(max(m for _, m in st) for _, st in plans) + [math.inf]
    middle = next(
        i for i in range((len(peaks) - 1) // 2, len(peaks) - 1) if peaks[i + 1] > peaks[i] * 1.001
    )
    number = peaks[middle] * 1.001 if math.isinf(peaks[middle + 1]) else (
        (peaks[middle] + peaks[middle + 1]) / 2
    )
    per_stage = [
        None if rng.random() < 0.35 else rng.uniform(
            min(st[k][1] for _, st in plans), max(st[k][1] for _, st in plans)
        ) * (1 + 1e-6)  # not on a plan's need when all plans agree on stage k
        for k in range(num_stages)
    ]
    for memory_limit in (None, number, per_stage):
        limits = (
            [memory_limit] * num_stages if not isinstance(memory_limit, list) else memory_limit
        )
        fitting = [(c, st) for c, st in plans if _fits(st, limits)]
        kwargs = dict(
            mode=mode, spectrain_target=target, micro_batches=micro, bandwidth=bandwidth,
            latency=latency, memory_limit=memory_limit, optimizer_slots=slots,
            allowed=None if allowed is None else [names[p] for p in allowed],
            schedule=options[0], recompute=options[1],
        )
        if not fitting:
            with pytest.raises(costmodel.MemoryLimitError) as info:
                costmodel.plan_partition(given, num_stages, batch, **kwargs)
            # It names the plan with the least largest need relative to its limit.
            _, least = _bf_optima(
                plans, lambda k, s, lim=limits: 0.0 if lim[k] is None else s[1] / lim[k]
            )
            assert f"cuts={[names[p] for p in min(least)]}, needs" in str(info.value)
            continue
        best, optima = _bf_optima(fitting, lambda k, s: s[0])
        plan = costmodel.plan_partition(given, num_stages, batch, **kwargs)
        got = profiles[0].cut_positions(plan.cuts)
        assert plan.seconds_per_batch == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert got in optima, (memory_limit, got, optima)
        assert got == min(optima)  # ties go to the earliest cuts
        # The plan's stages are the brute force's prices of its cuts.
        stages = dict((tuple(c), st) for c, st in plans)[tuple(got)]
        assert [s.seconds for s in plan.stages] == pytest.approx([t for t, _ in stages])
        assert [s.memory_bytes for s in plan.stages] == pytest.approx([m for _, m in stages])
        assert all(lim is None or s.memory_bytes <= lim for s, lim in zip(plan.stages, limits))
        assert list(plan.memory_limits) == limits


def test_memory_limit_error_names_the_least_memory_plan():
    # Weights of 8, 2, 2, 8 MiB, nothing else (sync, SGD without slots, no activations):
    # the least memory per stage is max over {8 | 12}, {10 | 10}, {12 | 8} -> after l1.
    layers = [L(f"l{p}", 1, 1, 0.0, w * MIB) for p, w in enumerate([8, 2, 2, 8])]
    profile = ModelProfile(layers, batch_size=1, name="weights")
    with pytest.raises(costmodel.MemoryLimitError) as info:
        costmodel.plan_partition(
            profile, 2, 1, mode="sync", memory_limit=9 * MIB, optimizer_slots=0
        )
    message = str(info.value)
    assert "No cuts of model 'weights' into 2 stages fit `memory_limit` in mode 'sync'" in message
    assert (
        "cuts=['l1'], needs stage 0: 10.0 MiB (limit 9.0 MiB); stage 1: 10.0 MiB "
        "(limit 9.0 MiB)" in message
    )
    assert isinstance(info.value, ValueError)
    # Stage 0 may hold 9 MiB, stage 1 20: only the cut after l0 (8 | 12) fits.
    plan = costmodel.plan_partition(
        profile, 2, 1, mode="sync", memory_limit=[9 * MIB, 20 * MIB], optimizer_slots=0
    )
    assert plan.cuts == ["l0"]
    # Stage 0 unlimited, stage 1 at most 7 MiB: nothing fits; the least-ratio plan puts
    # only l3 (8 MiB) on stage 1 and says stage 0 has no limit.
    with pytest.raises(costmodel.MemoryLimitError) as info:
        costmodel.plan_partition(
            profile, 2, 1, mode="sync", memory_limit=[None, 7 * MIB], optimizer_slots=0
        )
    assert (
        "cuts=['l2'], needs stage 0: 12.0 MiB (no limit); stage 1: 8.0 MiB (limit 7.0 MiB)"
        in str(info.value)
    )


def test_memory_limit_picks_another_plan_with_1f1b_than_with_gpipe():
    # sync, 2 stages, 4 micro-batches, nothing but x0's and x1's 20 bytes of outputs per
    # example (batch 1) and 2 s per layer. The balanced cut after x1 (4 | 4 s) puts 40
    # bytes on stage 0: GPipe keeps all 4 micro-batches (40 > 30); 1F1B-flush keeps
    # min(2 - 0, 4) = 2 of them: 40 * 2 / 4 = 20. GPipe has to cut after x0 (2 | 6 s, 20
    # and 20 bytes); 1F1B-flush keeps the balanced cut.
    profile = ModelProfile(
        [L("x0", 1, 1, 0, 0, 20), L("x1", 1, 1, 0, 0, 20), L("x2", 1, 1), L("x3", 1, 1)],
        batch_size=1, name="acts",
    )
    kwargs = dict(mode="sync", micro_batches=4, optimizer_slots=0)
    assert costmodel.plan_partition(profile, 2, 1, **kwargs).cuts == ["x1"]  # no limit
    gpipe = costmodel.plan_partition(profile, 2, 1, memory_limit=30, **kwargs)
    flush = costmodel.plan_partition(profile, 2, 1, memory_limit=30, schedule="1f1b", **kwargs)
    assert gpipe.cuts == ["x0"] and flush.cuts == ["x1"]
    assert [s.activation_bytes for s in gpipe.stages] == pytest.approx([20, 20])
    assert [s.activation_bytes for s in flush.stages] == pytest.approx([20, 0])
    assert gpipe.seconds_per_batch == pytest.approx(6) and flush.seconds_per_batch == (
        pytest.approx(4)
    )
    # The plan says what it was planned for.
    assert (flush.micro_batches, flush.schedule, flush.recompute) == (4, "1f1b", "auto")
    data = flush.to_dict()
    assert (data["micro_batches"], data["schedule"], data["recompute"]) == (4, "1f1b", "auto")
    assert "mode 'sync', 4 micro-batches, schedule '1f1b', batch 1" in str(flush)
    # Under 20 bytes nothing fits either way, and the message says what could help.
    with pytest.raises(costmodel.MemoryLimitError) as info:
        costmodel.plan_partition(profile, 2, 1, memory_limit=15, **kwargs)
    assert "schedule='1f1b'" in str(info.value) and "recompute='always'" in str(info.value)
    # ... and leaves out what is already planned for, or not allowed in the mode.
    for mode, extra in [("sync", dict(schedule="1f1b", recompute="always")),
                        ("stash", dict())]:
        with pytest.raises(costmodel.MemoryLimitError) as info:
            costmodel.plan_partition(profile, 2, 1, mode=mode, memory_limit=5,
                                     optimizer_slots=0, **extra)
        assert "schedule=" not in str(info.value), mode
        assert ("recompute='always'" in str(info.value)) is (mode == "stash")


def test_memory_limit_picks_another_plan_with_recompute_always():
    # stash, 2 stages: stage 0 holds 2 mini-batches. x0 and x1 output 20 bytes each (kept
    # for the backward), nothing crosses a cut. After x1 (2 | 2 s of compute), stage 0
    # keeps 2 * 40 = 80 > 50 bytes; after x0, 2 * 20 = 40 and 20. With recompute="always"
    # it keeps only the (empty) inputs plus one forward's outputs: 40; every stage then
    # also pays its forward again (3 | 3 s after x1, 1.5 | 4.5 s after x0).
    profile = ModelProfile(
        [L("x0", 0.5, 0.5, 0, 0, 20), L("x1", 0.5, 0.5, 0, 0, 20), L("x2", 0.5, 0.5),
         L("x3", 0.5, 0.5)],
        batch_size=1, name="acts",
    )
    kwargs = dict(mode="stash", optimizer_slots=0, memory_limit=50)
    auto = costmodel.plan_partition(profile, 2, 1, **kwargs)
    always = costmodel.plan_partition(profile, 2, 1, recompute="always", **kwargs)
    assert auto.cuts == ["x0"] and always.cuts == ["x1"]
    assert [s.activation_bytes for s in auto.stages] == pytest.approx([40, 20])
    assert [s.activation_bytes for s in always.stages] == pytest.approx([40, 0])
    assert [s.seconds for s in auto.stages] == pytest.approx([1, 3])
    assert [s.seconds for s in always.stages] == pytest.approx([3, 3])
    assert "recompute 'always'" in str(always)


@pytest.mark.parametrize(
    "mode, cuts, seconds, sends",
    [
        # after l0: 1 + 2 + 4 = 7 | 4 + 6 + 4 = 14; after l1: 2 + 3 + 5 = 10 | 3 + 5 + 5 = 13;
        # after l2: 4 + 5 + 3.5 = 12.5 | 1 + 3 + 3.5 = 7.5
        ("stash", ["l2"], [12.5, 7.5], [3.5, 3.5]),
        # stage 0 recomputes its forward: after l0: 8 | 14; after l1: 12 | 13; after l2:
        # 16.5 | 7.5
        ("vanilla", ["l1"], [12, 13], [5, 5]),
        ("spectrain", ["l1"], [12, 13], [5, 5]),
    ],
)
def test_micro_batches_plan_in_asynchronous_modes(mode, cuts, seconds, sends):
    # Async modes take micro-batches too: each hand-off pays the latency per micro-batch.
    # CHAIN (f, b: 1, 2 | 1, 1 | 2, 2 | 1, 3; bytes per example after l0, l1, l2: 10, 20,
    # 5) at batch 1 on 2 stages, 10 B/s, latency 1 s, M = 3: a hand-off after l0 takes
    # 3 * 1 + 10 / 10 = 4, after l1 3 + 2 = 5, after l2 3 + 0.5 = 3.5.
    plan = costmodel.plan_partition(
        CHAIN, 2, 1, mode=mode, micro_batches=3, bandwidth=10.0, latency=1.0
    )
    assert plan.cuts == cuts
    assert [s.seconds for s in plan.stages] == pytest.approx(seconds)
    assert [s.send for s in plan.stages] == pytest.approx(sends)
    assert plan.micro_batches == 3


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(memory_limit=[1.0]), ValueError, r"a list of one per stage \(2\)"),
        (dict(memory_limit=0), ValueError, r"memory_limit"),
        (dict(memory_limit=[1.0, -1.0]), ValueError, r"memory_limit"),
        (dict(num_stages=5), ValueError, r"at most the number of layers \(4\)"),
        (dict(mode="pipe"), ValueError, r"`mode` must be one of"),
        (dict(allowed="l1"), TypeError, r"allowed='l1'"),
        (dict(num_stages=3, allowed=["l1"]), ValueError, r"needs 2 cut positions but only 1"),
        (dict(schedule="pipedream"), ValueError, r"Received: schedule='pipedream'"),
        (dict(schedule="1f1b", mode="vanilla"), ValueError,
         r"`schedule` must be 'gpipe' unless mode='sync'.*schedule='1f1b' with mode='vanilla'"),
        (dict(recompute="sometimes"), ValueError, r"Received: recompute='sometimes'"),
        (dict(micro_batches=0), ValueError, r"micro_batches=0"),
    ],
)
def test_plan_partition_rejects_bad_arguments(kwargs, error, match):
    args = dict(profile=CHAIN, num_stages=2, batch_size=1)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        costmodel.plan_partition(**args)


# --- PartitionPlan ------------------------------------------------------------------------


def test_partition_plan_properties():
    # CHAIN's f + b: l0 3, l1 2, l2 4, l3 4; sync on 3 stages with free links. The three cut
    # lists: l0 | l1 | l2 l3 = 3 | 2 | 8, l0 | l1 l2 | l3 = 3 | 6 | 4, l0 l1 | l2 | l3 =
    # 5 | 4 | 4: the last is best (slowest stage 5, stage 0).
    plan = costmodel.plan_partition(
        CHAIN, 3, 1, mode="sync", devices=["/CPU:0", "/CPU:1", "/CPU:2"], profile_seconds=1.5
    )
    assert plan.cuts == ["l1", "l2"]
    assert plan.num_stages == 3
    assert [s.seconds for s in plan.stages] == pytest.approx([5, 4, 4])
    assert plan.bottleneck == 0
    assert plan.seconds_per_batch == pytest.approx(5)
    assert plan.balance == pytest.approx(5 / (13 / 3))
    assert [plan.stage_layers(k) for k in range(3)] == [["l0", "l1"], ["l2"], ["l3"]]

    data = json.loads(json.dumps(plan.to_dict()))
    assert data["cuts"] == ["l1", "l2"] and data["bottleneck"] == 0
    assert data["model"] == "chain" and data["mode"] == "sync" and data["batch_size"] == 1
    assert [r["first_layer"] for r in data["stages"]] == ["l0", "l2", "l3"]
    assert [r["last_layer"] for r in data["stages"]] == ["l1", "l2", "l3"]
    assert [r["device"] for r in data["stages"]] == ["/CPU:0", "/CPU:1", "/CPU:2"]
    assert [r["measured_seconds"] for r in data["stages"]] == [None] * 3
    assert [r["param_bytes"] for r in data["stages"]] == [100, 40, 60]

    text = str(plan)
    lines = text.splitlines()
    assert len(lines) == 2 + 3  # header, column names, one row per stage
    assert "3 stages" in lines[0] and "stage 0 is the bottleneck" in lines[0]
    assert "profiling took 1.5 s" in lines[0]
    rows = lines[2:]
    assert [r.split()[0] for r in rows] == ["0*", "1", "2"]
    assert "l0 .. l1" in rows[0] and "/CPU:1" in rows[1] and "l3 .. l3" in rows[2]


def test_partition_plan_bottleneck_moves_with_the_slowest_stage():
    # One layer far slower than the rest ends up alone on its stage, which is the bottleneck.
    profile = ModelProfile(
        [L("a", 1, 1), L("b", 1, 1), L("slow", 10, 10), L("c", 1, 1)], batch_size=1
    )
    plan = costmodel.plan_partition(profile, 3, 1, mode="sync")
    assert plan.stage_layers(plan.bottleneck) == ["slow"]
    assert plan.seconds_per_batch == pytest.approx(20)
    text = str(plan).splitlines()
    marked = [r for r in text[2:] if r.split()[0].endswith("*")]
    assert len(marked) == 1 and "slow .. slow" in marked[0]
    # Balanced within tolerance: a one-stage plan has balance 1.
    assert costmodel.plan_partition(profile, 1, 1).balance == pytest.approx(1.0)


@pytest.mark.parametrize(
    "weight_bytes, limit, expected",
    [
        (60.0, 50.0, "needs stage 0: 60 bytes (limit 50 bytes)"),
        (3 * 2**10, 2**10, "needs stage 0: 3.0 KiB (limit 1.0 KiB)"),
        (5 * 2**30, 2**30, "needs stage 0: 5.0 GiB (limit 1.0 GiB)"),
    ],
)
def test_memory_limit_error_picks_a_readable_unit(weight_bytes, limit, expected):
    profile = ModelProfile([L("a", 1, 1, 0, weight_bytes), L("b", 1, 1, 0, 0)], batch_size=1)
    with pytest.raises(costmodel.MemoryLimitError) as info:
        costmodel.plan_partition(profile, 1, 1, mode="sync", memory_limit=limit,
                                 optimizer_slots=0)
    assert expected in str(info.value)
