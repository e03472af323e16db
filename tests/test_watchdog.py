"""The workers' watchdog (tf_spectrain.cluster.watchdog): a worker that hangs without dying
fails `fit` within the target, naming it; a busy worker is not declared lost; nothing runs
for a local pipeline.

The watchdog and `EpochRun` are checked here with fake probes and fake stages (a stage
"blocked in a remote op" waits on an event that only the test sets); test_remote_pipeline
checks it on a real pipeline across two loopback workers.
"""

import threading
import time

import pytest
import tensorflow as tf

from tf_spectrain.cluster import health, spec, watchdog
from tf_spectrain.runtime import executor, stall
from tf_spectrain.schedule import op_lists

pytestmark = pytest.mark.exclusive  # its deadlines are fractions of a second

CLUSTER = spec.parse_cluster("127.0.0.1:2222,127.0.0.1:2223")


def remote(task, index=0):
    return f"/job:worker/replica:0/task:{task}/device:CPU:{index}"


class FakeProbe:
    """A check that answers after `delay` seconds, raises `error`, or never answers."""

    def __init__(self, delay=0.0, error=None, hang=False):
        self.delay, self.error, self.hang = delay, error, hang
        self.calls = 0
        self.release = threading.Event()  # lets a hung check end at the test's end

    def __call__(self):
        self.calls += 1
        if self.hang:
            self.release.wait()
            return
        time.sleep(self.delay)
        if self.error is not None:
            raise self.error


def start(held, probes, deadline=0.3, interval=0.05):
    reports = []
    dog = watchdog.Watchdog(CLUSTER, held, reports.append, deadline=deadline,
                            interval=interval, label="epoch 3",
                            make_probe=lambda address, task: probes[task])
    return dog.start(), reports


def test_a_worker_that_does_not_answer_in_time_is_declared_lost_by_name():
    probes = {0: FakeProbe(), 1: FakeProbe(hang=True)}
    began = time.monotonic()
    dog, reports = start({0: [0, 1], 1: [2, 3]}, probes, deadline=0.3)
    try:
        assert dog.lost.wait(5.0)
        elapsed = time.monotonic() - began
        time.sleep(0.2)  # no second report
    finally:
        dog.stop()
        probes[1].release.set()
    assert 0.3 <= elapsed < 1.5
    assert reports == [dog.error]
    error = dog.error
    assert isinstance(error, watchdog.WorkerLostError)
    assert isinstance(error, tf.errors.UnavailableError)
    assert error.tasks == [1]
    assert str(error).startswith(
        "During epoch 3, worker task 1 (127.0.0.1:2223), which held stages 2 and 3, did not "
        "answer the watchdog's check within 0.3 s: the worker is stopped or hung, or its "
        "host is unreachable. Training stopped")
    assert "task 0" not in str(error)
    assert "resume from the last checkpoint" in str(error)


def test_a_failing_check_declares_the_worker_lost_at_once_with_the_reason():
    probes = {1: FakeProbe(error=tf.errors.UnavailableError(None, None, "Socket closed"))}
    began = time.monotonic()
    dog, reports = start({1: [4]}, probes, deadline=5.0)
    try:
        assert dog.lost.wait(5.0)
    finally:
        dog.stop()
    assert time.monotonic() - began < 1.0  # did not wait for the deadline
    assert str(dog.error).startswith(
        "During epoch 3, worker task 1 (127.0.0.1:2223), which held stage 4, failed the "
        "watchdog's check (UnavailableError: Socket closed). Training stopped")


def test_slow_answers_within_the_deadline_are_not_a_loss():
    probes = {0: FakeProbe(delay=0.15), 1: FakeProbe(delay=0.05)}
    dog, reports = start({0: [0], 1: [1]}, probes, deadline=0.5, interval=0.05)
    time.sleep(1.2)
    dog.stop()
    assert not dog.lost.is_set() and reports == []
    assert probes[0].calls >= 4 and probes[1].calls >= 4  # checked about every 0.2 s
    assert all(0.14 < s < 0.5 for s in dog.latencies[0])


def test_watch_does_nothing_for_a_local_pipeline_or_without_a_cluster():
    local = ["/CPU:0", "/CPU:1", "/job:localhost/replica:0/task:0/device:CPU:0"]
    assert watchdog.watch(local, print, cluster=CLUSTER) is None
    assert health.connected_cluster() is None  # pytest's process connects to no cluster
    assert watchdog.watch([remote(0), remote(1)], print) is None
    assert health.held_stages([remote(1), "/CPU:0", remote(1, 1), remote(0)], 2) == {
        1: [0, 2], 0: [3]}
    assert health.name_stages([1, 2, 3]) == "stages 1, 2 and 3"


def test_configure_checks_and_returns_the_settings():
    before = watchdog.configure(deadline=3, interval=0.5)
    try:
        assert before == {"deadline": watchdog.DEFAULT_DEADLINE,
                          "interval": watchdog.DEFAULT_INTERVAL}
        assert watchdog.Watchdog(CLUSTER, {0: [0]}, print).deadline == 3.0
        with pytest.raises(ValueError, match="deadline"):
            watchdog.configure(deadline=0)
    finally:
        watchdog.configure(**before)


# --- EpochRun with fake stages ----------------------------------------------------------


