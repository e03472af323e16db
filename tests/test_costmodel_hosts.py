"""Tests for the cost model on several hosts and for data x pipeline hybrids: the inter-host
link, hops that cross hosts, ring all-reduces over hosts (and shared network cards), the
pipeline across hosts and `predict_hybrid`, each worked out by hand; R = 1 and N = 1 reduce
to the pipeline and to data parallelism; a faster inter-host link is never slower; and the
pure parts of benchmarks/hosts_predict.py. All pure Python."""

import json
import math
import random

import pytest
import test_costmodel
from costmodel_helpers import CHAIN, L

from benchmarks import hosts_predict
from tf_spectrain import costmodel
from tf_spectrain.costmodel import Hardware, ModelProfile, StageTerms


def hosts(num_gpus=4, num_hosts=2, bandwidth=10.0, latency=0.5, inter=(2.0, 1.0), **kw):
    """`num_hosts` hosts, intra-host link (bandwidth, latency), inter-host link `inter`."""
    return Hardware(num_gpus, 1.0, bandwidth, latency, num_hosts=num_hosts,
                    inter_host_bandwidth=inter[0], inter_host_latency=inter[1], **kw)


@pytest.mark.parametrize("module", ["hardware", "predict", "simulate", "stage_terms", "planning"])
def test_the_extended_modules_stay_pure(module):
    test_costmodel.test_pure_modules_import_no_tensorflow(module)


# --- Hardware: hosts, links, crossings ----------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_hosts=3), ValueError, r"must divide `num_gpus`.*num_hosts=3, num_gpus=4"),
        (dict(num_hosts=0), ValueError, r"num_hosts=0"),
        (dict(num_hosts=True), TypeError, r"num_hosts=True"),
        (dict(inter_host_bandwidth=None), ValueError, r"`inter_host_bandwidth` is required"),
        (dict(inter_host_latency=None), ValueError, r"`inter_host_latency` is required"),
        (dict(inter_host_bandwidth=0), ValueError, r"3.125e9.*inter_host_bandwidth=0"),
        (dict(inter_host_bandwidth="fast"), TypeError, r"inter_host_bandwidth='fast'"),
        (dict(inter_host_latency=-1e-6), ValueError, r"inter_host_latency=-1e-06"),
        (dict(nics_per_host=0), ValueError, r"nics_per_host=0"),
        (dict(nics_per_host=1.5), TypeError, r"nics_per_host=1.5"),
    ],
)
def test_hosts_reject_bad_arguments(kwargs, error, match):
    args = dict(num_gpus=4, num_hosts=2, inter_host_bandwidth=3e9, inter_host_latency=5e-5)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        Hardware(**args)


def test_one_host_needs_no_inter_host_link_and_replace_adds_hosts():
    assert Hardware(4).num_hosts == 1 and Hardware(4).gpus_per_host == 4
    eight = costmodel.PCIE3_X16.replace(
        num_gpus=8, num_hosts=2, inter_host_bandwidth=3.125e9, inter_host_latency=5e-5
    )
    assert (eight.gpus_per_host, eight.concurrency, eight.bandwidth) == (4, 8.0, 12e9)
    assert [eight.host_of(d) for d in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match=r"device=8"):
        eight.host_of(8)


# Which hops of a chain of devices cross hosts; host 0's devices first.
CROSSINGS = [
    # (num_gpus, num_hosts, devices, crossing hops)
    (8, 1, range(8), []),  # one host: none
    (8, 2, range(8), [3]),  # 8 stages on 2 x 4: between devices 3 and 4
    (8, 4, range(8), [1, 3, 5]),  # 4 x 2
    (8, 8, range(8), [0, 1, 2, 3, 4, 5, 6]),  # one device a host: every hop
    (8, 2, range(4), []),  # hybrid 2 x 4, replica 0: all on host 0
    (8, 2, [4, 5, 6, 7], []),  # replica 1: all on host 1
    (6, 2, [2, 3], [0]),  # hybrid 3 x 2 on 2 x 3: replica 1 straddles the hosts
    (8, 2, [0, 4], [0]),  # stage 0's ring of hybrid 2 x 4 (one way)
    (8, 2, [1, 3, 5, 7], [1]),  # stage 1's ring of hybrid 4 x 2
    (2, 2, [0, 1], [0]),  # benchmarks/hosts.py's loopback: 2 workers, 1 device each
]


