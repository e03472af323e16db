"""Tests for benchmarks/overlap.py: its arguments and its table (no TensorFlow run)."""

import argparse

import pytest

from benchmarks import overlap


def record(ips_short, cores_short, ips_long, cores_long):
    return {
        "short": {"images_per_second": ips_short, "cores": cores_short, "started_after": 9.0},
        "long": {"images_per_second": ips_long, "cores": cores_long, "started_after": 14.0},
    }


ARGS = argparse.Namespace(model="vgg16", batch_size=64, warmup=3, short=8, long=32, rounds=3,
                          steps_per_execution="auto",
                          cuts=["auto"])
RESULTS = {
    "single-1core": [record(50, 1.0, 51, 1.0), record(40, 1.0, 42, 1.0), record(45, 1.0, 44, 1.0)],
    "stash": [record(95, 1.9, 100, 1.9), record(60, 1.2, 84, 1.85), record(90, 1.8, 88, 1.9)],
}


def cells():
    lines = overlap.table(RESULTS, ARGS, 1.0).splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in lines if line.startswith("| ") and "configuration" not in line]
    return {(r[0], r[1].split()[0]): r for r in rows}


def test_speed_up_is_per_round_against_the_same_rounds_reference():
    table = cells()
    # stash short: rounds 95/50, 60/40, 90/45 -> 1.9, 1.5, 2.0: median 1.90, range 1.50-2.00
    assert table[("stash", "short")][3] == "1.90 (1.50-2.00)"
    assert table[("stash", "short")][2] == "90.0 (60.0-95.0)"
    assert table[("stash", "short")][4] == "1.80 (1.20-1.90)"
    assert table[("single-1core", "long")][3] == "1.00 (1.00-1.00)"
    assert table[("stash", "long")][5] == "14 (14-14)"


def test_arguments():
    args = overlap.parse_args([])
    assert args.configs[0] == "single-1core" and "sync-M4" in args.configs
    assert (args.batch_size, args.short, args.long, args.rounds) == (64, 8, 32, 3)
    quick = overlap.parse_args(["--quick"])
    assert quick.model == "small_cnn" and quick.rounds == 1
    with pytest.raises(SystemExit):
        overlap.parse_args(["--configs", "stash"])  # no reference
    with pytest.raises(SystemExit):
        overlap.parse_args(["--configs", "single-1core,bogus"])


def test_every_run_is_listed_with_its_cpu_per_wall():
    lines = overlap.runs_table(RESULTS).splitlines()[2:]
    assert len(lines) == 6
    cells = [c.strip() for c in lines[4].strip("|").split("|")]
    assert cells == ["stash", "2", "-", "60.0", "1.20", "84.0", "1.85"]


def test_every_run_lists_its_cuts():
    results = {
        "single-1core": [dict(record(50, 1.0, 51, 1.0), cuts=None)],
        "stash": [dict(record(95, 1.9, 100, 1.9), cuts=["block3_conv1"])],
    }
    rows = overlap.runs_table(results).splitlines()
    assert "| stash | 1 | block3_conv1 | 95.0 |" in "\n".join(rows)
    assert "| single-1core | 1 | - | 50.0 |" in "\n".join(rows)
    assert overlap.parse_args([]).cuts == ["auto"]
    assert "at block3_relu2" in overlap.table(
        RESULTS, argparse.Namespace(**dict(vars(ARGS), cuts=["fixed"])), 1.0
    )


def test_both_cut_kinds_run_every_pipeline_twice_per_round():
    args = overlap.parse_args(["--cuts", "auto,fixed", "--configs", "single-1core,stash"])
    assert overlap.runs(args) == [
        ("single-1core", "single-1core", "auto"),
        ("stash (auto)", "stash", "auto"),
        ("stash (fixed)", "stash", "fixed"),
    ]
    assert [label for label, _, _ in overlap.runs(overlap.parse_args([]))][:3] == [
        "single-1core", "keras-default-threads", "stash"]
    with pytest.raises(SystemExit):
        overlap.parse_args(["--cuts", "balanced"])
