"""`runtime.state`: the read-only view callbacks get, and each stage's op lists."""

import keras
import pytest

from tf_spectrain import schedule
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime.probe import WeightProbe
from tf_spectrain.runtime.state import PipelineState, Progress
from tf_spectrain.schedule import modes, op_lists


def _pipe(mode="stash", micro_batches=1):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    h = keras.layers.Dense(4, name="d0")(inputs)
    outputs = keras.layers.Dense(2, name="d1")(h)
    return PipelineModel(
        keras.Model(inputs, outputs), cuts=["d0"], devices=["/CPU:0", "/CPU:1"], mode=mode,
        micro_batches=micro_batches,
    )


@pytest.mark.parametrize(
    "mode, micro_batches, expected",
    [
        ("sync", 1, lambda k: schedule.sync_ops(k, 3, 5, 1)),
        ("sync", 2, lambda k: schedule.sync_ops(k, 3, 5, 2)),
        ("stash", 1, lambda k: schedule.async_ops(k, 3, 5)),
        ("spectrain", 1, lambda k: schedule.async_ops(k, 3, 5)),
    ],
)
def test_op_lists_are_the_modes_schedule(mode, micro_batches, expected):
    lists = op_lists(mode, 3, 5, micro_batches)
    assert lists == [expected(k) for k in range(3)]


def test_state_reads_the_pipeline_and_its_progress():
    pipe = _pipe()
    state = pipe.state
    assert (state.num_stages, state.mode, state.micro_batches) == (2, "stash", 1)
    assert state.devices == ("/CPU:0", "/CPU:1") and state.cuts == ("d0",)
    assert state.runners == () and state.stage_optimizers == ()  # before compile
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert [o is r.optimizer for o, r in zip(state.stage_optimizers, pipe.runners)] == [True] * 2
    pipe.progress.images_seen = 7
    pipe.progress.epoch_progress = (1, 2, 3)
    assert state.images_seen == 7 and state.epoch_progress == (1, 2, 3)
    assert pipe.images_seen == 7 and pipe.epoch_progress == (1, 2, 3)
    assert state.op_lists(4) == op_lists("stash", 2, 4)
    pipe.runners[0].timeline.append(("forward", (0, 0), 1.0, 2.0))
    assert state.timelines[0] == (("forward", (0, 0), 1.0, 2.0),) and state.timelines[1] == ()


@pytest.mark.parametrize("name", ["images_seen", "mode", "runners", "anything"])
def test_state_is_read_only(name):
    state = PipelineState(_pipe(), Progress())
    with pytest.raises(AttributeError, match="read-only"):
        setattr(state, name, 1)


def test_state_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'bogus'"):
        PipelineState(_pipe(), Progress()).bogus  # noqa: B018


def test_state_attaches_and_detaches_probes_without_setting_attributes():
    pipe = _pipe(mode="spectrain")
    state = pipe.state
    assert state.attach_probes(2) == () and state.probes == ()  # before compile: no stages
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    probes = state.attach_probes(2)
    assert probes == state.probes and probes
    assert all(isinstance(p, WeightProbe) and p.every == 2 for p in probes)
    assert [r.probe for r in pipe.runners if r.probe is not None] == list(probes)
    for runner in pipe.runners:  # exactly the stages with something to measure
        horizons = modes.probe_horizons("spectrain", runner.k, 2, state.spectrain_target)
        assert (runner.probe is not None) == (max(horizons) > 0)
    state.detach_probes()
    assert state.probes == () and all(r.probe is None for r in pipe.runners)