@pytest.mark.parametrize("num_gpus, num_hosts, devices, expected", CROSSINGS)
def test_crossing_hops(num_gpus, num_hosts, devices, expected):
    machine = Hardware(num_gpus, num_hosts=num_hosts, inter_host_bandwidth=1.0,
                       inter_host_latency=0.0)
    assert machine.crossing_hops(list(devices)) == expected


# Concurrent transfers on 2 hosts x 2 devices, inter-host 8 B/s, 1 s (intra 10 B/s, 0.5 s).
@pytest.mark.parametrize(
    "nics, hops, expected",
    [
        (None, [(0, 1)], [(10.0, 0.5)]),  # within host 0
        (None, [(0, 2), (1, 3)], [(8.0, 1.0)] * 2),  # a link per device: no sharing
        (1, [(0, 2)], [(8.0, 1.0)]),  # one flow: the whole card
        (1, [(0, 2), (1, 3)], [(4.0, 1.0)] * 2),  # two leave host 0 on one card: 8 / 2
        (1, [(0, 2), (3, 1)], [(8.0, 1.0)] * 2),  # one each way: full duplex, no sharing
        (1, [(0, 2), (1, 2), (2, 3)], [(4.0, 1.0), (4.0, 1.0), (10.0, 0.5)]),  # 2 enter host 1
        (2, [(0, 2), (1, 3)], [(8.0, 1.0)] * 2),  # two cards for two flows
    ],
)
def test_links_share_a_hosts_network_cards(nics, hops, expected):
    machine = hosts(inter=(8.0, 1.0), nics_per_host=nics)
    assert machine.links(hops) == expected


@pytest.mark.parametrize(
    "source, target, num_bytes, expected",
    [
        (0, 1, 20, 2.5),  # within a host: 0.5 + 20 / 10
        (1, 2, 20, 11.0),  # across: 1 + 20 / 2
        (2, 3, 20, 2.5),
        (None, None, 20, 2.5),  # no devices: the intra-host link, as before
        (1, 2, 0, 0.0),  # nothing to send costs nothing
    ],
)
def test_transfer_time_between_devices(source, target, num_bytes, expected):
    assert hosts().transfer_time(num_bytes, source, target) == pytest.approx(expected)


def test_transfer_time_needs_both_devices():
    with pytest.raises(ValueError, match=r"give both device indices or neither"):
        hosts().transfer_time(10, source=0)


# Ring all-reduces of 100 bytes on 2 hosts x 2 (intra 10 B/s, 0.5 s; inter 2 B/s, 1 s).
@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(devices=[0, 1]), 11.0),  # one host: 2*1/2 * 100/10 + 2 * 0.5
        (dict(num_devices=2), 11.0),  # the first 2 devices: the same ring
        (dict(devices=[0, 2]), 52.0),  # across: 2*1/2 * 100/2 + 2 * 1
        (dict(), 81.0),  # all 4, paced by the inter-host hop: 2*3/4 * 100/2 + 6 * 1
        (dict(devices=[0, 2, 1, 3]), 81.0),  # every hop crosses: the same pace
        (dict(devices=[3]), 0.0),  # one device: nothing to reduce
    ],
)
def test_ring_allreduce_over_hosts(kwargs, expected):
    assert hosts().allreduce_time(100, **kwargs) == pytest.approx(expected)


def test_ring_allreduce_slowest_hop_may_be_within_a_host():
    # A free inter-host link: the intra-host hops pace the ring, 2*3/4 * 100/10 + 6 * 0.5.
    assert hosts(inter=(math.inf, 0.0)).allreduce_time(100) == pytest.approx(18.0)


