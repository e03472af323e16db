"""`PipelineTrace` and `callbacks.trace_events`: Chrome traces of the stages' passes.

The pure conversion is checked on hand-made timelines (every timestamp and the schedule's
idle slots worked out by hand); the callback on real 4- and 2-stage pipelines on logical
CPU devices, whose traces are parsed back and checked against the trace-event format,
against `Telemetry`'s utilisation and against the schedule.
"""

import json
import re

import keras
import numpy as np
import pytest
from runtimes import EAGER, compile_quietly

from tf_spectrain import schedule
from tf_spectrain.callbacks import PipelineTrace, Telemetry
from tf_spectrain.callbacks.trace_events import (
    match_passes,
    pipeline_trace,
    schedule_idle,
    window_trace,
)
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

PASS_NAME = re.compile(r"^(forward|backward|update) (\d+)(?:\.(\d+))?( \(recomputes\))?$")


# --- the pure conversion, on a hand-made table --------------------------------------------

# Two stages, two mini-batches, async: stage 0 runs F0 F1 B0 U0 B1 U1, stage 1 F0 B0 U0 F1
# B1 U1. Times in seconds from an origin of 100.
OPS = [schedule.async_ops(k, 2, 2) for k in range(2)]
TIMELINES = [
    [("forward", (0, 0), 100.0, 101.0), ("forward", (1, 0), 101.0, 102.0),
     ("backward", (0, 0), 104.0, 106.0), ("update", None, 106.0, 106.5),
     ("backward", (1, 0), 109.0, 111.0), ("update", None, 111.0, 111.5)],
    [("forward", (0, 0), 101.5, 102.5), ("backward", (0, 0), 102.5, 104.0),
     ("update", None, 104.0, 104.5), ("forward", (1, 0), 105.0, 106.0),
     ("backward", (1, 0), 107.0, 109.0), ("update", None, 109.0, 109.5)],
]


def slices(trace, tid=None, cat=None):
    """The complete events of a trace (of one track, of one category), by start."""
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"
              and (tid is None or e["tid"] == tid) and (cat is None or e["cat"] == cat)]
    return sorted(events, key=lambda e: e["ts"])


def test_hand_made_table_gives_every_slice_and_wait():
    trace = pipeline_trace(TIMELINES, OPS, ["/CPU:0", "/CPU:1"], epoch_start=100.0,
                           epoch_seconds=12.0)
    got = [(e["name"], e["ts"], e["dur"]) for e in slices(trace, 0)]
    assert got == [
        ("forward 0", 0.0, 1e6), ("forward 1", 1e6, 1e6),
        ("wait gradient 0.0 from stage 1", 2e6, 2e6), ("backward 0", 4e6, 2e6),
        ("update 0", 6e6, 0.5e6), ("wait gradient 1.0 from stage 1", 6.5e6, 2.5e6),
        ("backward 1", 9e6, 2e6), ("update 1", 11e6, 0.5e6), ("idle: drained", 11.5e6, 0.5e6),
    ]
    got = [(e["name"], e["ts"], e["dur"]) for e in slices(trace, 1)]
    assert got == [
        ("wait activations 0.0 from stage 0", 0.0, 1.5e6), ("forward 0", 1.5e6, 1e6),
        ("backward 0", 2.5e6, 1.5e6), ("update 0", 4e6, 0.5e6),
        ("wait activations 1.0 from stage 0", 4.5e6, 0.5e6), ("forward 1", 5e6, 1e6),
        ("host", 6e6, 1e6), ("backward 1", 7e6, 2e6), ("update 1", 9e6, 0.5e6),
        ("idle: drained", 9.5e6, 2.5e6),
    ]
    stages = trace["otherData"]["stages"]
    assert [s["busy_seconds"] for s in stages] == pytest.approx([7.0, 6.5])
    assert [s["busy_fraction"] for s in stages] == pytest.approx([7 / 12, 6.5 / 12])
    assert [s["bubble"] for s in stages] == pytest.approx([5 / 12, 5.5 / 12])
    # The clock table, by hand: stage 0 "F0 F1 .  B0 .  B1", stage 1 ".  F0 B0 F1 B1 .".
    assert [s["bubble_schedule"] for s in stages] == pytest.approx([2 / 6, 2 / 6])
    assert trace["otherData"]["bubble_schedule"] == pytest.approx(
        schedule.bubble_fraction(schedule.clock_table(OPS)))
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    assert names[1] == "stage 1 (/CPU:1), busy 54.2%, bubble 45.8% (schedule 33.3%)"


