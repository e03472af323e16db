"""Never a silent hang (`runtime.stall`): a run in which no stage finishes a pass stops.

A stage is made to block (a layer whose `py_function` waits on an event, a hand-off that is
dropped, a data generator that waits) in `fit` pass by pass and in windows, in every mode,
and in `predict` and `evaluate`: the call must end within the timeout (plus the watch's
check interval and thread start-up) with a `PipelineStalledError` that names each stage's
device, its instruction and what it waits for. Threads blocked on hand-offs end at once; a
thread inside an op is left behind until the op returns, and the stages refuse to run
until then. Shapes users report hanging (fewer micro-batches than stages, a last mini-batch
smaller than the stages or replicas, one-sample `predict`, an empty validation set) finish.
The watch's own logic (pauses, polls, messages) is checked on its own with short timeouts.
"""

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from runtimes import EAGER, compile_quietly

from tf_spectrain import PipelineStalledError
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime import handoff, stall
from tf_spectrain.schedule import op_lists
from tf_spectrain.schedule.windows import EpochWindows

TIMEOUT = 2.0
# The watch checks every min(1 s, timeout / 20); threads and a trace add a little.
MARGIN = 6.0
BATCH = 8


GATES = {}  # name -> {"gate": Event, "after": calls that pass, "calls": calls so far}


class Blocker(keras.layers.Layer):
    """The identity, plus the zeros of a py_function that blocks on `GATES[gate]` after
    `after` calls (counted over the copies of the layer that the stages hold)."""

    def __init__(self, gate, **kwargs):
        super().__init__(**kwargs)
        self.gate = gate

    def get_config(self):
        return dict(super().get_config(), gate=self.gate)

    def call(self, x):
        state = GATES[self.gate]

        def zeros(t):
            state["calls"] += 1
            if state["calls"] > state["after"]:
                state["gate"].wait(60)
            return tf.zeros_like(t)

        # Called in forwards only: a py_function's own gradient would call it again.
        blocked = tf.stop_gradient(tf.py_function(zeros, [x], x.dtype))
        blocked.set_shape(x.shape)
        return x + blocked


def gate(after=3):
    """A new gate: its blocker lets `after` calls pass, then blocks until it is set."""
    name = f"gate{len(GATES)}"
    GATES[name] = {"gate": threading.Event(), "after": after, "calls": 0}
    return name