@pytest.mark.parametrize(
    "nics, groups, expected",
    [
        (None, [(100, [0, 2]), (100, [1, 3])], [52.0, 52.0]),  # own links each
        (1, [(100, [0, 2]), (100, [1, 3])], [102.0, 102.0]),  # shared: 2*1/2 * 100/1 + 2
        (1, [(100, [0, 2]), (0, [1, 3])], [52.0, 0.0]),  # nothing to reduce: no flow
        (1, [(100, [0, 2]), (60, [1])], [52.0, 0.0]),  # a one-device ring: no flow
    ],
)
def test_concurrent_allreduces(nics, groups, expected):
    times = hosts(nics_per_host=nics).allreduce_times(groups)
    assert times == pytest.approx(expected)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m: m.allreduce_time(10, devices=[0, 0]), ValueError, r"distinct"),
        (lambda m: m.allreduce_time(10, devices=[0, 4]), ValueError, r"device=4"),
        (lambda m: m.allreduce_time(10, 2, devices=[0, 1]), ValueError, r"not both"),
        (lambda m: m.allreduce_times([(10,)]), TypeError, r"groups\[0\]"),
        (lambda m: m.allreduce_times([(-1, [0, 1])]), ValueError, r"num_bytes"),
        (lambda m: m.crossing_hops("0123"), TypeError, r"list of device indices"),
    ],
)
def test_bad_devices_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call(hosts())


# --- a pipeline across hosts --------------------------------------------------------------

# CHAIN at batch 2: forward [2, 2, 4, 2], backward [4, 2, 4, 6]; bytes crossing the cuts
# after l0, l1, l2: 20, 40, 10. On 2 hosts x 2 the hop l1 -> l2 (devices 1 -> 2) crosses.


@pytest.mark.parametrize(
    "num_hosts, expected_sends, expected",
    [
        # hops 20/10 = 2, 40/10 = 4, 10/10 = 1; stages 6+2, 4+2+4, 8+4+1, 8+1 -> 13
        (1, [2.0, 4.0, 1.0], 13.0),
        # the middle hop 1 + 40/2 = 21: stage 2 8 + 21 + 1 = 30
        (2, [2.0, 21.0, 1.0], 30.0),
        # every hop crosses: 1 + 20/2 = 11, 21, 1 + 10/2 = 6; stages 6+11, 4+11+21,
        # 8+21+6, 8+6: stage 1 bounds, 36
        (4, [11.0, 21.0, 6.0], 36.0),
    ],
)
def test_pipeline_pays_the_inter_host_link_on_crossing_hops(num_hosts, expected_sends, expected):
    machine = hosts(num_hosts=num_hosts, latency=0.0)
    _, _, send = costmodel.pipeline_times(CHAIN, machine, 2, [0, 1, 2])
    assert send == pytest.approx(expected_sends)
    estimate = costmodel.predict_pipeline(CHAIN, machine, 2, [0, 1, 2])
    assert estimate.seconds_per_batch == pytest.approx(expected)


def test_pipeline_times_take_the_stage_devices():
    # Stages on devices 0, 2: the hop crosses, 1 + 40 / 2 (cut after l1, batch 2).
    _, _, send = costmodel.pipeline_times(CHAIN, hosts(), 2, [1], devices=[0, 2])
    assert send == pytest.approx([21.0])
    with pytest.raises(ValueError, match=r"one device index per stage \(2\)"):
        costmodel.pipeline_times(CHAIN, hosts(), 2, [1], devices=[0])


# --- the hybrid ---------------------------------------------------------------------------

# CHAIN cut after l1 (2 stages), R = 2, global batch 4: each replica runs 2 examples.
# Stage 0 (l0, l1): forward 2*2 = 4, backward 3*2 = 6, 100 bytes of weights; stage 1 (l2,
# l3): forward 3*2 = 6, backward 5*2 = 10, 100 bytes. Hop: 20 bytes/example * 2 = 40 bytes.
# Replica r's stage k on device 2r + k.


