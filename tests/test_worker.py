"""`python -m tf_spectrain.worker` and `tf_spectrain.connect_cluster`, on 127.0.0.1 only.

Workers run as subprocesses on free loopback ports; each test stops the processes it
started by their pid, also when it fails. The trainer runs in a subprocess too
(tests/cluster_child.py): `experimental_connect_to_cluster` reconfigures the eager
context, which pytest's process shares with every other test.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

import tf_spectrain

HERE = Path(__file__).parent
CHILD = HERE / "cluster_child.py"
FAKE = HERE / "cluster_fake_worker.py"
START_TIMEOUT = 90  # seconds for a worker to print its line (TensorFlow imports on 1 core)


def free_port():
    """A port that nothing listens on now (the kernel's pick for 127.0.0.1)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    env.pop("GRPC_FAIL_FAST", None)
    return dict(env, **extra)


class Processes:
    """Starts child processes and kills every one of them by pid at the end."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.started = []

    def start(self, args, **env):
        n = len(self.started)
        out = open(self.tmp_path / f"out{n}.txt", "w")
        err = open(self.tmp_path / f"err{n}.txt", "w")
        proc = subprocess.Popen([sys.executable, *map(str, args)], stdout=out, stderr=err,
                                env=child_env(**env), cwd=HERE.parent)
        proc.out_path, proc.err_path = out.name, err.name
        out.close()
        err.close()
        self.started.append(proc)
        return proc

    def worker(self, cluster, task, *extra):
        return self.start(["-m", "tf_spectrain.worker", "--cluster", cluster, "--task", task,
                           *extra])

    def wait_line(self, proc, pattern, timeout=START_TIMEOUT):
        """Waits until `proc` prints a line matching `pattern`; returns the line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in Path(proc.out_path).read_text().splitlines():
                if re.search(pattern, line):
                    return line
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"no line {pattern!r} from {proc.args} (exit code {proc.poll()}); "
                    f"stdout: {Path(proc.out_path).read_text()!r}; "
                    f"stderr: {Path(proc.err_path).read_text()[-2000:]!r}")

    def kill_all(self):
        for proc in self.started:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """Two workers of 2 CPU devices each on 127.0.0.1: (cluster, [(proc, line), ...])."""
    procs = Processes(tmp_path_factory.mktemp("workers"))
    try:
        cluster = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
        started = [procs.worker(cluster, t, "--cpu-devices", 2, "--bind-all") for t in (0, 1)]
        lines = [procs.wait_line(p, "^tf_spectrain worker: ") for p in started]
        yield cluster, list(zip(started, lines))
    finally:
        procs.kill_all()


def run_trainer(*args, timeout=120, **env):
    """Runs tests/cluster_child.py; returns its JSON result."""
    done = subprocess.run([sys.executable, str(CHILD), *map(str, args)], capture_output=True,
                          text=True, env=child_env(**env), cwd=HERE.parent, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr[-3000:])
    return json.loads(lines[-1])


def device(task, index):
    return f"/job:worker/replica:0/task:{task}/device:CPU:{index}"


def test_worker_prints_the_address_it_serves_and_its_devices(two_workers):
    cluster, workers = two_workers
    for task, (proc, line) in enumerate(workers):
        address = cluster.split(",")[task]
        port = address.rsplit(":", 1)[1]
        assert line == (
            f"tf_spectrain worker: task {task} of 2 serves {address} (listening on "
            f"[::]:{port}: every interface); devices: {device(task, 0)}, {device(task, 1)}; "
            f"TensorFlow {tf.__version__}, tf_spectrain {tf_spectrain.__version__}"
        )
        assert proc.poll() is None


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs `ss` (iproute2)")
def test_tensorflow_binds_every_interface_as_the_worker_says(two_workers):
    # Read by `ss`, independently of the worker's own /proc reading: TensorFlow 2.21 binds
    # the port on a dual-stack wildcard socket ([::], shown as "*"), not on 127.0.0.1.
    cluster, workers = two_workers
    table = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True,
                           check=True).stdout
    for task, (proc, line) in enumerate(workers):
        port = cluster.split(",")[task].rsplit(":", 1)[1]
        mine = [row.split()[3] for row in table.splitlines() if f"pid={proc.pid}," in row]
        assert mine == [f"*:{port}"], table
        assert "every interface" in line


def test_connect_cluster_lists_the_devices_and_runs_ops_and_variables_remotely(two_workers):
    cluster, _ = two_workers
    result = run_trainer("--cluster", cluster, "--per-worker", 2, "--ops")
    assert result["devices"] == [device(0, 0), device(0, 1), device(1, 0), device(1, 1)]
    assert result["elapsed"] < 10
    assert result["matmul_device"] == device(1, 1)
    assert result["matmul_max_error"] < 1e-5
    assert result["variable_device"] == device(1, 0)
    assert result["variable_max_error"] < 1e-6


