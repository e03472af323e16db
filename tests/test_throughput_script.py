"""`benchmarks.throughput`'s table (pure: made-up measurements in, markdown out) and
`benchmarks/gpu.sh`'s refusal on a machine without NVIDIA GPUs. The measurements themselves
need minutes of VGG16 and run in benchmarks/, not here."""

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess

import pytest

from benchmarks import throughput

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(steady, epoch, rss, util=None, devices=None, cores=1.0):
    out = {"steady": steady, "epoch": epoch, "rss_mb": rss, "device_peak_mb": devices,
           "cores": cores}
    if util is not None:
        out["utilisation"] = util
        out["bubble"] = 1 - sum(util) / len(util)
    return out


RESULTS = {
    ("single", 1): [run(20.0, 19.0, 1400.0, devices=[None]),
                    run(18.0, 17.0, 1500.0, devices=[None])],
    ("stash", 4): [run(21.0, 18.0, 2000.0, [0.5, 0.6, 0.7, 0.9], [None] * 4, cores=1.9),
                   run(19.0, 16.0, 2100.0, [0.7, 0.6, 0.5, 0.7], [None] * 4, cores=1.5)],
    ("dp", 4): [run(12.0, 11.0, 2100.0, devices=[100.0, 110.0, 120.0, 130.0]),
                run(14.0, 13.0, 2300.0, devices=[300.0, 310.0, 320.0, 330.0])],
}
ARGS = argparse.Namespace(model="vgg16", batch_size=64, steps=16, repeats=2)


def rows():
    lines = throughput.table(RESULTS, ARGS, 60.0).splitlines()
    body = [line for line in lines if line.startswith("| ") and "configuration" not in line]
    return {(cells[0], int(cells[1])): cells
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in body)}


def test_ratios_are_of_medians_to_single_in_the_same_run():
    table = rows()
    base = statistics.median([20.0, 18.0])
    base_epoch = statistics.median([19.0, 17.0])
    for (name, n), cells in table.items():
        runs = RESULTS[(name, n)]
        steady = statistics.median(r["steady"] for r in runs)
        epoch = statistics.median(r["epoch"] for r in runs)
        assert float(cells[2]) == pytest.approx(steady, abs=0.05)
        assert float(cells[3]) == pytest.approx(steady / base, abs=0.005)
        assert float(cells[5]) == pytest.approx(epoch / base_epoch, abs=0.005)
    assert table[("single", 1)][3] == "1.00"


def test_utilisation_bubble_and_memory_columns():
    table = rows()
    stash = table[("stash", 4)]
    assert stash[6] == "1.70"  # CPU/wall, the median of the repeats
    assert stash[7] == "0.60 / 0.60 / 0.60 / 0.80"  # per-stage medians of two repeats
    assert float(stash[8]) == pytest.approx(statistics.median([1 - 2.7 / 4, 1 - 2.5 / 4]),
                                            abs=0.005)
    # CPU devices keep no memory statistics: the process' peak, median of the repeats.
    assert stash[9] == "process 2050"
    assert table[("single", 1)][7:9] == ["-", "-"]
    # Devices with statistics (GPUs): each device's median peak, then the process.
    assert table[("dp", 4)][9] == "200 / 210 / 220 / 230 (process 2200)"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has GPUs")
def test_gpu_script_refuses_a_machine_without_nvidia_gpus(tmp_path):
    out = tmp_path / "results.md"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), str(out)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "nvidia-smi not found" in proc.stderr
    assert "python -m benchmarks.throughput --quick" in proc.stderr
    assert not out.exists()  # nothing written, nothing started
