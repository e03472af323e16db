"""Automatic cuts: `costmodel.auto_partition` and `PipelineModel(cuts="auto")` on a tiny CNN.

What is checked against something independent: the cuts are layers of the model in model
order and split it (`partition.split_model`); the model's weights and BatchNorm moving
statistics after planning equal a copy taken before, bit for bit (and profiling alone does
move them, so the equality is the restore's doing); calls of the measuring functions are
counted by stand-ins; a re-cut `sync` pipeline's step equals plain Keras `fit`.

Models are 6x6 images and profiling runs at batch 4; conftest.py has split the CPU into
/CPU:0 .. /CPU:3.
"""

import keras
import numpy as np
import pytest
from conftest import collect_garbage

from tf_spectrain import costmodel, partition
from tf_spectrain.costmodel import autoplan, measure
from tf_spectrain.partition.graph import read_graph
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

CPUS = ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]
BATCH = 4  # profile_batch_size everywhere: one cached profile per model


def make_cnn(seed=0, dropout=False):
    """conv1 bn1 relu1 pool1 conv2 bn2 relu2 [drop] flatten logits, on 6x6x2 images."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 2), name="image")
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv1")(inputs)
    h = keras.layers.BatchNormalization(momentum=0.5, name="bn1")(h)
    h = keras.layers.ReLU(name="relu1")(h)
    h = keras.layers.MaxPooling2D(2, name="pool1")(h)
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv2")(h)
    h = keras.layers.BatchNormalization(momentum=0.5, name="bn2")(h)
    h = keras.layers.ReLU(name="relu2")(h)
    if dropout:
        h = keras.layers.Dropout(0.5, name="drop")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    outputs = keras.layers.Dense(3, name="logits")(h)
    return keras.Model(inputs, outputs, name="cnn")


@pytest.fixture(scope="module")
def cnn():
    """One model for the tests that only build pipelines (its profile is cached)."""
    return make_cnn()


def assert_valid_cuts(model, cuts, num_stages):
    names = read_graph(model).names
    assert len(cuts) == num_stages - 1
    positions = [names.index(c) for c in cuts]
    assert positions == sorted(set(positions)) and positions[-1:] != [len(names) - 1]
    assert len(partition.split_model(model, cuts)) == num_stages


def snapshot(model):
    return [np.array(v.numpy()) for v in model.variables]


def assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def counting(monkeypatch, name):
    """Replaces `measure.<name>` by a wrapper that counts its calls."""
    calls = []
    real = getattr(measure, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(measure, name, wrapper)
    return calls


def forbidden(monkeypatch, *names):
    """Makes the measuring functions fail the test if called."""
    for name in names:
        def fail(*args, name=name, **kwargs):
            raise AssertionError(f"measure.{name} was called")

        monkeypatch.setattr(measure, name, fail)


# --- auto_partition -------------------------------------------------------------------------


@pytest.mark.parametrize("num_devices", [2, 3, 4])
def test_auto_partition_returns_valid_measured_cuts(cnn, num_devices):
    devices = CPUS[:num_devices]
    # calibrate_above=0: calibrate this tiny model too (by default stages this short skip it).
    plan = costmodel.auto_partition(cnn, devices, batch_size=BATCH, calibrate_above=0)
    assert plan.num_stages == num_devices
    assert_valid_cuts(cnn, plan.cuts, num_devices)
    assert list(plan.devices) == devices
    assert plan.batch_size == BATCH and plan.mode == "spectrain"
    assert len(plan.measured) == num_devices
    assert all(isinstance(t, float) and t > 0 for t in plan.measured)
    assert plan.profile_seconds > 0
    # Stages predicted under calibrate_above skip it (1 s: far above this model's, even on
    # a loaded machine; the 5 ms default is not, and made this test flaky).
    assert costmodel.auto_partition(cnn, devices, batch_size=BATCH,
                                    calibrate_above=1.0).measured is None
    # The stages tile the model's layers in order.
    layers = [n for k in range(num_devices) for n in plan.stage_layers(k)]
    assert layers == read_graph(cnn).names


def test_planning_leaves_weights_and_batch_norm_statistics_unchanged(monkeypatch):
    model = make_cnn(seed=3, dropout=True)
    before = snapshot(model)
    calls = counting(monkeypatch, "measure_stages")
    costmodel.auto_partition(model, CPUS[:3], batch_size=BATCH, mode="sync", calibrate_above=0)
    assert calls, "the plan was calibrated by timing stages"
    assert_same(snapshot(model), before)
    # Profiling alone (training=True) moves the moving statistics: the equality above is
    # the restore's doing.
    measure.profile_model(model, BATCH, repeats=1, warmup=0)
    moving = [
        i for i, v in enumerate(model.variables)
        if "moving" in v.path and not np.array_equal(v.numpy(), before[i])
    ]
    assert moving


def test_the_profile_is_cached_per_model_and_batch_size(monkeypatch):
    model = make_cnn(seed=4)
    calls = counting(monkeypatch, "profile_model")
    first = costmodel.auto_partition(model, CPUS[:2], batch_size=BATCH, calibration_rounds=0)
    assert len(calls) == 1
    again = costmodel.auto_partition(model, CPUS[:2], batch_size=BATCH, calibration_rounds=0)
    assert len(calls) == 1  # the same model, batch and device kind: no new profile
    assert again.cuts == first.cuts  # the same profile plans the same cuts
    assert [s.seconds for s in again.stages] == pytest.approx([s.seconds for s in first.stages])
    assert first.measured is None  # no calibration rounds, nothing timed
    costmodel.auto_partition(model, CPUS[:2], batch_size=2 * BATCH, calibration_rounds=0)
    assert len(calls) == 2  # another batch size is another profile
    other = make_cnn(seed=4)
    costmodel.auto_partition(other, CPUS[:2], batch_size=BATCH, calibration_rounds=0)
    assert len(calls) == 3  # another model, even of the same architecture


# --- PipelineModel(cuts="auto") --------------------------------------------------------------


def test_default_cuts_use_every_logical_cpu_device(cnn):
    pipe = PipelineModel(cnn)  # cuts="auto", profile_batch_size=32
    assert pipe.num_stages == 4
    assert pipe.devices == CPUS
    assert pipe.partition_plan is not None
    assert pipe.partition_plan.cuts == pipe.cuts
    assert list(pipe.partition_plan.devices) == CPUS
    assert pipe.partition_plan.batch_size == 32
    assert_valid_cuts(cnn, pipe.cuts, 4)
    assert len(str(pipe.partition_plan).splitlines()) == 2 + 4


def test_num_stages_and_devices_choose_the_stages(cnn):
    pipe = PipelineModel(cnn, num_stages=2, profile_batch_size=BATCH)
    assert pipe.num_stages == 2 and pipe.devices == CPUS[:2]
    assert pipe.partition_plan.cuts == pipe.cuts
    pipe = PipelineModel(cnn, devices=["/CPU:3", "/CPU:1", "/CPU:2"], profile_batch_size=BATCH)
    assert pipe.num_stages == 3 and pipe.devices == ["/CPU:3", "/CPU:1", "/CPU:2"]
    assert list(pipe.partition_plan.devices) == pipe.devices
    assert_valid_cuts(cnn, pipe.cuts, 3)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_stages=3, devices=CPUS[:2]), ValueError,
         r"`num_stages` must match `devices` \(one device per stage\)\. Received: "
         r"num_stages=3, devices=\['/CPU:0', '/CPU:1'\] \(2 devices\)"),
        (dict(cuts=["relu1"], num_stages=3), ValueError,
         r"`num_stages` must be len\(cuts\) \+ 1 = 2 with these cuts"),
        (dict(cuts=[], num_stages=2), ValueError, r"len\(cuts\) \+ 1 = 1"),
        (dict(cuts="pool1"), TypeError, r"did you mean cuts=\['pool1'\]\?"),
        (dict(cuts=None), TypeError, r"`cuts` must be 'auto' or a list of layer names"),
        (dict(devices="/CPU:0"), TypeError, r"`devices` must be a list of device names"),
        (dict(devices=[]), ValueError, r"at least one device"),
        (dict(devices=["/CPU:0", "/CPU:9"]), ValueError, r"/CPU:9"),
        (dict(num_stages=0), ValueError, r"num_stages"),
        (dict(num_stages=9), ValueError, r"needs 9 distinct devices"),
    ],
)
def test_bad_stage_arguments_are_refused_before_profiling(cnn, monkeypatch, kwargs, error,
                                                           match):
    forbidden(monkeypatch, "profile_model", "measure_stages")
    with pytest.raises(error, match=match):
        PipelineModel(cnn, profile_batch_size=BATCH, **kwargs)


def test_a_memory_limit_nothing_fits_raises(cnn):
    with pytest.raises(costmodel.MemoryLimitError, match=r"needs stage 0: .* \(limit 100 bytes\)"):
        PipelineModel(cnn, num_stages=2, profile_batch_size=BATCH, memory_limit=100.0)
    # The model's own weights alone (a few hundred bytes) would fit a roomy limit.
    pipe = PipelineModel(cnn, num_stages=2, profile_batch_size=BATCH, memory_limit=2.0**30)
    assert all(s.memory_bytes <= 2.0**30 for s in pipe.partition_plan.stages)


def test_one_stage_auto_pipeline_does_not_profile(cnn, monkeypatch):
    forbidden(monkeypatch, "profile_model", "measure_stages")
    pipe = PipelineModel(cnn, num_stages=1)
    assert pipe.num_stages == 1 and pipe.cuts == [] and pipe.devices == CPUS[:1]
    assert pipe.partition_plan is None


# --- use_cuts ---------------------------------------------------------------------------------


def test_use_cuts_recuts_a_planned_pipeline_that_then_trains_as_keras():
    model = make_cnn(seed=5)
    pipe = PipelineModel(model, num_stages=2, mode="sync", profile_batch_size=BATCH)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    pipe.compile(optimizer=optimizer, loss=loss)
    new = ["relu1"] if pipe.cuts != ["relu1"] else ["pool1"]
    pipe.use_cuts(new)
    assert pipe.cuts == new and pipe.num_stages == 2 and pipe.devices == CPUS[:2]
    assert pipe.partition_plan is None  # the plan was for other cuts
    assert pipe.runners is not None  # compiled again
    assert [m.name for m in pipe.stages[0].layers][-1] == new[0]

    ref = keras.models.clone_model(model)
    ref.set_weights(model.get_weights())
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 3, size=8).astype("int32")
    ref.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    before = model.get_weights()
    pipe.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    after = model.get_weights()  # BatchNorm moving statistics included
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(after, before)) > 1e-3
    for a, b in zip(after, ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_use_cuts_refusals(cnn):
    given = PipelineModel(cnn, cuts=["relu1"])
    given.use_cuts(["relu1"])  # the same cuts: nothing to do
    with pytest.raises(ValueError, match=r"only planned cuts \(cuts='auto'\) can be replaced"):
        given.use_cuts(["pool1"])
    planned = PipelineModel(cnn, num_stages=3, profile_batch_size=BATCH)
    with pytest.raises(ValueError, match=r"must keep the pipeline's 3 stages \(2 cuts\)"):
        planned.use_cuts(["relu1"])
    with pytest.raises(TypeError, match=r"cuts"):
        planned.use_cuts("relu1")
    assert planned.num_stages == 3  # nothing changed
    planned.compile(optimizer=SpecTrainSGD(0.1, momentum=0.9),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"`cuts` must name layers of the model 'cnn'"):
        planned.use_cuts(["relu1", "no_such_layer"])


def test_profile_cache_entries_go_with_their_model():
    model = make_cnn(seed=6)
    costmodel.auto_partition(model, CPUS[:2], batch_size=BATCH, calibration_rounds=0)
    key = next(k for k in autoplan._PROFILES if k[0] == id(model))
    del model
    collect_garbage()
    assert key not in autoplan._PROFILES


def test_use_cuts_builds_the_stages_from_the_models_current_weights():
    # Weights set on the model after the pipeline was built (pretrained weights, say) are
    # what the new stages start from; the old stages' copies must not overwrite them.
    model = make_cnn(seed=8)
    pipe = PipelineModel(model, num_stages=2, mode="sync", profile_batch_size=BATCH)
    rng = np.random.default_rng(1)
    new_weights = [rng.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()]
    model.set_weights(new_weights)
    new = ["relu1"] if pipe.cuts != ["relu1"] else ["pool1"]
    pipe.use_cuts(new)
    assert_same(model.get_weights(), new_weights)
    by_name = {w.path: w.numpy() for w in model.weights}
    for stage in pipe.stages:
        for w in stage.weights:
            np.testing.assert_array_equal(w.numpy(), by_name[w.path])