def test_without_epoch_times_the_span_is_first_to_last_pass():
    trace = pipeline_trace(TIMELINES, OPS)
    assert trace["otherData"]["span_seconds"] == pytest.approx(11.5)
    assert [e["name"] for e in slices(trace, 0)][-1] == "update 1"
    assert [s["busy_fraction"] for s in trace["otherData"]["stages"]] == pytest.approx(
        [7 / 11.5, 6.5 / 11.5])


def test_a_window_of_mini_batches_keeps_only_their_passes():
    trace = pipeline_trace(TIMELINES, OPS, epoch_start=100.0, epoch_seconds=12.0,
                           batches=(1, 2))
    passes = [e["name"] for e in slices(trace, cat="pass")]
    assert sorted(passes) == sorted(["forward 1", "backward 1", "update 1"] * 2)
    assert trace["otherData"]["span_seconds"] == pytest.approx(111.5 - 101.0)  # F1 .. U1
    first = slices(trace, 0)
    assert (first[0]["name"], first[0]["ts"]) == ("forward 1", 0.0)
    # Slots 1..5 of the clock table hold mini-batch 1's passes: stage 0 "F1 . B0 . B1",
    # stage 1 "F0 B0 F1 B1 .".
    assert schedule_idle(OPS, (1, 2)) == pytest.approx([2 / 5, 1 / 5])


def test_micro_batches_recomputes_and_a_stopped_epoch():
    ops = [schedule.sync_ops(0, 1, 3, 2)]
    # Stopped after mini-batch 0: the passes of 1 and 2 never ran.
    timeline = [("forward", (0, 0), 0.0, 1.0), ("forward", (0, 1), 1.0, 2.0),
                ("backward", (0, 0), 2.0, 3.0), ("backward", (0, 1), 3.0, 4.0),
                ("update", None, 4.0, 5.0)]
    trace = pipeline_trace([timeline], ops, recomputes=[lambda key: key[1] == 1])
    assert [e["name"] for e in slices(trace)] == [
        "forward 0.0", "forward 0.1", "backward 0.0", "backward 0.1 (recomputes)", "update 0"]
    assert slices(trace)[3]["args"] == {"pass": "backward", "mini_batch": 0, "micro_batch": 1,
                                        "recomputes_forward": True}


def test_a_pass_missing_from_the_schedule_is_an_error():
    with pytest.raises(ValueError, match=r"`timelines\[1\]` must follow stage 1's op list"):
        match_passes([("backward", (5, 0), 0.0, 1.0)], OPS[1], 1)
    with pytest.raises(ValueError, match="one entry per stage"):
        pipeline_trace(TIMELINES[:1], OPS)
    with pytest.raises(ValueError, match=r"Received: batches=\(2, 2\)"):
        pipeline_trace(TIMELINES, OPS, batches=(2, 2))


def test_window_trace_has_one_slice_per_window():
    trace = window_trace([(0, 4, 10.0, 12.0), (4, 6, 12.0, 13.0)])
    assert [(e["name"], e["ts"], e["dur"]) for e in slices(trace)] == [
        ("mini-batches 0-3", 0.0, 2e6), ("mini-batches 4-5", 2e6, 1e6)]
    assert trace["otherData"]["stages"] == []


