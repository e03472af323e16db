"""The cost model prices modes "nesterov" and "2bw" (SPECTRAIN.md 6e): tables by hand, the
planner's `memory_limit` against a brute force, and the plan's tables and hints.

- `nesterov`: weights as `stash` (`N - k - 1` stashed versions on stage k), the same
  time, and its optimizer's Nesterov form has the same slots (plain SGD gets a momentum on
  every stage but the last).
- `2bw`: weights as `stash`, but one update per `A >= N` mini-batches: at most one stashed
  version beside the current weights on every stage (none on the last), whatever N, plus
  one gradient-sized sum held between updates; the time of `stash` (no flush).
"""

import itertools
import random

import pytest
from costmodel_helpers import CHAIN, L

from benchmarks import memory as memory_script
from tf_spectrain import costmodel
from tf_spectrain.costmodel import ModelProfile, StageTerms
from tf_spectrain.costmodel.run_plan import RunPlan, memory_hints
from tf_spectrain.schedule.options import PipelineOptions

MIB = 2.0**20
STASH_LIKE = ("stash", "nesterov", "2bw")


def one_layer_per_stage(n, weight=10.0):
    """`n` layers of `weight` bytes each, priced one per stage."""
    return ModelProfile([L(f"l{p}", 1, 1, 1.0, weight) for p in range(n)], batch_size=1)


def per_stage(terms, field):
    return [getattr(terms.estimate(k, k, k), field) for k in range(terms.num_stages)]


# --- weight versions, by hand --------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_2bw_prices_two_weight_versions_per_stage_whatever_n(n):
    profile = one_layer_per_stage(n)
    stash = StageTerms(profile, 1, n, mode="stash")
    two = StageTerms(profile, 1, n, mode="2bw")
    # stash: stage k holds N - k mini-batches, one version each (the newest is current).
    assert per_stage(stash, "weight_versions") == [n - k for k in range(n)]
    assert per_stage(stash, "stash_bytes") == [10.0 * (n - k - 1) for k in range(n)]
    # 2bw: the current weights and one older version; the last stage's one mini-batch in
    # flight runs at the current weights.
    assert per_stage(two, "weight_versions") == [2] * (n - 1) + [1]
    assert per_stage(two, "stash_bytes") == [10.0] * (n - 1) + [0.0]
    assert max(per_stage(two, "weight_versions")) == 2
    # ... and one gradient-sized sum on every stage (A = N > 1 mini-batches per update).
    assert two.updates_every == n
    assert per_stage(two, "gradient_bytes") == [10.0] * n
    assert per_stage(stash, "gradient_bytes") == [0.0] * n


@pytest.mark.parametrize("n, accumulate", [(2, 2), (2, 5), (4, 4), (4, 9), (8, 8), (8, 16)])
def test_2bw_versions_do_not_depend_on_accumulate(n, accumulate):
    profile = one_layer_per_stage(n)
    terms = StageTerms(profile, 1, n, mode="2bw", accumulate=accumulate)
    assert terms.updates_every == accumulate
    assert [terms.stashed_versions(k) for k in range(n)] == [1] * (n - 1) + [0]
    assert terms.gradient_buffers() == 1
    options = PipelineOptions(mode="2bw", accumulate=accumulate)
    same = StageTerms(profile, 1, n, options=options)
    assert [same.estimate(k, k, k) for k in range(n)] == [
        terms.estimate(k, k, k) for k in range(n)]


def test_2bw_on_one_stage_holds_a_sum_only_when_it_accumulates():
    one = StageTerms(CHAIN, 1, 1, mode="2bw")  # A = N = 1: an update per mini-batch
    assert one.updates_every == 1 and one.gradient_buffers() == 0
    est = one.estimate(0, 3, 0)
    assert (est.stash_bytes, est.gradient_bytes) == (0.0, 0.0)
    summing = StageTerms(CHAIN, 1, 1, mode="2bw", accumulate=3)
    est = summing.estimate(0, 3, 0)
    assert (est.stash_bytes, est.gradient_bytes) == (0.0, 200.0)  # CHAIN's 200 weight bytes


@pytest.mark.parametrize("n, accumulate", [(2, 1), (4, 3), (8, 7)])
def test_2bw_refuses_fewer_mini_batches_per_update_than_stages(n, accumulate):
    profile = one_layer_per_stage(8)
    with pytest.raises(ValueError, match=r"at least the number of stages .* two"):
        StageTerms(profile, 1, n, mode="2bw", accumulate=accumulate)
    with pytest.raises(ValueError, match=r"at least the number of stages"):
        costmodel.plan_partition(profile, n, 1, mode="2bw", accumulate=accumulate)
    with pytest.raises(ValueError, match=r"mini-batches per update of mode '2bw'"):
        StageTerms(profile, 1, n, mode="stash", accumulate=n)


