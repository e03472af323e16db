"""Tests for benchmarks/inference_overlap.py: its arguments and its table (no TensorFlow run)."""

import pytest

from benchmarks import inference_overlap as bench


def _record(config, rates):
    """A child's record: `rates` maps (task, path) to the images/s of its windows."""
    windows = [
        {"task": task, "path": path, "images_per_second": ips, "cores": 1.0 + ips / 1000,
         "started_after": 1.0}
        for (task, path), values in rates.items() for ips in values
    ]
    return {"config": config, "images": 1000, "cuts": ["c1"], "windows": windows}


ROUNDS = [
    {
        bench.REFERENCE: _record(bench.REFERENCE, {("evaluate", "keras"): [100, 110],
                                                   ("predict", "keras"): [200, 190]}),
        bench.PIPELINE: _record(bench.PIPELINE, {
            ("evaluate", "sequential"): [100, 90], ("evaluate", "pipelined"): [170, 180],
            ("predict", "sequential"): [150, 160], ("predict", "pipelined"): [300, 320]}),
    },
    {
        bench.REFERENCE: _record(bench.REFERENCE, {("evaluate", "keras"): [50],
                                                   ("predict", "keras"): [100]}),
        bench.PIPELINE: _record(bench.PIPELINE, {
            ("evaluate", "sequential"): [40], ("evaluate", "pipelined"): [80],
            ("predict", "sequential"): [100], ("predict", "pipelined"): [150]}),
    },
]


def _row(lines, task, path):
    (line,) = [x for x in lines if x.startswith(f"| {task} | {path} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_ratios_are_per_round_between_the_best_windows():
    args = bench.parse_args(["--rounds", "2"])
    lines = bench.table(ROUNDS, args, 1.0).splitlines()
    # evaluate pipelined: best 180 / best keras 110 = 1.64 and 80 / 50 = 1.60; against the
    # same process' best sequential window: 180 / 100 = 1.80 and 80 / 40 = 2.00.
    row = _row(lines, "evaluate", "pipelined")
    assert row[2] == "130.0 (80.0-180.0)"
    assert row[3] == "1.62 (1.60-1.64)"
    assert row[4] == "1.90 (1.80-2.00)"
    assert row[5] == "1.13 (1.08-1.18)"  # the CPU/wall of the best windows
    assert _row(lines, "predict", "keras-1core")[3] == "1.00 (1.00-1.00)"
    assert _row(lines, "predict", "sequential")[4] == "1.00 (1.00-1.00)"


def test_arguments():
    args = bench.parse_args([])
    assert (args.model, args.batch_size, args.rounds, args.repeats) == ("vgg16", 64, 3, 2)
    quick = bench.parse_args(["--quick"])
    assert (quick.model, quick.batches, quick.rounds) == ("small_cnn", 4, 1)
    with pytest.raises(SystemExit):
        bench.parse_args(["--batches", "0"])