@pytest.mark.parametrize(
    "num_hosts, nics, expected_send, expected_allreduce, expected",
    [
        # one host of 4: hop 40/10 = 4; ring of 2: 2*1/2 * 100/10 = 10; 6 + 10 + 10 + 4
        (1, None, 4.0, 10.0, 30.0),
        # a pipeline per host: hop 4; each ring crosses, 2*1/2 * 100/2 + 2*1 = 52
        (2, None, 4.0, 52.0, 72.0),
        # ...sharing one card: the two rings get 1 B/s each, 100/1 + 2 = 102
        (2, 1, 4.0, 102.0, 122.0),
        # a device per host: the hop crosses too, 1 + 40/2 = 21; rings 52
        (4, None, 21.0, 52.0, 89.0),
    ],
)
def test_hybrid_by_hand(num_hosts, nics, expected_send, expected_allreduce, expected):
    machine = hosts(num_hosts=num_hosts, latency=0.0, nics_per_host=nics)
    estimate = costmodel.predict_hybrid(CHAIN, machine, 4, [1], replicas=2)
    assert estimate.kind == "hybrid"
    assert estimate.seconds_per_batch == pytest.approx(expected)
    assert estimate.images_per_second == pytest.approx(4 / expected)
    assert estimate.compute_seconds == pytest.approx(16.0)  # stage 1 bounds: 6 + 10
    assert estimate.communication_seconds == pytest.approx(expected_send + expected_allreduce)


def test_hybrid_epoch_adds_fill_and_drain_of_the_stage_times():
    # One host of 4 (the first case above): the epoch is simulate_epoch's with each
    # stage's reduction (10) in its backward: forward 4 and 6, backward 16 and 20, hop 4.
    machine = hosts(num_hosts=1, latency=0.0)
    estimate = costmodel.predict_hybrid(CHAIN, machine, 4, [1], replicas=2, num_batches=5)
    expected = costmodel.simulate_epoch([4.0, 6.0], [16.0, 20.0], [4.0], [4.0], 5)
    assert estimate.epoch_seconds == pytest.approx(expected)
    assert estimate.seconds_per_batch == pytest.approx(expected / 5)


def test_hybrid_on_shared_compute_is_at_least_all_compute_plus_the_shortest_reduction():
    # One compute unit for 4 devices (concurrency 1): 2 replicas x (10 + 16) / 1 + 10.
    machine = Hardware(4, 1.0, 10.0, 0.0, concurrency=1.0)
    estimate = costmodel.predict_hybrid(CHAIN, machine, 4, [1], replicas=2)
    assert estimate.seconds_per_batch == pytest.approx(62.0)


def _random_profile(seed, layers=7):
    rng = random.Random(seed)
    return ModelProfile(
        [L(f"l{i}", rng.uniform(0.1, 2), rng.uniform(0.1, 4), rng.choice([0, 3, 40]),
           rng.choice([0, 10, 500])) for i in range(layers)],
        batch_size=rng.choice([1, 4]),
        name=f"random{seed}",
    )


MACHINES = [
    Hardware(8, 2.0, 50.0, 0.01),
    Hardware(8, 1.0, 50.0, 0.01, concurrency=1.5),
    hosts(num_gpus=8, num_hosts=2, bandwidth=50.0, latency=0.01, inter=(5.0, 0.1)),
    hosts(num_gpus=8, num_hosts=4, inter=(5.0, 0.1), nics_per_host=1),
    hosts(num_gpus=8, num_hosts=8, inter=(math.inf, 0.0)),
]


@pytest.mark.parametrize("machine", MACHINES, ids=range(len(MACHINES)))
@pytest.mark.parametrize(
    "seed, cuts, overlap, recompute, num_batches",
    [
        (0, [], False, False, None),
        (1, [2], False, True, None),
        (2, [0, 3, 5], True, False, None),
        (3, [1, 2, 3, 4], False, False, 7),
        (4, [0, 1, 2, 3, 4, 5], True, True, 3),
    ],
)
def test_one_replica_is_the_pipeline(machine, seed, cuts, overlap, recompute, num_batches):
    profile = _random_profile(seed)
    kwargs = dict(num_batches=num_batches, overlap=overlap, recompute=recompute)
    hybrid = costmodel.predict_hybrid(profile, machine, 12, cuts, 1, **kwargs)
    pipe = costmodel.predict_pipeline(profile, machine, 12, cuts, **kwargs)
    # The same terms in the same order: equal to the last bit, kind aside.
    assert hybrid.kind == "hybrid" and pipe.kind == "pipeline"
    for field in ("seconds_per_batch", "compute_seconds", "communication_seconds",
                  "epoch_seconds", "batch_size"):
        assert getattr(hybrid, field) == getattr(pipe, field), field