# --- nesterov is stash, 2bw is stash in time ----------------------------------------------

SPLITS = {2: [(0, 1, 0), (2, 3, 1)], 3: [(0, 0, 0), (1, 2, 1), (3, 3, 2)],
          4: [(k, k, k) for k in range(4)]}


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("micro, recompute", [(1, "auto"), (3, "auto"), (2, "always")])
def test_nesterov_is_priced_as_stash(n, slots, micro, recompute):
    kwargs = dict(bandwidth=10.0, latency=0.5, optimizer_slots=slots, micro_batches=micro,
                  recompute=recompute)
    stash = StageTerms(CHAIN, 4, n, mode="stash", **kwargs)
    nesterov = StageTerms(CHAIN, 4, n, mode="nesterov", **kwargs)
    for first, last, k in SPLITS[n]:
        assert nesterov.estimate(first, last, k) == stash.estimate(first, last, k)
        assert nesterov.memory_bytes(first, last, k) == stash.memory_bytes(first, last, k)
        assert nesterov.seconds(first, last, k) == stash.seconds(first, last, k)


def test_nesterov_gives_plain_sgd_a_momentum_slot_on_delayed_stages():
    # SGD without momentum (0 slots) becomes Nesterov SGD with momentum s_k * 0.99 / N:
    # one slot on every stage but the last (s = 0 keeps momentum 0, so no slot).
    profile = one_layer_per_stage(4)
    nesterov = StageTerms(profile, 1, 4, mode="nesterov", optimizer_slots=0)
    assert per_stage(nesterov, "optimizer_bytes") == [10.0, 10.0, 10.0, 0.0]
    stash = StageTerms(profile, 1, 4, mode="stash", optimizer_slots=0)
    assert per_stage(stash, "optimizer_bytes") == [0.0] * 4
    for k in range(4):
        assert nesterov.memory_bytes(k, k, k) == nesterov.estimate(k, k, k).memory_bytes


@pytest.mark.parametrize("micro, recompute", [(1, "auto"), (4, "auto"), (2, "always")])
def test_2bw_runs_in_the_time_of_stash(micro, recompute):
    kwargs = dict(bandwidth=10.0, latency=0.5, micro_batches=micro, recompute=recompute)
    stash = StageTerms(CHAIN, 4, 3, mode="stash", **kwargs)
    two = StageTerms(CHAIN, 4, 3, mode="2bw", **kwargs)
    for first, last, k in SPLITS[3]:
        a, b = stash.estimate(first, last, k), two.estimate(first, last, k)
        assert (b.forward, b.backward, b.recompute, b.send, b.seconds) == (
            a.forward, a.backward, a.recompute, a.send, a.seconds)
        assert (b.activation_bytes, b.param_bytes, b.optimizer_bytes) == (
            a.activation_bytes, a.param_bytes, a.optimizer_bytes)
        assert two.recomputes(k) is stash.recomputes(k) is (recompute == "always")
        assert two.in_flight(k) == stash.in_flight(k) == (3 - k) * micro


# --- memory_limit: the planner against a brute force -------------------------------------


def _bf_memory(profile, batch, mode, n, first, last, k, slots, micro, recompute):
    """Stage memory from the rules of SPECTRAIN.md 6e and stage_terms' docstring, directly."""
    part = profile.layers[first:last + 1]
    params = sum(x.weight_bytes for x in part)
    delay = n - 1 - k
    if mode == "nesterov" and delay > 0:
        slots = max(slots, 1)
    versions = {"stash": delay, "nesterov": delay, "2bw": min(delay, 1)}[mode]
    gradient = 1 if mode == "2bw" else 0  # A = N > 1 (n >= 2 here)
    inputs = (profile.layers[first - 1].output_bytes if first else profile.input_bytes) * batch
    own = sum(x.activation_bytes for x in part) * batch
    micros = (n - k) * micro
    if recompute == "always":
        acts = micros * inputs / micro + own / micro
    else:
        acts = micros * (inputs + own) / micro
    return params * (1 + slots + versions + gradient) + acts


def _bf_plan(profile, batch, mode, n, limit, slots, micro, recompute):
    """The least slowest-stage time over every cut list that fits, or None."""
    terms = StageTerms(profile, batch, n, mode=mode, optimizer_slots=slots,
                       micro_batches=micro, recompute=recompute)
    best = None
    for cuts in itertools.combinations(range(len(profile) - 1), n - 1):
        bounds = [-1, *cuts, len(profile) - 1]
        stages = [(bounds[k] + 1, bounds[k + 1], k) for k in range(n)]
        memories = [terms.memory_bytes(*s) for s in stages]  # the planner's own sums
        for s, m in zip(stages, memories):
            assert m == pytest.approx(
                _bf_memory(profile, batch, mode, n, *s, slots, micro, recompute))
            assert terms.estimate(*s).memory_bytes == pytest.approx(m)
        if max(memories) > limit:
            continue
        pace = max(terms.seconds(*s) for s in stages)
        best = pace if best is None else min(best, pace)
    return best