def model(blocked_on=None):
    """dense0 | [a Blocker on gate `blocked_on`] dense1 | out: 3 stages at CUTS."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(8, activation="relu", name="dense0")(inputs)
    if blocked_on is not None:
        h = Blocker(blocked_on, name="blocker")(h)
    h = keras.layers.Dense(8, activation="tanh", name="dense1")(h)
    out = keras.layers.Dense(3, name="out")(h)
    return keras.Model(inputs, out)


CUTS = ["dense0", "dense1"]


def data(n=64):
    rng = np.random.default_rng(1)
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def pipeline(net, spe=EAGER, mode="sync", timeout=TIMEOUT, cuts=CUTS, **options):
    pipe = PipelineModel(net, cuts=cuts, mode=mode, stall_timeout=timeout, **options)
    compile_quietly(pipe, keras.optimizers.SGD(0.05, momentum=0.9),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=spe)
    return pipe


def release(name, pipe):
    """Opens gate `name` and waits until no thread of `pipe` is left behind (at most 30 s)."""
    GATES[name]["gate"].set()
    runners = pipe.all_runners
    deadline = time.monotonic() + 30
    while True:
        try:
            stall.refuse_if_left_behind(runners)
            return
        except PipelineStalledError:
            assert time.monotonic() < deadline, "a thread left behind never returned"
            time.sleep(0.05)


def stage_threads():
    """Names of the live threads that run stages or windows."""
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith(("stage-", "infer-", "tf_spectrain-window")))


def stalled(call):
    """Runs `call()`, which must stall; returns (error, seconds)."""
    started = time.monotonic()
    with pytest.raises(PipelineStalledError) as info:
        call()
    return info.value, time.monotonic() - started


# --- a blocked layer ends fit, predict and evaluate ----------------------------------------


@pytest.mark.parametrize("spe", [EAGER, 4])
@pytest.mark.parametrize("mode", ["sync", "spectrain"])  # vanilla and stash: spectrain's runs
def test_a_stage_stuck_in_a_layer_ends_fit_with_where_each_stage_is(mode, spe):
    name = gate()
    pipe = pipeline(model(name), spe=spe, mode=mode)
    x, y = data()
    error, seconds = stalled(lambda: pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0))
    try:
        assert seconds < TIMEOUT + MARGIN
        text = str(error)
        assert f"stall_timeout={TIMEOUT:g}" in text and "epoch 0" in text
        assert len(error.stages) == 3
        for k, line in enumerate(error.stages):
            assert line.startswith(f"stage {k} on {pipe.devices[k]}: "), line
        # Stage 1 holds the blocker: it is inside its pass; stage 2 waits for its output.
        assert "running for" in error.stages[1], error.stages
        assert "waiting for the activations of micro-batch" in error.stages[2], error.stages
        assert "from stage 1" in error.stages[2]
        # The blocked thread is left behind, and the pipeline refuses to run until it returns.
        with pytest.raises(PipelineStalledError, match="still inside a pass"):
            pipe.predict(x[:4], verbose=0)
    finally:
        release(name, pipe)
    assert stage_threads() == []
    GATES[name]["after"] = 10**9
    history = pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # runs again
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize("spe", [EAGER, 4])
def test_a_stuck_replica_with_micro_batches_ends_fit(spe):
    name = gate(after=5)
    pipe = pipeline(model(name), spe=spe, cuts=["dense0"], replicas=2, micro_batches=2,
                    schedule="1f1b")
    x, y = data()
    try:
        error, seconds = stalled(lambda: pipe.fit(x, y, batch_size=BATCH, epochs=1,
                                                  verbose=0))
        assert seconds < TIMEOUT + MARGIN
        assert [line.split(": ")[0] for line in error.stages] == [
            "stage 0 of replica 0 on /CPU:0", "stage 1 of replica 0 on /CPU:1",
            "stage 0 of replica 1 on /CPU:2", "stage 1 of replica 1 on /CPU:3"]
        assert any("running for" in line for line in error.stages[1::2]), error.stages
    finally:
        release(name, pipe)
    assert stage_threads() == []


@pytest.mark.parametrize("method", ["predict", "evaluate"])
def test_a_stage_stuck_in_a_layer_ends_predict_and_evaluate(method):
    name = gate(after=2)
    pipe = pipeline(model(name))
    x, y = data()
    call = {"predict": lambda: pipe.predict(x, batch_size=BATCH, verbose=0),
            "evaluate": lambda: pipe.evaluate(x, y, batch_size=BATCH, verbose=0)}[method]
    try:
        error, seconds = stalled(call)
        assert seconds < TIMEOUT + MARGIN
        assert "an inference pipeline" in str(error)
        assert error.stages[1].startswith(f"stage 1 on {pipe.devices[1]}: the inference "
                                          "forward of batch 2: running for")
        assert "waiting for batch 2 from stage 1" in error.stages[2]
    finally:
        release(name, pipe)
    assert stage_threads() == []


def test_a_checkpoint_written_before_the_stall_is_intact(tmp_path):
    from tf_spectrain import checkpoint

    name = gate(after=10**9)
    pipe = pipeline(model(name))
    x, y = data()
    saver = checkpoint.PipelineCheckpoint(str(tmp_path), keep=3)
    pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[saver])
    before = {p: open(p, "rb").read() for p in _files(tmp_path)}
    GATES[name]["after"] = GATES[name]["calls"] + 5
    try:
        stalled(lambda: pipe.fit(x, y, batch_size=BATCH, epochs=3, initial_epoch=1,
                                 verbose=0, callbacks=[saver]))
    finally:
        release(name, pipe)
    assert {p: open(p, "rb").read() for p in _files(tmp_path)} == before
    info = checkpoint.restore_checkpoint(pipe, checkpoint.latest_checkpoint(str(tmp_path)))
    assert info["epoch"] == 1


def _files(root):
    return sorted(str(p) for p in root.rglob("*") if p.is_file())


# --- a hand-off that never comes, data that never come -------------------------------------


def test_a_dropped_hand_off_ends_fit_and_every_thread(monkeypatch):
    put = handoff.Channel.put
    seen = {}

    def dropping(self, item):
        if self.name == "activations 0->1":
            seen[self.name] = seen.get(self.name, 0) + 1
            if seen[self.name] == 3:
                return  # lost: stage 1 waits for it for ever
        put(self, item)

    monkeypatch.setattr(handoff.Channel, "put", dropping)
    pipe = pipeline(model())
    x, y = data()
    error, seconds = stalled(lambda: pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0))
    assert seconds < TIMEOUT + MARGIN
    assert "waiting for the activations of micro-batch 2.0 from stage 0" in error.stages[1]
    assert "waiting for" in error.stages[2]
    assert stage_threads() == []  # blocked on hand-offs: all woke and ended
    stall.refuse_if_left_behind(pipe.all_runners)  # nothing left behind


@pytest.mark.parametrize("spe", [EAGER, 4])
def test_data_that_never_come_end_fit(spe):
    name = gate()
    x, y = data()

    def batches():
        for i in range(0, 64, BATCH):
            if i == 3 * BATCH:
                GATES[name]["gate"].wait(60)
            yield x[i:i + BATCH], y[i:i + BATCH]

    pipe = pipeline(model(), spe=spe)
    try:
        error, seconds = stalled(lambda: pipe.fit(batches(), steps_per_epoch=8, epochs=1,
                                                  verbose=0))
        assert seconds < TIMEOUT + MARGIN
        assert "waiting for mini-batch 3 from the data" in error.stages[0], error.stages
    finally:
        release(name, pipe)


# --- what must not stop ---------------------------------------------------------------------


@pytest.mark.parametrize("spe", [EAGER, 4])
def test_slow_callbacks_do_not_count_as_a_stall(spe):
    class Slow(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            time.sleep(1.5 * TIMEOUT / 2)

        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                time.sleep(1.5 * TIMEOUT / 2)

    pipe = pipeline(model(), spe=spe, timeout=TIMEOUT / 2)
    x, y = data()
    history = pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[Slow()])
    assert np.isfinite(history.history["loss"][0])


def test_no_timeout_never_stops():
    pipe = pipeline(model(), timeout=None)
    assert pipe.stall_timeout is None
    x, y = data(16)
    pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


@pytest.mark.parametrize("value, error", [
    (0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), ("60", TypeError),
    (True, TypeError)])
def test_bad_stall_timeouts_are_refused(value, error):
    with pytest.raises(error, match=r"`stall_timeout` must be a number of seconds > 0, or "
                                    r"None \(never stop\)"):
        PipelineModel(model(), cuts=CUTS, stall_timeout=value)


# --- shapes users report hanging: they finish (a hang would stall here, not hang) ----------

SHAPES_TIMEOUT = 30.0


def _keras_twin(net):
    twin = keras.models.clone_model(net)
    twin.set_weights(net.get_weights())
    return twin


@pytest.mark.parametrize("spe", [EAGER, 4])
def test_fewer_micro_batches_than_stages_finishes(spe):
    x, y = data()
    pipe = pipeline(model(), spe=spe, timeout=SHAPES_TIMEOUT, micro_batches=2,
                    schedule="1f1b", cuts=["dense0", "dense1"])
    history = pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1 and pipe.progress.epoch_progress[1] == 8


@pytest.mark.parametrize("spe", [EAGER, 4])
@pytest.mark.parametrize("mode", ["sync", "spectrain"])
def test_a_last_mini_batch_smaller_than_the_stages_finishes(mode, spe):
    x, y = data(2 * BATCH + 2)  # the last mini-batch: 2 examples, 3 stages
    pipe = pipeline(model(), spe=spe, mode=mode, timeout=SHAPES_TIMEOUT)
    pipe.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    assert pipe.progress.epoch_progress[1:] == (3, 3)


def test_a_last_mini_batch_smaller_than_the_replicas_says_so():
    x, y = data(BATCH + 1)  # the last mini-batch: 1 example, 2 replicas
    net = model()
    pipe = PipelineModel(net, cuts=["dense1"], replicas=2, mode="sync",
                         stall_timeout=SHAPES_TIMEOUT)
    pipe.compile(keras.optimizers.SGD(0.05),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="replicas"):
        pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert stage_threads() == []


def test_one_sample_predict_equals_keras():
    net = model()
    pipe = pipeline(net, timeout=SHAPES_TIMEOUT)
    x, _ = data(1)
    np.testing.assert_allclose(pipe.predict(x, verbose=0), _keras_twin(net).predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_an_empty_validation_set_says_so_and_does_not_hang():
    pipe = pipeline(model(), timeout=SHAPES_TIMEOUT)
    x, y = data()
    with pytest.raises(ValueError):
        pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                 validation_data=(x[:0], y[:0]))
    assert stage_threads() == []


# --- the watch itself -----------------------------------------------------------------------


def test_the_watch_reports_once_idle_for_the_timeout_and_not_while_paused():
    progress = stall.Progress()
    where = progress.record("stage 0 on /CPU:0")
    where.at("op 1 of 2, the forward of micro-batch 0.0")
    where.waits("mini-batch 0 from the data")
    errors = []
    with stall.StallWatch(progress, 0.4, errors.append, label="epoch 7"):
        with progress.paused():
            time.sleep(0.8)  # paused: no stall
        assert errors == []
        time.sleep(1.2)
    assert len(errors) == 1
    error = errors[0]
    assert "for 0.4 s in epoch 7 (stall_timeout=0.4)" in str(error)
    assert error.stages[0].startswith("stage 0 on /CPU:0: op 1 of 2, the forward of "
                                      "micro-batch 0.0: waiting for mini-batch 0 from the data "
                                      "for ")


def test_a_poll_that_sees_progress_keeps_the_watch_quiet():
    progress, errors, polls = stall.Progress(), [], []

    def poll():
        polls.append(1)
        return True

    with stall.StallWatch(progress, 0.3, errors.append, poll=poll):
        time.sleep(1.0)
    assert errors == [] and len(polls) >= 10


def test_tracing_pauses_the_attached_progress_of_this_thread_only():
    progress = stall.Progress()
    with stall.tracing():  # nothing attached: nothing paused
        assert progress.idle_seconds(time.monotonic() + 5) > 4
    progress.attach()
    try:
        with stall.tracing():
            assert progress.idle_seconds(time.monotonic() + 5) == 0
    finally:
        progress.detach()
    assert progress.idle_seconds(time.monotonic() + 5) > 4


def test_a_thread_left_behind_is_refused_until_it_returns():
    gate, owner = threading.Event(), object()
    thread = threading.Thread(target=gate.wait, daemon=True)
    thread.start()
    left = stall.join_or_leave([(thread, None)], lambda: True)
    assert [t for t, _ in left] == [thread]
    stall.leave_behind(left, [owner])
    stall.refuse_if_left_behind([object()])  # another pipeline's stages run
    with pytest.raises(PipelineStalledError, match="still inside a pass"):
        stall.refuse_if_left_behind([owner])
    gate.set()
    thread.join()
    assert stall.refuse_if_left_behind([owner]) is True  # returned: the caller resets state
    assert stall.refuse_if_left_behind([owner]) is False


# Window.stage_position: where each stage of a window is, from its finished passes.
# N = 3 stages, asynchronous, T = 4, K = 2: window 0 (see schedule/windows.py) holds
#   stage 0: F0 F1 F2 B0, stage 1: F0 F1 B0 F2, stage 2: F0 B0 F1 B1.
POSITIONS = [
    # done per stage, stage, (doing starts with, waiting)
    ((0, 0, 0), 0, ("pass 1 of 4 of the window of mini-batches 0-1, the forward of "
                    "micro-batch 0.0", None)),
    ((0, 0, 0), 1, ("pass 1 of 4", "the activations of micro-batch 0.0 from stage 0")),
    ((1, 0, 0), 1, ("pass 1 of 4", None)),
    ((3, 2, 1), 0, ("pass 4 of 4 of the window of mini-batches 0-1, the backward of "
                    "micro-batch 0.0", "the gradient of micro-batch 0.0 from stage 1")),
    ((3, 2, 2), 1, ("pass 3 of 4", None)),
    ((4, 4, 4), 2, ("its 4 passes of the window of mini-batches 0-1 finished",
                    "the other stages to finish theirs")),
]


@pytest.mark.parametrize("done, k, expected", POSITIONS)
def test_window_stage_position(done, k, expected):
    window = next(EpochWindows(lambda t: op_lists("stash", 3, t), 4, 2, report_stage=2))
    doing, waiting = window.stage_position(k, list(done))
    assert doing.startswith(expected[0]), doing
    assert waiting == expected[1]


def test_cpu_use_counts_as_building_only_for_a_while_after_a_trace():
    """An op that spins for ever right after a trace is not a graph being built for ever:
    CPU use counts for at most `BUILDING_PER_TRACE` times the trace's duration."""
    progress = stall.Progress()
    done = threading.Event()

    def traced_then_spin():
        progress.attach()
        with stall.tracing():
            time.sleep(0.04)  # a limit of 15 x 0.04 = 0.6 s
        while not done.is_set():
            pass

    thread = threading.Thread(target=traced_then_spin)
    thread.start()
    try:
        time.sleep(0.1)
        progress.still_building(0.1)  # the first look after its trace
        time.sleep(0.2)
        assert progress.still_building(0.2)
        time.sleep(0.6)
        assert not progress.still_building(0.6)
    finally:
        done.set()
        thread.join()