@pytest.mark.parametrize("machine", MACHINES, ids=range(len(MACHINES)))
@pytest.mark.parametrize("seed, batch", [(0, 8), (1, 12), (2, 5)])
def test_one_stage_is_data_parallelism(machine, seed, batch):
    profile = _random_profile(seed)
    g = machine.gpus_per_host
    for n in sorted({1, 2, machine.num_gpus}):
        # Over the machine's first n devices (hosts of g devices, host 0's first).
        dp_machine = machine.replace(
            num_gpus=n, num_hosts=1 if n <= g else n // g, concurrency=min(machine.concurrency, n)
        )
        hybrid = costmodel.predict_hybrid(profile, dp_machine, batch, [], n)
        dp = costmodel.predict_data_parallel(profile, dp_machine, batch)
        fields = ["seconds_per_batch", "communication_seconds"]
        if dp_machine.concurrency >= n:  # else dp reports its compute stretched, hybrid not
            fields.append("compute_seconds")
        for field in fields:
            assert getattr(hybrid, field) == pytest.approx(getattr(dp, field), rel=1e-12), field


def test_one_stage_is_data_parallelism_on_hosts_by_hand():
    # 8 replicas of one stage over 2 x 4 = data parallelism: CHAIN (W = 200) at batch 8,
    # 1 example each: compute 5 + 8 = 13; ring paced by the inter-host hop:
    # 2*7/8 * 200/2 + 14 * 1 = 189.
    machine = hosts(num_gpus=8)
    for estimate in (costmodel.predict_hybrid(CHAIN, machine, 8, [], 8),
                     costmodel.predict_data_parallel(CHAIN, machine, 8)):
        assert estimate.seconds_per_batch == pytest.approx(13.0 + 189.0)
        assert estimate.communication_seconds == pytest.approx(189.0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(replicas=0), ValueError, r"replicas=0"),
        (dict(replicas=True), TypeError, r"replicas=True"),
        (dict(replicas=3), ValueError, r"2 stages .* x 3 replicas but hardware.num_gpus=4"),
        (dict(cuts=[0, 1, 2], replicas=2), ValueError, r"at most 1 cuts, fewer replicas"),
        (dict(overlap=1), TypeError, r"overlap"),
        (dict(num_batches=0), ValueError, r"num_batches=0"),
    ],
)
def test_bad_hybrid_arguments(kwargs, error, match):
    args = dict(cuts=[1], replicas=2)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        costmodel.predict_hybrid(CHAIN, hosts(), 4, **args)


# --- a faster inter-host link is never slower ---------------------------------------------

LINKS = [(0.5, 2.0), (1.0, 1.0), (4.0, 1.0), (4.0, 0.1), (100.0, 0.0), (math.inf, 0.0)]


@pytest.mark.parametrize("nics", [None, 1])
@pytest.mark.parametrize(
    "replicas, cuts, num_batches",
    [(1, [0, 1, 2, 3, 4, 5, 6], None), (8, [], None), (2, [1, 4, 6], 9), (4, [3], None),
     (2, [0, 2, 5], None)],
)
def test_a_faster_inter_host_link_is_never_slower(nics, replicas, cuts, num_batches):
    profile = _random_profile(5, layers=8)
    times = []
    for link in LINKS:
        machine = hosts(num_gpus=8, inter=link, nics_per_host=nics)
        times.append(costmodel.predict_hybrid(
            profile, machine, 16, cuts, replicas, num_batches=num_batches
        ).seconds_per_batch)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:])), times
    assert times[0] > times[-1]  # and the link matters here


def test_a_faster_inter_host_link_is_never_slower_with_best_cuts():
    profile = _random_profile(6, layers=10)
    for replicas, stages in ((1, 8), (2, 4), (4, 2)):
        times = []
        for link in LINKS:
            machine = hosts(num_gpus=8, inter=link)
            cuts = costmodel.best_cuts(profile, machine, 16, stages, replicas=replicas)
            times.append(
                costmodel.predict_hybrid(profile, machine, 16, cuts, replicas).seconds_per_batch
            )
        assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:])), (replicas, times)