@pytest.mark.parametrize("mode", STASH_LIKE)
@pytest.mark.parametrize("seed", range(6))
def test_memory_limit_planning_matches_brute_force(mode, seed):
    rng = random.Random(seed * 10 + STASH_LIKE.index(mode))
    n = rng.randint(2, 4)
    size = rng.randint(n, 7)
    layers = [L(f"x{p}", rng.uniform(0.1, 2), rng.uniform(0.1, 3), rng.uniform(0, 1) * MIB,
                rng.choice([0.0, rng.uniform(0, 4) * MIB]), rng.uniform(0, 1) * MIB)
              for p in range(size)]
    profile = ModelProfile(layers, batch_size=1, name="rand", input_bytes=0.5 * MIB)
    slots, micro = rng.choice([0, 1, 2]), rng.randint(1, 3)
    recompute = rng.choice(["auto", "always"])
    unlimited = costmodel.plan_partition(profile, n, 2, mode=mode, optimizer_slots=slots,
                                         micro_batches=micro, recompute=recompute)
    need = max(s.memory_bytes for s in unlimited.stages)
    for limit in (need * 2, need, need * rng.uniform(0.3, 1.0), need * 0.05):
        want = _bf_plan(profile, 2, mode, n, limit, slots, micro, recompute)
        kwargs = dict(mode=mode, optimizer_slots=slots, micro_batches=micro,
                      recompute=recompute, memory_limit=limit)
        if want is None:
            with pytest.raises(costmodel.MemoryLimitError, match=f"in mode '{mode}'"):
                costmodel.plan_partition(profile, n, 2, **kwargs)
            continue
        plan = costmodel.plan_partition(profile, n, 2, **kwargs)
        assert all(s.memory_bytes <= limit for s in plan.stages)
        assert plan.seconds_per_batch == pytest.approx(want)


def test_memory_limit_fits_2bw_where_stash_and_nesterov_do_not():
    # Four stages, one 8 MiB layer each, SGD with momentum (1 slot), no activations. Stage 0
    # needs 8 * (1 + 1 + 3) = 40 MiB in stash and nesterov, 8 * (1 + 1 + 1 + 1) = 32 MiB in
    # 2bw (one stashed version and the gradient sum). Under 36 MiB only 2bw fits.
    profile = ModelProfile([L(f"l{p}", 1, 1, 0.0, 8 * MIB) for p in range(4)], batch_size=1,
                           name="weights")
    for mode in ("stash", "nesterov"):
        plan = costmodel.plan_partition(profile, 4, 1, mode=mode, memory_limit=40 * MIB)
        assert [s.memory_bytes / MIB for s in plan.stages] == [40, 32, 24, 16]
        with pytest.raises(costmodel.MemoryLimitError) as info:
            costmodel.plan_partition(profile, 4, 1, mode=mode, memory_limit=36 * MIB)
        assert f"in mode '{mode}'" in str(info.value)
        assert "stage 0: 40.0 MiB (limit 36.0 MiB)" in str(info.value)
        assert "mode '2bw' (at most one stashed weight version per stage)" in str(info.value)
    plan = costmodel.plan_partition(profile, 4, 1, mode="2bw", memory_limit=36 * MIB)
    assert plan.cuts == ["l0", "l1", "l2"]
    assert [s.memory_bytes / MIB for s in plan.stages] == [32, 32, 32, 24]
    with pytest.raises(costmodel.MemoryLimitError) as info:
        costmodel.plan_partition(profile, 4, 1, mode="2bw", memory_limit=31 * MIB)
    assert "mode '2bw' (at most" not in str(info.value)  # already planned for


def test_2bw_pays_for_its_gradient_sum_on_two_and_three_stages():
    # At N = 2, 3 stash keeps at most 2 versions beside the current weights on stage 0,
    # 2bw one and a gradient sum: 2bw never needs less, so the hint is left out there.
    for n in (2, 3):
        profile = one_layer_per_stage(n, 8 * MIB)
        stash = StageTerms(profile, 1, n, mode="stash")
        two = StageTerms(profile, 1, n, mode="2bw")
        for k in range(n):
            assert two.memory_bytes(k, k, k) >= stash.memory_bytes(k, k, k)
        with pytest.raises(costmodel.MemoryLimitError) as info:
            costmodel.plan_partition(profile, n, 1, mode="stash", memory_limit=MIB)
        assert "mode '2bw'" not in str(info.value)


# --- what the plan shows ------------------------------------------------------------------