def test_after_a_trace_the_first_call_may_build_its_graph():
    """A trace of t seconds allows `INSTANTIATION_PER_TRACE * t` more until the next beat,
    and while the process keeps a tenth of a core busy (building the graph) the watch sees
    it as alive; a process whose threads only wait is not."""
    progress = stall.Progress()
    seen = {}

    def traced_then(work):
        progress.attach()
        with stall.tracing():
            time.sleep(0.1)
        seen["allowance"] = progress.allowance
        work()

    def busy():
        until = time.thread_time() + 1.2
        while time.thread_time() < until:
            pass

    thread = threading.Thread(target=traced_then, args=(busy,))
    thread.start()
    time.sleep(0.5)
    assert progress.still_building(0.2)  # >= 0.1 s of CPU in 0.5 s, even on a busy machine
    thread.join()
    assert seen["allowance"] >= stall.INSTANTIATION_PER_TRACE * 0.1
    assert progress.idle_seconds(progress.last + 0.5) < 0.5 - seen["allowance"] + 1e-9

    def shared():  # a third of a core, as on a machine loaded 3x beyond its cores
        until = time.monotonic() + 1.2
        while time.monotonic() < until:
            burst = time.thread_time() + 0.02
            while time.thread_time() < burst:
                pass
            time.sleep(0.04)

    sharing = threading.Thread(target=traced_then, args=(shared,))
    sharing.start()
    time.sleep(0.3)
    progress.still_building(0.1)  # the first look after its trace
    time.sleep(0.5)
    assert progress.still_building(0.5)
    sharing.join()

    waiting = threading.Thread(target=traced_then, args=(lambda: time.sleep(0.8),))
    waiting.start()
    time.sleep(0.3)
    progress.still_building(0.1)  # the first look after its trace
    time.sleep(0.3)
    assert not progress.still_building(0.3)
    waiting.join()
    progress.beat()
    assert progress.allowance == 0 and not progress.still_building(0.1)
