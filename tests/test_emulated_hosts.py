"""Emulated hosts (benchmarks/emulated_hosts.py): network namespaces on shaped links, and
the trainer on a host of its own (tf_spectrain.cluster.reach).

The namespace tests skip, saying why, where this process cannot create namespaces (not
root, no `ip`): see `benchmarks.emulated_hosts.check_available`.
"""

import subprocess
import sys

import pytest
from test_worker import HERE, child_env

from benchmarks import emulated_hosts as eh
from tf_spectrain.cluster import reach, spec


def _unavailable():
    try:
        eh.check_available()
    except eh.NamespacesUnavailable as error:
        return str(error)
    return None


needs_namespaces = pytest.mark.skipif(_unavailable() is not None,
                                      reason=f"no network namespaces here: {_unavailable()}")


@pytest.mark.parametrize("rate, bits", [
    ("100mbit", 100e6), ("1gbit", 1e9), ("2.5Mbit", 2.5e6), ("512kbit", 512e3),
    ("unshaped", None), (None, None),
])
def test_rates_read_as_tc_writes_them(rate, bits):
    assert eh.rate_bits(rate) == bits


@pytest.mark.parametrize("rate", ["100", "fast", "0mbit", "-5mbit", "100mbps"])
def test_a_bad_rate_is_named_with_the_valid_forms(rate):
    with pytest.raises(ValueError, match=r"kbit, mbit or gbit.*Received: '" + rate):
        eh.rate_bits(rate)


@needs_namespaces
def test_links_are_shaped_both_ways_and_nothing_is_left():
    with eh.EmulatedHosts(2, "20mbit") as hosts:
        names = list(hosts.names) + [hosts.switch]
        assert set(names) <= set(eh._namespaces())
        assert all("tbf" in line and "rate 20Mbit" in line for line in hosts.qdiscs().values())
        there = hosts.measure_rate(0, 1, megabytes=1.0)
        back = hosts.measure_rate(1, 0, megabytes=1.0)
        # A busy machine can only make a transfer slower: the bound above is the shaping.
        assert 0 < there < 1.3 * 20e6 and 0 < back < 1.3 * 20e6, (there, back)
    assert not set(names) & set(eh._namespaces())


@needs_namespaces
def test_a_failing_run_and_a_killed_one_leave_nothing():
    with pytest.raises(RuntimeError, match="a failing run"), eh.EmulatedHosts(2) as hosts:
        sleeper = hosts.popen(0, ["sleep", "300"])
        names = list(hosts.names) + [hosts.switch]
        raise RuntimeError("a failing run")
    assert sleeper.poll() is not None  # killed with its namespace
    assert not set(names) & set(eh._namespaces())
    # What a SIGKILLed harness leaves (its pid gone) is removed by the next one.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{eh.PREFIX}{dead.pid}-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        assert stale in eh.remove_stale()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
    assert stale not in eh._namespaces()