def test_plan_partition_takes_the_options_planned_for_2bw():
    options = PipelineOptions(mode="2bw", accumulate=6, micro_batches=2)
    plan = costmodel.plan_partition(CHAIN, 3, 4, **options.planned())
    assert (plan.mode, plan.accumulate, plan.updates_every) == ("2bw", 6, 6)
    assert "mode '2bw', 2 micro-batches, one update per 6 mini-batches, batch 4" in str(plan)
    assert str(plan).splitlines()[1].split()[-3:] == ["grad.", "sum", "MiB"]
    rows = str(plan).splitlines()[2:]
    assert [float(r.split()[-1]) for r in rows] == [
        pytest.approx(s.gradient_bytes / MIB, abs=0.005) for s in plan.stages]
    data = plan.to_dict()
    assert data["updates_every"] == 6
    assert [r["gradient_bytes"] for r in data["stages"]] == [s.param_bytes for s in plan.stages]
    assert [r["memory_bytes"] for r in data["stages"]] == [s.memory_bytes for s in plan.stages]
    default = costmodel.plan_partition(CHAIN, 3, 4, **PipelineOptions(mode="2bw").planned())
    assert default.accumulate is None and default.updates_every == 3
    stash = costmodel.plan_partition(CHAIN, 3, 4, **PipelineOptions(mode="stash").planned())
    assert stash.updates_every == 1 and "grad." not in str(stash)
    assert "one update per" not in str(stash)


def test_run_plan_table_and_problems_show_the_gradient_sum():
    profile = one_layer_per_stage(4, 8 * MIB)
    plan = costmodel.plan_partition(profile, 4, 1, mode="2bw")
    run = RunPlan(plan, device_memory=(None,) * 4, memory_limit=(30 * MIB,) * 4)
    table = run.memory_table().splitlines()
    columns = table[0].split()
    assert columns[:8] == ["stage", "device", "weights", "optim.", "activ.", "stash", "grad.",
                           "sum"]
    cells = table[1].split()
    assert cells[2:8] == ["8.00", "8.00", "0.00", "8.00", "8.00", "32.00"]
    assert run.over == [0, 1, 2]
    (first, *_) = run.problems()
    assert "stashed weights 8.0 MiB, gradient sum 8.0 MiB) but the memory_limit" in first
    stash = RunPlan(costmodel.plan_partition(profile, 4, 1, mode="stash"), (None,) * 4,
                    (30 * MIB,) * 4)
    assert "grad." not in stash.memory_table() and "gradient sum" not in stash.problems()[0]


@pytest.mark.parametrize("mode, n, suggested", [
    ("stash", 4, True), ("nesterov", 8, True), ("stash", 3, False), ("2bw", 4, False),
    ("spectrain", 4, False), ("sync", 4, False),
])
def test_memory_hints_suggest_2bw_where_it_keeps_less(mode, n, suggested):
    plan = costmodel.PartitionPlan(names=(), stages=(None,) * n, batch_size=1, mode=mode)
    assert ("mode='2bw' (at most one stashed weight version per stage)" in memory_hints(plan)
            ) is suggested
    assert ("--mode 2bw (at most one stashed weight version per stage)"
            in memory_hints(plan, flags=True)) is suggested


# --- the memory benchmark's closed forms are the planner's ---------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("name", list(memory_script.MODES))
def test_memory_benchmark_prices_weight_copies_as_the_planner(name, n):
    mode, target, order = memory_script.MODES[name]
    terms = StageTerms(one_layer_per_stage(n), 1, n, mode=mode, spectrain_target=target,
                       schedule=order)
    assert memory_script.expected_weight_copies(name, n) == [
        terms.stashed_versions(k) for k in range(n)]


def test_memory_benchmark_table_shows_measured_and_priced_copies():
    import argparse

    stages = [{"weights": 2**20, "slots": 2**20, "in_flight": 2**20, "micro_batches": c,
               "peak": 3 * 2**20, "weight_copies": w} for c, w in zip([8, 6, 4, 2], [1, 1, 1, 0])]
    out = {"steady": 10.0, "cores": 1.0, "rss_mb": 900.0, "stage_memory": stages}
    old = {**out, "stage_memory": [{k: v for k, v in s.items() if k != "weight_copies"}
                                   for s in stages]}
    args = argparse.Namespace(stages=[4, 8], micro_batches=2)
    lines = memory_script.memory_table({("2bw", "always"): out, ("stash", "auto"): old},
                                       args, 4).splitlines()
    assert lines[0].endswith("| weight copies per stage (measured; priced) |")
    assert lines[2].startswith("| 2bw | always | 8 / 6 / 4 / 2 (as scheduled) |")
    assert lines[2].endswith("| 1 / 1 / 1 / 0; 1 / 1 / 1 / 0 |")
    assert lines[3].endswith("| -; 3 / 2 / 1 / 0 |")