# --- planning the hybrid ------------------------------------------------------------------

# a and b have no weights, c has 100 bytes; nothing crosses a cut. Batch 2 on 2 x 2 hosts.
WEIGHTY_END = ModelProfile([L("a", 1, 1), L("b", 1, 1), L("c", 1, 1, 0, 100)], batch_size=1)


@pytest.mark.parametrize(
    "replicas, expected_cuts, expected",
    [
        # one pipeline, batch 2, 4 s a layer: [a] 4 | [b, c] 8, or [a, b] 8 | [c] 4: a
        # tie (and the same total), so the earliest
        (1, ["a"], 8.0),
        # 2 replicas, 1 example each, 2 s a layer; the ring of c's stage (devices 1, 3)
        # crosses hosts: 2*1/2 * 100/2 + 2 * 1 = 52. [a] 2 | [b, c] 4 + 52, or
        # [a, b] 4 | [c] 2 + 52: the later cut is faster
        (2, ["b"], 54.0),
    ],
)
def test_best_cuts_price_each_stages_allreduce(replicas, expected_cuts, expected):
    machine = hosts()
    cuts = costmodel.best_cuts(WEIGHTY_END, machine, 2, num_stages=2, replicas=replicas)
    assert cuts == expected_cuts
    estimate = costmodel.predict_hybrid(WEIGHTY_END, machine, 2, cuts, replicas)
    assert estimate.seconds_per_batch == pytest.approx(expected)


def test_best_cuts_refuse_more_replicas_than_fit():
    with pytest.raises(ValueError, match=r"`num_stages` must be at most 1.*replicas=4"):
        costmodel.best_cuts(CHAIN, hosts(), 4, num_stages=2, replicas=4)
    with pytest.raises(ValueError, match=r"replicas=5"):
        costmodel.best_cuts(CHAIN, hosts(), 4, replicas=5)


def test_stage_terms_price_hops_and_reductions_from_their_links():
    # CHAIN as 2 stages, [l0, l1] | [l2, l3], batch 4 over 2 replicas (2 examples each):
    # the hop's two copies are 40 bytes, the slower link (4 B/s, 1 s) prices it:
    # 1 + 40/4 = 11; stage 1's ring (2 hops at 2 B/s, 1 s): 2*1/2 * 100/2 + 2 = 52.
    terms = StageTerms(CHAIN, 4, 2, mode="sync", replicas=2,
                       hop_links=[[(10.0, 0.0), (4.0, 1.0)]],
                       ring_links=[[], [(2.0, 1.0), (2.0, 1.0)]])
    first, second = terms.estimate(0, 1, 0), terms.estimate(2, 3, 1)
    assert (first.send, first.allreduce) == pytest.approx((11.0, 0.0))
    assert (second.send, second.allreduce) == pytest.approx((11.0, 52.0))
    assert second.seconds == pytest.approx(6 + 10 + 11 + 52)
    assert terms.seconds(2, 3, 1) == pytest.approx(second.seconds)
    with pytest.raises(ValueError, match=r"`hop_links` must be a list of 1 lists"):
        StageTerms(CHAIN, 4, 2, hop_links=[])
    with pytest.raises(TypeError, match=r"\(bandwidth, latency\) pairs"):
        StageTerms(CHAIN, 4, 2, ring_links=[[1.0], []])


# --- benchmarks/hosts_predict.py: the pure parts -------------------------------------------


def test_loopback_prediction_by_hand():
    # CHAIN cut after l1 at batch 2: forward 4 and 6, backward 6 and 10, 40 bytes handed.
    # Loopback (4 B/s, 1 s): hop 1 + 40/4 = 11; stage 1 6 + 10 + 11 = 27 s per batch.
    # Local (free link): 16.
    out = hosts_predict.predict_loopback(CHAIN, (4.0, 1.0), batch_size=2, cuts=["l1"])
    assert out["loopback"].seconds_per_batch == pytest.approx(27.0)
    assert out["local"].seconds_per_batch == pytest.approx(16.0)


