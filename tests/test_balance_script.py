"""Tests for benchmarks/balance.py: its arguments, its statistics, and a `--quick` run.

The quick run (one child process: `small_cnn`, N=2, 1 round) is checked against what must
hold whatever the machine's load: max/mean >= 1, the bound equals a brute-force search of
the recorded per-layer times and is never above a cut list's max/mean predicted from the
same times, and the table's cells are those recomputed from the JSON-lines record.
Measured stage times and the profile are different timings, so measured max/mean is not
compared with the bound.
"""

import itertools
import math
import statistics

import pytest

from benchmarks import balance, common
from tf_spectrain.schedule import modes


def rows_of(text, first_header):
    """The body rows (lists of cells) of the markdown table whose header starts so."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def test_arguments():
    args = balance.parse_args([])
    assert args.models == ["vgg16", "resnet56", "resnet50", "mobilenetv2"]
    assert (args.stages, args.batch_size, args.mode, args.rounds) == ([2, 4, 8], 32, "sync", 3)
    assert args.intra_op_threads == 1
    quick = balance.parse_args(["--quick"])
    assert (quick.models, quick.stages, quick.rounds) == (["small_cnn"], [2], 1)
    for bad in (["--mode", "single"], ["--stages", "1,2"], ["--models", "vgg"]):
        with pytest.raises(SystemExit):
            balance.parse_args(bad)
    assert balance.PIPELINE_MODES == modes.PIPELINE_MODES


def test_rounds_rotate_the_order():
    orders = [balance.round_order(r) for r in range(4)]
    assert orders[0] == ["auto", "params", "layers"]
    assert orders[1] == ["params", "layers", "auto"]
    assert orders[2] == ["layers", "auto", "params"]
    assert orders[3] == orders[0]
    # Over len(CUT_LISTS) rounds every cut list is measured once in every position.
    for position in range(3):
        assert sorted(o[position] for o in orders[:3]) == sorted(balance.CUT_LISTS)


def fake_record():
    def run(*ms):
        return {"forward": [0.0] * len(ms), "forward_backward": [m / 1e3 for m in ms],
                "wall": 1.0, "cores": 0.9}

    rounds = [
        {"measured": {"auto": run(10, 10, 12), "params": run(20, 5, 5), "layers": run(9, 9, 9)}},
        {"measured": {"auto": run(11, 10, 9), "params": run(18, 6, 6), "layers": run(8, 9, 13)}},
        {"measured": {"auto": run(13, 9, 8), "params": run(22, 4, 4), "layers": run(9, 9, 9)}},
    ]
    return {"bound": 1.05, "rounds": rounds}


def test_summary_is_medians_over_rounds():
    s = balance.summary(fake_record())
    auto = s["cut_lists"]["auto"]
    # max/mean per round: 12 / (32/3), 11 / 10, 13 / 10
    expected = [12 * 3 / 32, 1.1, 1.3]
    assert auto["balance"] == pytest.approx(expected)
    assert auto["median"] == pytest.approx(1.125)
    assert auto["over_bound"] == pytest.approx(1.125 / 1.05)
    assert auto["stage_ms"] == pytest.approx([11, 10, 9])
    assert auto["slowest_ms"] == pytest.approx(12)
    assert s["cut_lists"]["params"]["median"] == pytest.approx(2.0)  # 20/10, 18/10, 22/10
    assert s["auto_not_worse"]
    assert s["auto_vs_bound"] == pytest.approx(auto["over_bound"])


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("balance")
    out, jsonl = work / "balance.md", work / "balance.jsonl"
    balance.main(["--quick", "--out", str(out), "--jsonl", str(jsonl)])
    (record,) = common.read_jsonl(str(jsonl))
    return out.read_text(), record


def brute_force_bound(costs, n):
    """min over every cut list of max stage sum, over the mean: by enumeration."""
    best = math.inf
    for cut in itertools.combinations(range(len(costs) - 1), n - 1):
        bounds = [-1, *cut, len(costs) - 1]
        best = min(best, max(sum(costs[a + 1 : b + 1]) for a, b in zip(bounds, bounds[1:])))
    return best / (sum(costs) / n)


def test_quick_run_has_a_row_per_cut_list(quick_run):
    text, record = quick_run
    (row,) = rows_of(text, "model")
    assert (row["model"], row["N"]) == ("small_cnn", "2")
    stages = rows_of(text.split("Per-stage times")[1], "model")
    assert [r["cut list"] for r in stages] == ["auto", "params", "layers"]
    for r in stages:
        assert len(r["per-stage F+B ms (median)"].split(" / ")) == 2
        assert len(r["cuts"].split(", ")) == 1
    assert record["stages"] == 2 and len(record["rounds"]) == 1


def test_quick_run_bound_and_balances_are_consistent(quick_run):
    text, record = quick_run
    n, costs = record["stages"], record["layer_seconds"]
    assert len(costs) == len(record["layer_names"])
    assert record["bound"] == pytest.approx(brute_force_bound(costs, n), rel=1e-9)
    assert record["bound"] >= 1.0 - 1e-12
    names = record["layer_names"]
    for name in balance.CUT_LISTS:
        cuts = record["cuts"][name]
        assert len(cuts) == n - 1 and all(c in names for c in cuts)
        # Predicted from the same profile as the bound: never below it.
        assert record["predicted"][name] >= record["bound"] * (1 - 1e-9)
        for r in record["rounds"]:
            fb = r["measured"][name]["forward_backward"]
            assert len(fb) == n and all(t > 0 for t in fb)
            assert max(fb) / statistics.fmean(fb) >= 1.0 - 1e-12
            assert r["measured"][name]["cores"] > 0
    assert record["bound_cuts"] and record["plan"]["cuts"] == record["cuts"]["auto"]
    assert record["plan"]["profile_seconds"] > 0


def test_quick_run_table_cells_are_recomputed_from_the_record(quick_run):
    text, record = quick_run
    (row,) = rows_of(text, "model")
    bound = record["bound"]
    assert float(row["bound max/mean"]) == pytest.approx(bound, abs=5e-4)
    medians = {}
    for name in balance.CUT_LISTS:
        fb = record["rounds"][0]["measured"][name]["forward_backward"]
        medians[name] = max(fb) * len(fb) / sum(fb)
        assert float(row[f"{name} max/mean"]) == pytest.approx(medians[name], abs=5e-3)
    assert float(row["auto vs bound"]) == pytest.approx(medians["auto"] / bound, abs=5e-3)
    assert row["auto <= params"] == ("yes" if medians["auto"] <= medians["params"] else "no")
