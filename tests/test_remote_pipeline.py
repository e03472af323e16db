"""A pipeline across worker processes on 127.0.0.1: same weights as on local devices, a
killed worker makes `fit` fail at once, naming the worker, its address and its stages, and
the watchdog (tf_spectrain.cluster.watchdog) tells a busy worker from a hung one.

The trainer runs in a subprocess (tests/remote_pipeline_child.py, started once for this module
by `loopback_run`): connecting reconfigures the eager context that pytest's process shares
with every other test. It trains past a stage whose every forward keeps its worker busy for
1.2 s under a watchdog deadline of 0.4 s (checks every 0.3 s), then stops (SIGSTOP) worker 1
in the middle of an epoch under the default watchdog, and kills it (SIGKILL) at the end.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_worker import HERE, Processes, child_env, free_port

from tf_spectrain.cluster import watchdog

# The tests of `loopback_run` are exclusive: its workers answer within watchdog deadlines of
# fractions of a second. The killed-worker runs allow 30 s and share the cores.
exclusive = pytest.mark.exclusive

CHILD = HERE / "remote_pipeline_child.py"
BUSY_SECONDS = 1.2  # each forward of the busy stage
BUSY_DEADLINE = 0.4  # the watchdog's deadline while it runs: a third of a forward
BUSY_INTERVAL = 0.3  # between rounds of checks: about 4 rounds in each forward


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


@pytest.fixture
def doomed_workers(tmp_path):  # killed by the test itself
    yield from _workers(tmp_path)


def run_child(*args, timeout=180):
    done = subprocess.run([sys.executable, str(CHILD), *map(str, args)], capture_output=True,
                          text=True, env=child_env(), cwd=HERE.parent, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr[-9000:])
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def loopback_run(tmp_path_factory):
    """One trainer child (tests/remote_pipeline_child.py) on two loopback workers of 2 CPU
    devices each: each start of a trainer or a worker costs seconds of TensorFlow imports,
    so one child makes the checks of this module's equality and watchdog tests.

    In order: the `--mode` pipelines equal local ones (result `equal`), a busy worker under
    a short watchdog deadline (`busy`), then worker 1 stopped and killed (`stop`); also the
    `cluster` string. The workers are killed (by pid) before the result is returned.
    """
    workers = _workers(tmp_path_factory.mktemp("loopback"))
    cluster, procs = next(workers)
    try:
        result = run_child("--cluster", cluster, "--mode", "sync,spectrain",
                           "--slow", BUSY_SECONDS, "--deadline", BUSY_DEADLINE,
                           "--interval", BUSY_INTERVAL, "--stop", procs[1].pid)
    finally:
        workers.close()  # kills both workers by pid
    return dict(result, cluster=cluster)


@exclusive
def test_a_pipeline_across_two_workers_equals_the_same_pipeline_on_local_devices(loopback_run):
    # the module's child, which then makes the watchdog checks below on the same workers
    results = dict(loopback_run["equal"])
    assert set(results) == {"sync", "spectrain", "replicas"}
    replicas = results.pop("replicas")
    for result in results.values():
        _check_equal(result)
    # Replicas on two workers (their gradients summed across them) equal one pipeline.
    assert replicas["variables_on"] == [
        [f"/job:worker/replica:0/task:{t}/device:CPU:{i}" for i in (0, 1)] for t in (0, 1)]
    assert replicas["moved"] > 1e-2
    assert replicas["max_diff"] < 1e-5
    assert replicas["remote_loss"] == pytest.approx(replicas["local_loss"], rel=1e-5)


def _check_equal(result):
    assert result["variables_on"] == [
        f"/job:worker/replica:0/task:{t}/device:CPU:{i}" for t in (0, 1) for i in (0, 1)
    ]
    assert result["moved"] > 1e-2  # it trained
    assert result["max_diff"] < 1e-6
    assert result["remote_loss"] == pytest.approx(result["local_loss"], rel=1e-6)


def test_a_run_whose_worker_dies_resumes_on_a_fresh_cluster(doomed_workers, tmp_path):
    cluster, procs = doomed_workers
    logdir = tmp_path / "run"
    flags = ["--gpus-per-host", "2", "--model", "mlp", "--mode", "spectrain", "--cuts",
             "flatten,dense1,dense2", "--batch-size", "8", "--limit", "128", "--logdir", logdir,
             "--export", "none"]
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    # The fresh cluster's workers start now, while the first trainer trains (they idle).
    (tmp_path / "fresh").mkdir()
    fresh = Processes(tmp_path / "fresh")
    try:
        new = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
        starting = [fresh.worker(new, t, "--cpu-devices", 2, "--bind-all") for t in (0, 1)]
        failed_after, out, err = _kill_mid_run(cluster, procs, flags, logdir, out_path,
                                               err_path)
        assert failed_after < 30.0, failed_after
        named = f"worker task 1 ({cluster.split(',')[1]}), which held stages 2 and 3"
        assert named in out + err, err[-4000:]
        for proc in starting:
            fresh.wait_line(proc, "^tf_spectrain worker: ")
        done = subprocess.run(
            [sys.executable, "train.py", "--cluster", new, "--epochs", "2", "--resume",
             *map(str, flags)], capture_output=True, text=True, env=child_env(),
            cwd=HERE.parent, timeout=240)
    finally:
        fresh.kill_all()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "connected to 2 workers; stages on /job:worker/replica:0/task:0/device:CPU:0" in out
    assert "test accuracy" in done.stdout  # train.py --resume, in a new trainer process


def test_a_windowed_run_whose_worker_dies_stops_naming_it(doomed_workers, tmp_path):
    # Windows (--prediction-every 0: steps_per_execution "auto" runs a graph call per
    # mini-batch on workers' CPUs, the passes of both workers in it): a lost worker stops
    # them as promptly, named.
    cluster, procs = doomed_workers
    logdir = tmp_path / "run"
    flags = ["--gpus-per-host", "2", "--model", "mlp", "--mode", "stash", "--cuts",
             "flatten,dense1,dense2", "--batch-size", "8", "--limit", "512", "--logdir", logdir,
             "--export", "none", "--prediction-every", "0"]
    failed_after, out, err = _kill_mid_run(cluster, procs, flags, logdir,
                                           tmp_path / "out.txt", tmp_path / "err.txt")
    assert failed_after < 30.0, failed_after
    named = f"worker task 1 ({cluster.split(',')[1]}), which held stages 2 and 3"
    assert named in out + err, err[-4000:]


def _kill_mid_run(cluster, procs, flags, logdir, out_path, err_path):
    """Runs train.py on `cluster`, kills worker 1 after the first checkpoint; returns
    (seconds from the kill to the trainer's exit, its stdout, its stderr)."""
    with open(out_path, "w") as out, open(err_path, "w") as err:  # no pipe to fill up
        trainer = subprocess.Popen(
            [sys.executable, "train.py", "--cluster", cluster, "--epochs", "50",
             *map(str, flags)], stdout=out, stderr=err, env=child_env(PYTHONFAULTHANDLER="1"),
            cwd=HERE.parent)
    try:
        deadline = time.monotonic() + 180
        while (not list((logdir / "checkpoints").glob("*")) and time.monotonic() < deadline
               and trainer.poll() is None):
            time.sleep(0.2)  # the first epoch's checkpoint
        assert trainer.poll() is None, err_path.read_text()[-3000:]
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            trainer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            trainer.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            trainer.wait(timeout=30)
            pytest.fail("train.py hung after the kill:\n" + err_path.read_text()[-12000:])
        failed_after = time.monotonic() - killed
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode != 0
    return failed_after, out_path.read_text(), err_path.read_text()


# --- the watchdog on the same workers ------------------------------------------------------


@exclusive
def test_a_busy_worker_is_not_declared_lost(loopback_run):
    busy = loopback_run["busy"]
    assert busy["error"] is None
    forwards = busy["forwards"]
    assert len(forwards) == 2 and all(
        end - start > BUSY_SECONDS - 0.1 for start, end in forwards)
    # Worker 1 was checked while it ran stage 3's long forwards, and answered at once
    # (within half the deadline; measured: a few ms).
    during = [(s, e) for task, s, e in busy["checks"] if task == 1
              and any(fs < s and e < fe for fs, fe in forwards)]
    assert len(during) >= 2, busy
    assert max(e - s for s, e in during) < min(0.5, BUSY_DEADLINE / 2)


@exclusive
def test_a_stopped_worker_fails_fit_within_the_target_naming_it(loopback_run):
    stop = loopback_run["stop"]
    address = loopback_run["cluster"].split(",")[1]
    assert stop["error"] == "WorkerLostError" and stop["unavailable"]
    assert stop["message"].startswith(
        f"During epoch 0, worker task 1 ({address}), which held stages 2 and 3, did not "
        f"answer the watchdog's check within {watchdog.DEFAULT_DEADLINE:g} s")
    assert "task 0" not in stop["message"]
    assert watchdog.DEFAULT_DEADLINE < stop["after_stop"] < 10.0  # measured: about 8.3 s
    # Once the stopped worker is killed, the threads blocked on it end too.
    assert not [t for t in stop["threads_after_kill"] if t.startswith("stage-")]
