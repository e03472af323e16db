"""`benchmarks.h200`'s pure parts: the floor fitted from floor.py's records, and the
machines. The predictions themselves need the H200 files and Keras models (benchmarks/)."""

import json

import pytest

from benchmarks import h200, hosts_predict


def test_fit_plane_recovers_a_plane():
    points = [(n, layers, 0.5 + 0.25 * n + 0.125 * layers) for n in (1, 2, 4, 8)
              for layers in (8, 32)]
    assert h200.fit_plane(points) == pytest.approx((0.5, 0.25, 0.125))
    # One layer count: no layer term.
    assert h200.fit_plane([(1, 8, 1.0), (2, 8, 1.5)]) == pytest.approx((0.5, 0.5, 0.0))


@pytest.mark.parametrize("by_pass, extra", [
    ("1", ()),  # records from before run_eagerly: spe 1 was pass by pass
    ("eager", (("1", 9.0, 9.0),)),  # spe 1 is then windows of one, in neither plane
])
def test_runtime_costs_fit_the_asynchronous_pipelines_of_each_runtime(tmp_path, by_pass, extra):
    path = tmp_path / "floor.jsonl"
    records = []
    for n in (1, 2, 4):
        for spe, base, per in ((by_pass, 4.0, 3.0), ("8", 0.5, 0.125), *extra):
            for mode in ("stash", "spectrain-paper", "sync"):
                ms = base + per * n + (100.0 if mode == "sync" else 0.0)  # sync left out
                records.append({"trainer": f"{mode}, N={n}, spe={spe}", "layers": 8,
                                "ms_per_batch": ms})
    records.append({"trainer": "keras fit, spe=1", "layers": 8, "ms_per_batch": 1.0})
    path.write_text("\n".join(json.dumps(r) for r in records))
    costs = h200.runtime_costs(str(path))
    assert costs["pass by pass"].floor(4) == pytest.approx((4.0 + 3.0 * 4) / 1e3)
    assert costs["windows"].floor(2) == pytest.approx((0.5 + 0.125 * 2) / 1e3)
    assert costs["windows"].layer_seconds == 0.0  # one layer count: no layer term


def test_machines():
    machines = h200.machines()
    assert [m.num_gpus for m in machines.values()] == [4, 4, 8, 8]
    two = machines["2 hosts x 4 H200 (NVLink), 25 Gb/s"]
    assert two.num_hosts == 2 and two.inter_host_bandwidth == pytest.approx(25e9 / 8)
    more = h200.machines(hosts=(2, 8), ethernet=(10.0,))
    assert [m.num_gpus for m in more.values()] == [4, 4, 8, 32]
    eight = more["8 hosts x 4 H200 (NVLink), 10 Gb/s"]
    assert eight.num_hosts == 8 and eight.inter_host_bandwidth == pytest.approx(10e9 / 8)


@pytest.mark.parametrize("spe, known, per_mini_batch", [
    ("eager", True, 3 * 0.002), ("1", False, 3 * 0.002),  # a record from before windows of 1
    ("1", True, 0.002), ("auto", True, 0.002 / 8), ("4", True, 0.002 / 4)])
def test_loopback_runtime_pays_a_remote_call_per_pass_or_per_window(spe, known, per_mini_batch):
    record = {"steps_per_execution": spe, "run_eagerly_known": known}
    costs = hosts_predict.loopback_runtime(record, 0.002)
    assert costs.remote_stage_seconds == pytest.approx(per_mini_batch)
