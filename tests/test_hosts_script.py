"""Tests for benchmarks/hosts.py: arguments, tables from made-up records, the CPU clock of
several processes, and one `--quick --measure train` smoke run (workers on 127.0.0.1)."""

import os
import subprocess
import sys
import time

import pytest

from benchmarks import hosts


def _tensor(name, nbytes, hop, call, cores=1.0):
    return {"name": name, "shape": [nbytes // 4], "dtype": "float32", "bytes": nbytes,
            "call": call, "base": call - hop, "hop": hop, "cores": cores, "cores_all": cores}


def _link(where, hops, calls, fit):
    """A link record: `hops` and `calls` in seconds for tiny (4 bytes) and "cut" (4 MB)."""
    devices = ["/CPU:0", "/CPU:1"] if where == "local" else ["/job:worker/task:0",
                                                              "/job:worker/task:1"]
    return {"kind": "link", "where": where, "devices": devices,
            "tensors": [_tensor("tiny", 4, hops[0], calls[0]),
                        _tensor("cut", 4_000_000, hops[1], calls[1], cores=1.5)],
            "fit": {"bandwidth": fit[0], "latency": fit[1]}}


def _train(where, short, long, cores_all=1.9):
    return {
        "kind": "train", "where": where, "cuts": ["block3_relu2"],
        "variables_on": [f"/job:{where}/task:0", f"/job:{where}/task:1"],
        "short": {"images_per_second": short, "cores": 0.5, "cores_all": cores_all,
                  "started_after": 9.0},
        "long": {"images_per_second": long, "cores": 0.6, "cores_all": cores_all,
                 "started_after": 14.0},
        "workers_start_seconds": 6.0,
    }


LINK = {
    "local": [_link("local", (1e-5, 0.0), (1e-4, 1e-4), (float("inf"), 1e-4)),
              _link("local", (2e-5, 1e-5), (2e-4, 1e-4), (float("inf"), 2e-4))],
    "remote": [_link("remote", (7e-4, 4e-3), (2e-3, 5e-3), (1.0e9, 2e-3)),
               _link("remote", (9e-4, 2e-3), (3e-3, 4e-3), (2.0e9, 1e-3))],
}
TRAIN = {
    "local": [_train("local", 100.0, 120.0), _train("local", 50.0, 60.0)],
    "remote": [_train("remote", 80.0, 96.0), _train("remote", 45.0, 36.0)],
}


def _rows(text, first):
    """The cells of the markdown rows of `text` whose first cell is `first`."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() == first]


def test_arguments():
    args = hosts.parse_args([])
    assert (args.model, args.batch_size, args.rounds, args.repeats) == ("vgg16", 64, 3, 30)
    assert (args.warmup, args.short, args.long) == (3, 8, 32)
    assert args.measure == ["link", "train"] and args.child is None
    quick = hosts.parse_args(["--quick", "--measure", "train"])
    assert (quick.model, quick.batch_size, quick.rounds, quick.repeats) == ("small_cnn", 32, 1, 5)
    assert quick.measure == ["train"]
    child = hosts.parse_args(["--child", "link", "--where", "remote", "--cluster",
                              "127.0.0.1:1,127.0.0.1:2", "--worker-pids", "12,34"])
    assert child.worker_pids == [12, 34]
    for bad in (["--measure", "links"], ["--measure", "link,link"], ["--repeats", "0"],
                ["--child", "train"], ["--child", "train", "--where", "remote"],
                ["--where", "elsewhere"]):
        with pytest.raises(SystemExit):
            hosts.parse_args(bad)


def test_rounds_interleave_local_and_loopback_in_swapped_order():
    args = hosts.parse_args([])
    assert hosts.order(args, 0) == [("link", "local"), ("link", "remote"),
                                    ("train", "local"), ("train", "remote")]
    assert hosts.order(args, 1) == [("link", "remote"), ("link", "local"),
                                    ("train", "remote"), ("train", "local")]
    assert hosts.order(hosts.parse_args(["--measure", "train"]), 2) == [
        ("train", "local"), ("train", "remote")]


def test_link_table_medians_ranges_and_bandwidth_per_round():
    text = hosts.link_table(LINK)
    (tiny,) = _rows(text, "tiny")
    (cut,) = _rows(text, "cut")
    assert tiny[1:3] == ["1", "0.000"]
    # local: hop, call, GB/s, CPU/wall; then loopback's four
    assert tiny[3:5] == ["0.015 (0.010-0.020)", "0.150 (0.100-0.200)"]
    assert tiny[5] == "-" and tiny[9] == "-"  # no bandwidth from 4 bytes
    assert tiny[7] == "0.800 (0.700-0.900)"
    assert cut[2] == "4.000"
    # 4 MB in 4 ms and 2 ms: 1 and 2 GB/s; a local hop of 0 s is no measurable cost (inf)
    assert cut[9] == "1.50 (1.00-2.00)"
    assert cut[5] == "inf (400.00-inf)"
    assert cut[6] == "1.50 (1.50-1.50)"


def test_link_table_refuses_rounds_that_disagree():
    other = dict(LINK, remote=[LINK["remote"][0], dict(LINK["remote"][1], tensors=[
        LINK["remote"][1]["tensors"][0], dict(LINK["remote"][1]["tensors"][1], name="x")])])
    with pytest.raises(ValueError, match="disagree"):
        hosts.link_table(other)


def test_fit_and_train_tables():
    (loopback,) = _rows(hosts.fit_table(LINK), "loopback")
    assert loopback[2:] == ["1.50 (1.00-2.00)", "1.500 (1.000-2.000)"]
    args = hosts.parse_args([])
    rows = {(r[0], r[1].split()[0]): r for r in _rows(hosts.train_table(TRAIN, args), "loopback")
            + _rows(hosts.train_table(TRAIN, args), "local")}
    # per round: 80 / 100 = 0.8 and 45 / 50 = 0.9; long: 96 / 120 = 0.8, 36 / 60 = 0.6
    assert rows[("loopback", "short")][3] == "0.85 (0.80-0.90)"
    assert rows[("loopback", "long")][3] == "0.70 (0.60-0.80)"
    assert rows[("loopback", "short")][2] == "62.5 (45.0-80.0)"
    assert rows[("local", "long")][3] == "1.00 (1.00-1.00)"
    assert rows[("local", "short")][4:] == ["0.50 (0.50-0.50)", "1.90 (1.90-1.90)", "9 (9-9)"]


def test_report_has_the_sections_measured():
    args = hosts.parse_args([])
    text = hosts.report({"link": LINK, "train": TRAIN}, args, 2.0, command="x")
    assert text.startswith("`x`")
    assert "TF_NUM_INTRAOP_THREADS=1" in text and "cut at block3_relu2" in text
    assert "| loopback | 2 | /job:remote/task:0, /job:remote/task:1 | 45.0 |" in text
    assert "Workers took 6.0 (6.0-6.0) s" in text
    only = hosts.report({"train": TRAIN}, hosts.parse_args(["--measure", "train"]), 1.0, "x")
    assert "Hand-off" not in only and "measure_link" not in only and "Training:" in only


@pytest.mark.exclusive  # a child's share of a core
def test_the_clock_counts_the_cpu_time_of_other_processes():
    assert hosts.process_cpu_seconds(os.getpid()) == pytest.approx(time.process_time(),
                                                                   abs=0.05)
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 3: pass"])
    try:
        time.sleep(0.3)  # past the interpreter's start-up
        with hosts.ProcessesClock([busy.pid]) as clock:
            time.sleep(0.6)
    finally:
        busy.kill()
        busy.wait()
    assert clock.cores < 0.2  # this process sleeps
    # The busy child computes all the time: about one core more (less when other work
    # shares its core), never more than one.
    assert 0.25 < clock.cores_all - clock.cores < 1.1
    assert clock.cpu_all == pytest.approx(clock.cores_all * clock.wall)