# --- the callback on real pipelines -------------------------------------------------------


def mlp(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    h = inputs
    for n, units in enumerate([12, 12, 12, 3]):
        h = keras.layers.Dense(units, activation=None if n == 3 else "tanh", name=f"dense{n}")(h)
    return keras.Model(inputs, h)


def data(n=64):
    x = np.random.default_rng(1).normal(size=(n, 6)).astype("float32")
    return x, np.argmax(x[:, :3], axis=1).astype("int32")


def fit(callbacks, cuts=("dense0", "dense1", "dense2"), steps_per_execution="auto",
        epochs=1, **options):
    pipe = PipelineModel(mlp(), cuts=list(cuts), **options)
    compile_quietly(pipe, SpecTrainSGD(0.05, momentum=0.9),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=steps_per_execution)
    x, y = data()
    pipe.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)
    return pipe


def check_format(trace, num_stages, devices):
    """The trace-event format's required keys, one track per stage, and sane times."""
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    for event in trace["traceEvents"]:
        assert {"name", "ph", "pid", "args"} <= set(event)
        assert event["ph"] in ("X", "M")
        if event["ph"] == "X":
            assert {"ts", "dur", "tid", "cat"} <= set(event)
            assert event["ts"] >= 0 and event["dur"] >= 0
    assert {e["tid"] for e in slices(trace)} == set(range(num_stages))
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    assert [names[k].split(", busy")[0] for k in range(num_stages)] == [
        f"stage {k} ({d})" for k, d in enumerate(devices)]


@pytest.fixture(scope="module")
def four_stages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace")
    trace, telemetry = PipelineTrace(folder), Telemetry(folder / "tb", prediction_every=0)
    pipe = fit([trace, telemetry], epochs=2)  # steps_per_execution="auto"
    return pipe, trace, telemetry, json.loads((folder / "trace_epoch_1.json").read_text())


def test_trace_is_valid_and_names_every_pass(four_stages):
    pipe, callback, _, trace = four_stages
    assert [p.rsplit("/", 1)[-1] for p in callback.paths] == [
        "trace_epoch_0.json", "trace_epoch_1.json"]
    check_format(trace, 4, pipe.state.devices)
    # Every op of every stage's list appears once, named by its mini-batch.
    for k, ops in enumerate(pipe.state.op_lists(8)):
        names = [PASS_NAME.match(e["name"]) for e in slices(trace, k, "pass")]
        assert all(names)
        got = sorted((m[1], int(m[2])) for m in names)
        assert got == sorted((op.kind, op.batch) for op in ops)


def test_stage_slices_never_overlap_and_waits_fill_the_gaps(four_stages):
    trace = four_stages[3]
    span = trace["otherData"]["span_seconds"] * 1e6
    for k in range(4):
        events = slices(trace, k)
        assert events[0]["ts"] == 0.0
        for before, after in zip(events, events[1:]):
            assert after["ts"] == pytest.approx(before["ts"] + before["dur"], abs=2e-3)
        assert events[-1]["ts"] + events[-1]["dur"] == pytest.approx(span, abs=2e-3)
        waits = [e for e in events if e["cat"] == "wait"]
        assert waits and all(not PASS_NAME.match(e["name"]) for e in waits)


def test_busy_fraction_agrees_with_telemetry(four_stages):
    pipe, callback, telemetry, trace = four_stages
    span = trace["otherData"]["span_seconds"] * 1e6
    for k, stats in enumerate(telemetry.stage_stats[-1]):
        busy = sum(e["dur"] for e in slices(trace, k, "pass")) / span
        assert busy == pytest.approx(stats["utilisation"], abs=0.02)
        assert callback.stage_stats[-1][k]["busy_fraction"] == pytest.approx(busy, abs=1e-6)
    table = schedule.clock_table(pipe.state.op_lists(8))
    assert trace["otherData"]["bubble_schedule"] == pytest.approx(
        schedule.bubble_fraction(table))


