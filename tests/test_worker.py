"""`python -m tf_spectrain.app.worker` and `tf_spectrain.connect_cluster`, on 127.0.0.1 only.

Workers run as subprocesses on free loopback ports; the tests stop the processes they
started by their pid, also when they fail. The workers the trainer connects to are started
once for the module (`servers`), and the trainer runs once too (`trainer`), in a subprocess
(tests/cluster_child.py) that makes every connection the tests check, one after the other,
and reports each: `experimental_connect_to_cluster` reconfigures the eager context, which
pytest's process shares with every other test.
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
from types import SimpleNamespace

import pytest
import tensorflow as tf

import tf_spectrain

# Not exclusive: the time bounds below only tell a bounded wait from a hang, with room for a
# machine the other test worker keeps busy (a 1 s connection timeout ends within 6 s).
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
        return self.start(["-m", "tf_spectrain.app.worker", "--cluster", cluster, "--task", task,
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
def servers(tmp_path_factory):
    """Every worker process the trainer connects to, started at once; killed at the end.

    `cluster`: two workers of 2 CPU devices each (`pair`: each with the line it printed,
    and `alive`, whether it was still running once all had printed theirs); `table`: what
    `ss -ltnpH` showed then (None without `ss`). `mixed`: the version check's 3 tasks, all
    in one process (tests/cluster_fake_worker.py): an old tf_spectrain worker, a real one
    and a plain TensorFlow server. `jobs`: a worker of 2 CPU devices started from TF_CONFIG
    (`configured`, with its line), and the trainer's chief address.
    """
    procs = Processes(tmp_path_factory.mktemp("servers"))
    try:
        cluster = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
        mixed = ",".join(f"127.0.0.1:{free_port()}" for _ in range(3))
        jobs = {"worker": [f"127.0.0.1:{free_port()}"], "chief": [f"127.0.0.1:{free_port()}"]}
        pair = [procs.worker(cluster, t, "--cpu-devices", 2, "--bind-all") for t in (0, 1)]
        fake = procs.start([FAKE, "--cluster", mixed, "--play", "0:old", "--play", "1:real",
                            "--play", "2:plain"])
        configured = procs.start(["-m", "tf_spectrain.app.worker", "--bind-all",
                                  "--cpu-devices", 2],
                                 TF_CONFIG=tf_config(jobs, "worker"))
        lines = [procs.wait_line(p, "^tf_spectrain worker: ") for p in (*pair, configured)]
        procs.wait_line(fake, "^ready$")
        alive = [p.poll() is None for p in pair]
        table = None if shutil.which("ss") is None else subprocess.run(
            ["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
        yield SimpleNamespace(procs=procs, cluster=cluster, pair=list(zip(pair, lines[:2])),
                              alive=alive, table=table, mixed=mixed, jobs=jobs,
                              configured=configured, configured_line=lines[2])
    finally:
        procs.kill_all()


def tf_config(jobs, kind):
    return json.dumps({"cluster": jobs, "task": {"type": kind, "index": 0}})


@pytest.fixture(scope="module")
def trainer(servers):
    """Runs tests/cluster_child.py once, for every case; returns `(completed run, dead)`.

    `dead[k]` is the cluster whose task k is an address that nothing listens on. The cases
    that connect come after those that cannot; the one that makes the trainer the chief
    comes last (it starts a server in the trainer).
    """
    a, b = servers.cluster.split(",")
    dead = [f"127.0.0.1:{free_port()},{b}", f"{a},127.0.0.1:{free_port()}"]
    cases = [
        *({"name": f"dead{k}", "cluster": dead[k], "timeout": 1.0} for k in (0, 1)),
        {"name": "ops", "cluster": servers.cluster, "per_worker": 2, "ops": True},
        {"name": "per_worker_1", "cluster": servers.cluster, "per_worker": 1},
        {"name": "per_worker_3", "cluster": servers.cluster, "per_worker": 3},
        {"name": "swapped", "cluster": f"{b},{a}"},
        {"name": "versions", "cluster": servers.mixed},
        {"name": "chief", "cluster": "TF_CONFIG", "tf_config": tf_config(servers.jobs, "chief")},
    ]
    done = subprocess.run([sys.executable, str(CHILD), json.dumps(cases)], capture_output=True,
                          text=True, env=child_env(), cwd=HERE.parent, timeout=300)
    return done, dead


def result_of(trainer, name):
    """The JSON result of case `name` of the trainer's run."""
    done, _ = trainer
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr[-3000:])
    result = json.loads(lines[-1])[name]
    assert "failed" not in result, result
    return result


def device(task, index):
    return f"/job:worker/replica:0/task:{task}/device:CPU:{index}"


def test_worker_prints_the_address_it_serves_and_its_devices(servers):
    for task, (_, line) in enumerate(servers.pair):
        address = servers.cluster.split(",")[task]
        port = address.rsplit(":", 1)[1]
        assert line == (
            f"tf_spectrain worker: task {task} of 2 serves {address} (listening on "
            f"[::]:{port}: every interface); devices: {device(task, 0)}, {device(task, 1)}; "
            f"TensorFlow {tf.__version__}, tf_spectrain {tf_spectrain.__version__}"
        )
        assert servers.alive[task]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs `ss` (iproute2)")