def _records():
    link = [{"kind": "link", "where": w, "fit": {"bandwidth": bw, "latency": lat}}
            for w, bw, lat in (("local", math.inf, 0.0), ("remote", 4.0, 1.0),
                               ("remote", 4.0, 3.0))]
    train = [{"kind": "train", "where": w, "model": "chain", "batch_size": 2, "mode": "stash",
              "cuts": ["l1"], "short": {"steps": 1, "images_per_second": s},
              "long": {"steps": 50, "images_per_second": s}} for w, s in
             (("local", 10.0), ("remote", 5.0))]
    return link + train


def test_loopback_table_from_records():
    # Links: the remote fits' medians, 4 B/s and 2 s; local free. The long window of 50
    # mini-batches is predict_pipeline's epoch of 50 on those links.
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in hosts_predict.loopback_table(_records(), CHAIN).splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("local", "short (1)"), ("loopback", "short (1)"),
                                            ("local", "long (50)"), ("loopback", "long (50)")]
    epoch = {w: costmodel.predict_pipeline(CHAIN, m, 2, ["l1"], num_batches=50)
             .images_per_second
             for w, m in (("local", Hardware(2, 1.0, math.inf, 0.0)),
                          ("loopback", hosts(num_gpus=2, latency=0.0, inter=(4.0, 2.0))))}
    # Steady state 2 / 16 and 2 / (6 + 10 + 2 + 40/4): fill and drain make the epoch slower.
    assert epoch["local"] < 2 / 16 and epoch["loopback"] < 2 / 28
    assert rows[2][2] == f"{epoch['local']:.1f}" and rows[3][2] == f"{epoch['loopback']:.1f}"
    assert rows[3][5] == f"{epoch['loopback'] / epoch['local']:.2f}"
    assert (rows[3][3], rows[3][6]) == ("5.0", "0.50")  # measured images/s, x local
    assert rows[3][4] == f"{100 * (epoch['loopback'] - 5.0) / 5.0:+.0f}%"
    with pytest.raises(ValueError, match=r"lack train remote"):
        hosts_predict.loopback_table(
            [r for r in _records() if r["where"] == "local" or r["kind"] == "link"], CHAIN
        )


def test_load_profiles_profiles_once_then_reads_the_file(tmp_path):
    path = tmp_path / "profiles.json"
    calls = []

    def profile(model):
        calls.append(model)
        return {"profile": CHAIN.to_dict(), "cpu_flops": 1e11, "device": "CPU"}

    first = hosts_predict.load_profiles(str(path), ["chain"], 1, 1, profile=profile)
    again = hosts_predict.load_profiles(str(path), ["chain"], 1, 1, profile=profile)
    assert calls == ["chain"]
    assert json.loads(path.read_text())["chain"]["cpu_flops"] == 1e11
    assert first["chain"][0].names == again["chain"][0].names == CHAIN.names
    hosts_predict.load_profiles(str(path), ["chain"], 4, 1, profile=lambda m: calls.append(m)
                                or {"profile": dict(CHAIN.to_dict(), batch_size=4),
                                    "cpu_flops": 1.0, "device": "CPU"})
    assert calls == ["chain", "chain"]  # another batch size: profiled again


def test_predict_hosts_configurations():
    profile = _random_profile(7, layers=9)
    row = hosts_predict.predict_hosts(profile, 1.0, 25.0, batch_size=16, num_batches=10)
    assert list(row) == ["1 host: dp 4", "1 host: pipeline 4", "pipeline 8", "dp 8",
                         "dp 8, overlap", "hybrid 2x4", "hybrid 4x2", "hybrid 2x4, 1 NIC",
                         "hybrid 4x2, 1 NIC"]
    ips = {k: v.images_per_second for k, v in row.items()}
    assert ips["dp 8, overlap"] >= ips["dp 8"]
    for r_n in ("2x4", "4x2"):  # sharing a card is never faster
        assert ips[f"hybrid {r_n}, 1 NIC"] <= ips[f"hybrid {r_n}"] * (1 + 1e-12)
    machine = hosts_predict.cluster(1.0, 25.0)
    assert (machine.num_gpus, machine.num_hosts, machine.inter_host_bandwidth) == (8, 2, 3.125e9)
