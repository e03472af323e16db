"""A pipeline across worker processes on 127.0.0.1: same weights as on local devices, and a
killed worker makes `fit` fail at once, naming the worker, its address and its stages.

The trainer runs in a subprocess (tests/remote_pipeline_child.py): connecting reconfigures
the eager context that pytest's process shares with every other test.
"""

import json
import subprocess
import sys

import pytest
from test_worker import HERE, Processes, child_env, free_port

CHILD = HERE / "remote_pipeline_child.py"


def _workers(tmp_path):
    """Two workers of 2 CPU devices each: `(cluster, [proc0, proc1])`; killed at the end."""
    procs = Processes(tmp_path)
    try:
        cluster = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
        started = [procs.worker(cluster, t, "--cpu-devices", 2, "--bind-all") for t in (0, 1)]
        for proc in started:
            procs.wait_line(proc, "^tf_spectrain worker: ")
        yield cluster, started
    finally:
        procs.kill_all()


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    yield from _workers(tmp_path_factory.mktemp("workers"))


@pytest.fixture
def doomed_workers(tmp_path):
    yield from _workers(tmp_path)


def run_child(*args, timeout=180):
    done = subprocess.run([sys.executable, str(CHILD), *map(str, args)], capture_output=True,
                          text=True, env=child_env(), cwd=HERE.parent, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr[-3000:])
    return json.loads(lines[-1])


@pytest.mark.parametrize("mode", ["sync", "spectrain"])
def test_a_pipeline_across_two_workers_equals_the_same_pipeline_on_local_devices(workers, mode):
    cluster, _ = workers
    result = run_child("--cluster", cluster, "--mode", mode)
    assert result["variables_on"] == [
        f"/job:worker/replica:0/task:{t}/device:CPU:{i}" for t in (0, 1) for i in (0, 1)
    ]
    assert result["moved"] > 1e-2  # it trained
    assert result["max_diff"] < 1e-6
    assert result["remote_loss"] == pytest.approx(result["local_loss"], rel=1e-6)


def test_a_killed_worker_makes_fit_fail_at_once_naming_it(doomed_workers):
    cluster, procs = doomed_workers
    result = run_child("--cluster", cluster, "--mode", "stash", "--kill", procs[1].pid)
    assert result["error"] in ("UnavailableError", "WorkerLostError")  # whichever is first
    assert result["after_kill"] < 10.0  # measured: about 0.1 s
    notes = " ".join(result["notes"])
    address = cluster.split(",")[1]
    assert f"worker task 1 ({address}), which held stages 2 and 3" in notes
    assert "resume" in notes
    assert not [t for t in result["threads"] if t.startswith("stage-")]