def test_connect_cluster_takes_the_devices_per_worker_asked_for(two_workers):
    cluster, _ = two_workers
    assert run_trainer("--cluster", cluster, "--per-worker", 1)["devices"] == [
        device(0, 0), device(1, 0)]
    result = run_trainer("--cluster", cluster, "--per-worker", 3)
    assert result["error"] == "ValueError"
    assert ("task 0 (" in result["message"] and "has 2 CPU device(s)" in result["message"]
            and "start it with --cpu-devices 3" in result["message"])


@pytest.mark.parametrize("dead", [0, 1])
def test_an_address_that_is_not_listening_is_named_within_the_timeout(two_workers, dead):
    cluster, _ = two_workers
    addresses = cluster.split(",")
    addresses[dead] = f"127.0.0.1:{free_port()}"
    result = run_trainer("--cluster", ",".join(addresses), "--timeout", 1.0)
    assert result["error"] == "ConnectionError"
    assert result["message"].startswith(
        f"Worker task {dead} ({addresses[dead]}) is not listening: connection "
        "refused (waited up to 1 s for all workers)")
    assert f"--task {dead} --bind-all" in result["message"]
    assert 0.9 < result["elapsed"] < 3.0


def test_workers_started_with_another_cluster_are_refused(two_workers):
    cluster, _ = two_workers
    a, b = cluster.split(",")
    result = run_trainer("--cluster", f"{b},{a}")
    assert result["error"] == "RuntimeError"
    assert (f"task 0 ({b}) was started as task 1 of --cluster {cluster} (restart it with "
            f"--cluster {b},{a} --task 0); task 1 ({a}) was started as task 0") in (
                result["message"])


def test_the_version_check_names_every_worker_that_differs(processes):
    cluster = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    fakes = [processes.start([FAKE, "--cluster", cluster, "--task", 0, "--play", "old"]),
             processes.worker(cluster, 1, "--bind-all"),
             processes.start([FAKE, "--cluster", cluster, "--task", 2, "--play", "plain"])]
    for proc in fakes:
        processes.wait_line(proc, "^ready$|^tf_spectrain worker: ")
    result = run_trainer("--cluster", cluster)
    assert result["error"] == "RuntimeError"
    a, b, c = cluster.split(",")
    assert result["message"] == (
        f"The workers do not match the trainer, which runs tensorflow {tf.__version__}, "
        f"tf_spectrain {tf_spectrain.__version__}: task 0 ({a}) runs tf_spectrain 0.0.1; "
        f"task 2 ({c}) is a TensorFlow server but not a tf_spectrain worker: it holds no "
        "tf_spectrain record (start it with `python -m tf_spectrain.worker --cluster "
        f"{cluster} --task 2`). Every worker must run the trainer's TensorFlow and "
        "tf_spectrain versions and the trainer's cluster."
    )
    assert f"task 1 ({b})" not in result["message"]


def test_sigterm_and_sigint_stop_a_worker_with_exit_code_0(processes):
    workers = {name: processes.worker(f"127.0.0.1:{free_port()}", 0, "--bind-all")
               for name in ("SIGTERM", "SIGINT")}
    for proc in workers.values():
        processes.wait_line(proc, "^tf_spectrain worker: ")
    for name, proc in workers.items():
        start = time.monotonic()
        os.kill(proc.pid, getattr(signal, name))
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - start < 2.0
        assert processes.wait_line(proc, "stopped by").endswith(f"stopped by {name}")


def test_a_worker_refuses_a_wildcard_bind_unless_asked(processes):
    port = free_port()
    proc = processes.worker(f"127.0.0.1:{port}", 0)
    assert proc.wait(timeout=START_TIMEOUT) == 1
    error = Path(proc.err_path).read_text()
    assert (f"error: The TensorFlow server of task 0 listens on every interface, not only on "
            f"127.0.0.1: it listens on [::]:{port} (bound, not serving") in error
    assert "Pass --bind-all" in error
    assert Path(proc.out_path).read_text() == ""
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_bad_worker_arguments_exit_with_code_2(processes):
    proc = processes.start(["-m", "tf_spectrain.worker", "--cluster", "127.0.0.1:1,h", "--task",
                            0])
    assert proc.wait(timeout=START_TIMEOUT) == 2
    assert ("error: --cluster must be a comma-separated list of worker addresses, each "
            "host:port") in Path(proc.err_path).read_text()
    assert "task 1 is 'h' has no port" in Path(proc.err_path).read_text()


def test_tf_config_starts_a_worker_and_makes_the_trainer_the_chief(processes):
    worker, chief = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    jobs = {"worker": [worker], "chief": [chief]}

    def tf_config(kind):
        return json.dumps({"cluster": jobs, "task": {"type": kind, "index": 0}})

    proc = processes.start(["-m", "tf_spectrain.worker", "--bind-all", "--cpu-devices", 2],
                           TF_CONFIG=tf_config("worker"))
    assert processes.wait_line(proc, "^tf_spectrain worker: ").startswith(
        f"tf_spectrain worker: task 0 of 1 serves {worker} (listening on ")
    result = run_trainer("--cluster", "TF_CONFIG", TF_CONFIG=tf_config("chief"))
    assert result["devices"] == [device(0, 0), device(0, 1)]
    assert result["local"] == "/job:chief/replica:0/task:0/device:CPU:0"