def test_micro_batches_recompute_and_a_window_of_batches(tmp_path):
    path = tmp_path / "run-{epoch}.json"
    callback = PipelineTrace(path, batches=(2, 4))
    pipe = fit([callback], cuts=("dense1",), mode="sync", micro_batches=2,
               recompute="always", steps_per_execution=EAGER)
    trace = json.loads((tmp_path / "run-0.json").read_text())
    check_format(trace, 2, pipe.state.devices)
    names = [e["name"] for e in slices(trace, 1, "pass")]
    assert sorted(names) == sorted(
        [f"forward {i}.{j}" for i in (2, 3) for j in (0, 1)]
        + [f"backward {i}.{j} (recomputes)" for i in (2, 3) for j in (0, 1)]
        + ["update 2", "update 3"])
    assert callback.stage_stats[-1][1]["device"] == pipe.state.devices[1]


def test_windows_time_every_pass_for_the_trace(tmp_path):
    """In windows of 4 (the four_stages fixture runs "auto": 8) each pass is timed inside
    the graph: the same slices as pass by pass, in each stage's order, never overlapping."""
    callback, by_pass = PipelineTrace(tmp_path / "w"), PipelineTrace(tmp_path / "p")
    pipe = fit([callback], steps_per_execution=4, mode="stash")
    fit([by_pass], steps_per_execution=EAGER, mode="stash")
    trace = callback.last_trace
    check_format(trace, 4, pipe.state.devices)
    for k in range(4):
        names = [e["name"] for e in slices(trace, k, "pass")]
        assert names == [e["name"] for e in slices(by_pass.last_trace, k, "pass")]
        assert len(names) == len(pipe.state.op_lists(8)[k])
        events = slices(trace, k)
        for before, after in zip(events, events[1:]):
            assert after["ts"] == pytest.approx(before["ts"] + before["dur"], abs=2e-3)
    assert 0 < callback.stage_stats[-1][0]["busy_fraction"] <= 1


def test_untimed_windows_give_window_slices_and_plain_models_nothing(tmp_path):
    callback = PipelineTrace(tmp_path, pass_times=False)
    fit([callback], steps_per_execution=4)
    trace = callback.last_trace
    assert [e["name"] for e in slices(trace)] == ["mini-batches 0-3", "mini-batches 4-7"]
    assert callback.stage_stats == []
    model = mlp()
    model.compile("sgd", "sparse_categorical_crossentropy")
    plain = PipelineTrace(tmp_path / "plain")
    model.fit(*data(16), epochs=1, verbose=0, callbacks=[plain])
    assert plain.paths == []


@pytest.mark.parametrize("batches, error, match", [
    ((3, 1), ValueError, r"start < stop.*Received: batches=\(3, 1\)"),
    ((0,), TypeError, "pair"),
    ((0, 1.5), TypeError, "batches"),
])
def test_bad_arguments_are_named(tmp_path, batches, error, match):
    with pytest.raises(error, match=match):
        PipelineTrace(tmp_path, batches=batches)


def test_a_file_where_the_folder_should_be_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="`path`"):
        PipelineTrace(blocker)


def test_replicas_and_an_epoch_stopped_early(tmp_path):
    class StopAfter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = batch >= 2  # those in flight then drain

    callback = PipelineTrace(tmp_path)
    pipe = fit([callback, StopAfter()], cuts=("dense1",), replicas=2)
    done = pipe.state.epoch_progress[1]
    assert 3 <= done < 8
    trace = callback.last_trace
    check_format(trace, 2, pipe.state.devices)  # replica 0's two stages
    batches = {e["args"]["mini_batch"] for e in slices(trace, cat="pass")}
    assert batches == set(range(done))
    table = schedule.clock_table(pipe.state.op_lists(done))
    assert trace["otherData"]["bubble_schedule"] == pytest.approx(
        schedule.bubble_fraction(table))