@needs_namespaces
def test_train_py_trains_a_pipeline_and_dp_with_its_trainer_on_a_third_host(tmp_path):
    env = child_env(CUDA_VISIBLE_DEVICES="", TF_NUM_INTRAOP_THREADS="1")
    with eh.EmulatedHosts(3, "200mbit") as hosts:
        cluster = f"{hosts.address(0)}:2222,{hosts.address(1)}:2222"
        workers = [hosts.popen(t, [sys.executable, "-m", "tf_spectrain.app.worker", "--cluster",
                                   cluster, "--task", str(t), "--bind-all"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, cwd=HERE.parent) for t in (0, 1)]
        for worker in workers:
            assert any(line.startswith("tf_spectrain worker: ") for line in worker.stdout)
        runs = {mode: hosts.run(2, [sys.executable, "train.py", "--cluster", cluster, "--model",
                                    "small_cnn", "--batch-size", "16", "--limit", "64",
                                    "--epochs", "1", "--export", "none", "--logdir",
                                    str(tmp_path / mode), *flags],
                                timeout=240, env=env, cwd=HERE.parent)
                for mode, flags in [("spectrain", ["--cuts", "pool1"]), ("dp", ["--mode", "dp"])]}
    for mode, done in runs.items():
        assert done.returncode == 0, (mode, done.stdout[-2000:], done.stderr[-4000:])
        assert f"the trainer served at {hosts.address(2)}:" in done.stdout
        assert "test accuracy" in done.stdout
    workers = [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in (0, 1)]
    assert f"spectrain pipeline of 2 stages on {', '.join(workers)}" in runs["spectrain"].stdout
    assert f"dp on {', '.join(workers)} (a copy of the model on each" in runs["dp"].stdout


# --- the trainer's address (tf_spectrain.cluster.reach), without namespaces ----------------

def _routes(monkeypatch, sources):
    """Makes worker host h resolve to itself and route from `sources[h]`."""
    monkeypatch.setattr(reach, "_resolve", lambda host: host.strip("[]"))
    monkeypatch.setattr(reach, "route_source", lambda ip: sources[ip])
    monkeypatch.setattr(reach, "free_port", lambda ip: 4321)


@pytest.mark.parametrize("sources, expected", [
    ({"127.0.0.1": "127.0.0.1", "127.0.0.2": "127.0.0.1"}, None),  # loopback: "localhost"
    ({"10.0.0.1": "10.0.0.9", "10.0.0.2": "10.0.0.9"}, "10.0.0.9:4321"),
    ({"127.0.0.1": "127.0.0.1", "10.0.0.2": "10.0.0.9"}, "10.0.0.9:4321"),  # mixed
    ({"fd00::1": "fd00::9", "fd00::2": "fd00::9"}, "[fd00::9]:4321"),
])
def test_the_trainer_joins_at_the_address_its_routes_leave_from(monkeypatch, sources, expected):
    _routes(monkeypatch, sources)
    hosts = [f"[{h}]" if ":" in h else h for h in sources]
    cluster = spec.parse_cluster([f"{h}:2222" for h in hosts])
    assert reach.trainer_address(cluster) == expected


def test_routes_from_two_addresses_ask_for_trainer_address(monkeypatch):
    _routes(monkeypatch, {"10.0.0.1": "10.0.0.9", "10.1.0.1": "10.1.0.9"})
    cluster = spec.parse_cluster("10.0.0.1:2222,10.1.0.1:2222")
    with pytest.raises(ValueError, match=r"task 0 \(10.0.0.1:2222\) from 10.0.0.9; task 1 "
                       r"\(10.1.0.1:2222\) from 10.1.0.9.*pass `trainer_address`"):
        reach.trainer_address(cluster)


@pytest.mark.parametrize("given, problem", [
    ("", "Received: trainer_address=''"),
    ("127.0.0.1:70000", "Received: trainer_address='127.0.0.1:70000'"),
    ("192.0.2.77", "Cannot assign requested address"),  # TEST-NET-1: not this host's
    ("no-such-host.invalid:5000", "Received: trainer_address='no-such-host.invalid:5000'"),
])
def test_a_bad_trainer_address_is_named_before_connecting(given, problem):
    cluster = spec.parse_cluster("127.0.0.1:2222")
    with pytest.raises(ValueError, match="must be 'host' or 'host:port'") as info:
        reach.trainer_address(cluster, given)
    assert problem in str(info.value)


def test_a_given_trainer_address_keeps_its_port_and_loopback_is_refused_for_remote_workers(
        monkeypatch):
    loopback = spec.parse_cluster("127.0.0.1:2222")
    port = reach.free_port("127.0.0.1")
    assert reach.trainer_address(loopback, f"127.0.0.1:{port}") == f"127.0.0.1:{port}"
    assert reach.trainer_address(loopback, "localhost").startswith("127.0.0.1:")
    monkeypatch.setattr(reach, "route_source", lambda ip: "10.0.0.9")
    remote = spec.parse_cluster("10.0.0.1:2222")
    with pytest.raises(ValueError, match="so a loopback address is not.*from 10.0.0.9"):
        reach.trainer_address(remote, "127.0.0.1")


def test_an_unreachable_worker_host_is_named():
    cluster = spec.parse_cluster("127.0.0.1:2222,no-such-host.invalid:2222")
    with pytest.raises(ConnectionError, match=r"task 1 \(no-such-host.invalid:2222\) cannot "
                       "be reached from this host"):
        reach.trainer_address(cluster)


def test_the_links_table_gives_each_pipeline_over_dp_per_round_and_rate():
    from benchmarks import links

    args = links.parse_args(["--rates", "unshaped,100mbit", "--configs", "alone,dp,stash"])
    records = [
        dict(config="alone", rate=r, images_per_s=50.0, bytes_per_batch=0) for r in args.rates
    ] + [
        dict(config="dp", rate="100mbit", images_per_s=10.0, bytes_per_batch=123e6),
        dict(config="stash", rate="100mbit", images_per_s=30.0, bytes_per_batch=12e6),
        dict(config="dp", rate="100mbit", images_per_s=12.0, bytes_per_batch=123e6),
        dict(config="stash", rate="100mbit", images_per_s=48.0, bytes_per_batch=12e6),
    ]
    rows = links.table(records, args).splitlines()
    assert rows[0].split(" | ")[-3:] == ["stash / dp", "dp MB per mini-batch",
                                        "stash MB per mini-batch |"]
    cells = [c.strip() for c in rows[3].strip("|").split("|")]
    # Ratios per round (3.0 and 4.0), then their median and range; not a ratio of medians.
    assert cells == ["100mbit", "50.0", "11.0 (10.0-12.0)", "39.0 (30.0-48.0)",
                     "3.50 (3.00-4.00)", "123.0 (123.0-123.0)", "12.0 (12.0-12.0)"]
    assert [c.strip() for c in rows[2].strip("|").split("|")][1:3] == ["50.0", "-"]
    with pytest.raises(ValueError, match="Received: '100mb'"):
        links.parse_args(["--rates", "100mb"])