class FakeRunner:
    """A stage whose passes return at once, or (`block`) wait on an event in the forward."""

    def __init__(self, device, last=False, block=None, fail=None, fail_after=None):
        self.device, self.last, self.block, self.fail = device, last, block, fail
        self.fail_after = fail_after  # an event the failing forward waits for
        self.entered = threading.Event()  # set once a forward waits on `block`
        self.penalties = {}
        self.made = []  # the layer-loss tensors the forwards made

    def forward(self, key, x, keep, labels=None, scale=1.0):
        penalty = tf.constant(0.5)
        self.made.append(penalty)
        self.penalties.setdefault(key[0], []).append(penalty)
        if self.fail is not None and key[0] == 1:
            self.fail_after.wait(5.0)
            raise self.fail
        if self.block is not None:
            self.entered.set()
            self.block.wait()
        if self.last:
            return tf.constant(1.0), x
        return x

    def backward(self, key, grads_out=None):
        return [tf.constant(0.0)]

    def update(self, learning_rate=None, squares=None, finite=None, apply=True):
        pass

    def flush(self):
        pass

    def reset(self):
        pass


def epoch(runners, batches=4):
    lists = op_lists("stash", len(runners), batches)
    data = iter([(tf.ones((2, 3)), tf.zeros((2,)))] * batches)
    return executor.EpochRun(runners, lists, data, 1, [lambda key: False] * len(runners),
                             label="epoch 0")


@pytest.fixture
def fake_cluster(monkeypatch):
    """`CLUSTER` as the connected cluster; its workers answer unless `hung` holds them."""
    hung = {}
    probes = []

    def make(address, task, timeout=None):
        probe = FakeProbe(hang=task in hung)
        probes.append(probe)
        return probe

    monkeypatch.setattr(health, "connected_cluster", lambda: CLUSTER)
    monkeypatch.setattr(watchdog, "WorkerProbe", make)
    before = watchdog.configure(deadline=0.5, interval=0.1)
    yield hung, probes
    watchdog.configure(**before)
    for probe in probes:
        probe.release.set()


def stage_threads():
    return [t for t in threading.enumerate() if t.name.startswith("stage-")]


def test_a_stage_blocked_on_a_hung_worker_does_not_hang_the_epoch(fake_cluster):
    hung, probes = fake_cluster
    hung[1] = True
    frozen = threading.Event()  # the remote op of stage 1 that never returns
    run = epoch([FakeRunner(remote(0)), FakeRunner(remote(1), last=True, block=frozen)])
    batches = []
    began = time.monotonic()
    try:
        with pytest.raises(watchdog.WorkerLostError, match=r"worker task 1 \(127.0.0.1:2223"
                           r"\), which held stage 1, did not answer"):
            run.run(lambda i, parts: batches.append(i))
        elapsed = time.monotonic() - began
        left = [t.name for t in stage_threads()]
    finally:
        frozen.set()
    # deadline 0.5 s, then at most LOST_JOIN_SECONDS for the threads
    assert elapsed < 0.5 + 0.1 + stall.LEAVE_AFTER_SECONDS + 1.0
    assert left == ["stage-1"]  # stage 0 ended; stage 1 is left behind, a daemon
    assert batches == []
    for t in stage_threads():
        t.join(5.0)
    assert not stage_threads()


def test_a_lost_worker_outranks_an_earlier_failure_and_does_not_hang(fake_cluster):
    # Stage 0 fails while stage 1 is blocked on a hung worker: joining stage 1 would wait
    # for ever; the caller gets the lost worker (its weights cannot be read back), caused
    # by the other failure.
    hung, _ = fake_cluster
    hung[1] = True
    frozen = threading.Event()
    stuck = FakeRunner(remote(1), last=True, block=frozen)
    run = epoch([FakeRunner(remote(0), fail=ValueError("bad batch"), fail_after=stuck.entered),
                 stuck])
    try:
        with pytest.raises(watchdog.WorkerLostError) as info:
            run.run(lambda i, parts: None)
    finally:
        frozen.set()
    assert isinstance(info.value.__cause__, ValueError)
    for t in stage_threads():
        t.join(5.0)


def test_a_read_that_blocks_on_a_hung_worker_does_not_hang_the_caller(fake_cluster):
    hung, _ = fake_cluster
    hung[0] = True
    frozen = threading.Event()  # a read of a variable on the hung worker
    run = epoch([FakeRunner(remote(0)), FakeRunner(remote(1), last=True)])
    began = time.monotonic()
    try:
        with pytest.raises(watchdog.WorkerLostError, match="worker task 0"):
            run.run(lambda i, parts: None, on_begin=lambda i: run.wait_for(frozen.wait))
    finally:
        frozen.set()
    assert time.monotonic() - began < 0.5 + 0.1 + 1.0


def test_a_remote_epoch_hands_the_caller_copies_and_stops_its_watchdog(fake_cluster):
    _, probes = fake_cluster
    runners = [FakeRunner(remote(0)), FakeRunner(remote(1), last=True)]
    seen = []
    run = epoch(runners)

    def on_batch(i, parts):
        penalties = [p for r in runners for p in r.penalties.pop(i)]
        seen.append((i, float(parts[0][0]), [float(p) for p in penalties],
                     any(p is m for p in penalties for r in runners for m in r.made),
                     run.wait_for(lambda: 7)))

    run.run(on_batch)
    assert seen == [(i, 1.0, [0.5, 0.5], False, 7) for i in range(4)]
    assert probes and all(p.calls >= 1 for p in probes)
    time.sleep(0.1)
    assert not [t for t in threading.enumerate()
                if t.name.startswith(("tf_spectrain-watchdog", "tf_spectrain-check"))]


def test_a_local_epoch_starts_no_watchdog(fake_cluster):
    _, probes = fake_cluster
    names = []
    run = epoch([FakeRunner("/CPU:0"), FakeRunner("/CPU:1", last=True)])
    run.run(lambda i, parts: names.append(sorted(t.name for t in threading.enumerate())))
    assert len(names) == 4
    assert not any(n.startswith(("tf_spectrain-watchdog", "tf_spectrain-check"))
                   for batch in names for n in batch)
    assert probes == []