def test_tensorflow_binds_every_interface_as_the_worker_says(servers):
    # Read by `ss` (while the workers ran, before any test signals one), independently of
    # the worker's own /proc reading: TensorFlow 2.21 binds the port on a dual-stack
    # wildcard socket ([::], shown as "*"), not on 127.0.0.1.
    table = servers.table
    for task, (proc, line) in enumerate(servers.pair):
        port = servers.cluster.split(",")[task].rsplit(":", 1)[1]
        mine = [row.split()[3] for row in table.splitlines() if f"pid={proc.pid}," in row]
        assert mine == [f"*:{port}"], table
        assert "every interface" in line


def test_connect_cluster_lists_the_devices_and_runs_ops_and_variables_remotely(trainer):
    result = result_of(trainer, "ops")
    assert result["devices"] == [device(0, 0), device(0, 1), device(1, 0), device(1, 1)]
    assert result["elapsed"] < 20
    assert result["matmul_device"] == device(1, 1)
    assert result["matmul_max_error"] < 1e-5
    assert result["variable_device"] == device(1, 0)
    assert result["variable_max_error"] < 1e-6


def test_connect_cluster_takes_the_devices_per_worker_asked_for(trainer):
    assert result_of(trainer, "per_worker_1")["devices"] == [device(0, 0), device(1, 0)]
    result = result_of(trainer, "per_worker_3")
    assert result["error"] == "ValueError"
    assert ("task 0 (" in result["message"] and "has 2 CPU device(s)" in result["message"]
            and "start it with --cpu-devices 3" in result["message"])


@pytest.mark.parametrize("dead", [0, 1])
def test_an_address_that_is_not_listening_is_named_within_the_timeout(trainer, dead):
    addresses = trainer[1][dead].split(",")
    result = result_of(trainer, f"dead{dead}")
    assert result["error"] == "ConnectionError"
    assert result["message"].startswith(
        f"Worker task {dead} ({addresses[dead]}) is not listening: connection "
        "refused (waited up to 1 s for all workers)")
    assert f"--task {dead} --bind-all" in result["message"]
    assert 0.9 < result["elapsed"] < 6.0


def test_workers_started_with_another_cluster_are_refused(servers, trainer):
    a, b = servers.cluster.split(",")
    result = result_of(trainer, "swapped")
    assert result["error"] == "RuntimeError"
    assert (f"task 0 ({b}) was started as task 1 of --cluster {servers.cluster} (restart it "
            f"with --cluster {b},{a} --task 0); task 1 ({a}) was started as task 0") in (
                result["message"])


def test_the_version_check_names_every_worker_that_differs(servers, trainer):
    cluster = servers.mixed
    result = result_of(trainer, "versions")
    assert result["error"] == "RuntimeError"
    a, b, c = cluster.split(",")
    assert result["message"] == (
        f"The workers do not match the trainer, which runs tensorflow {tf.__version__}, "
        f"tf_spectrain {tf_spectrain.__version__}: task 0 ({a}) runs tf_spectrain 0.0.1; "
        f"task 2 ({c}) is a TensorFlow server but not a tf_spectrain worker: it holds no "
        "tf_spectrain record (start it with `python -m tf_spectrain.app.worker --cluster "
        f"{cluster} --task 2`). Every worker must run the trainer's TensorFlow and "
        "tf_spectrain versions and the trainer's cluster."
    )
    assert f"task 1 ({b})" not in result["message"]


def test_tf_config_starts_a_worker_and_makes_the_trainer_the_chief(servers, trainer):
    assert servers.configured_line.startswith(
        f"tf_spectrain worker: task 0 of 1 serves {servers.jobs['worker'][0]} (listening on ")
    result = result_of(trainer, "chief")
    assert result["devices"] == [device(0, 0), device(0, 1)]
    assert result["local"] == "/job:chief/replica:0/task:0/device:CPU:0"


def test_sigterm_and_sigint_stop_a_worker_with_exit_code_0(servers, trainer):
    # Worker 1 of the pair and the TF_CONFIG worker: the trainer is done with them (the
    # `trainer` fixture has run), and the other tests read what the fixtures recorded.
    workers = {"SIGTERM": servers.pair[1][0], "SIGINT": servers.configured}
    for name, proc in workers.items():
        assert proc.poll() is None
        start = time.monotonic()
        os.kill(proc.pid, getattr(signal, name))
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - start < 5.0
        assert servers.procs.wait_line(proc, "stopped by").endswith(f"stopped by {name}")


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


def test_bad_worker_arguments_exit_with_code_2(capsys):
    # `main` in this process (its return value is the exit code `python -m
    # tf_spectrain.app.worker` ends with; a worker process costs seconds of imports, and the
    # `servers` fixture starts real ones): the arguments are refused before any server
    # starts. main installs its stop-signal handlers first; they are put back after.
    from tf_spectrain.app import worker

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = worker.main(["--cluster", "127.0.0.1:1,h", "--task", "0"])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    err = capsys.readouterr().err
    assert code == 2
    assert ("error: --cluster must be a comma-separated list of worker addresses, each "
            "host:port") in err
    assert "task 1 is 'h' has no port" in err
