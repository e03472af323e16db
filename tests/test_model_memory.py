"""tf_spectrain.partition.model_memory: the wrapped model as an extra copy on a stage's accelerator.

This machine has no GPU, so the warning is tested with GPU names standing in for the
variables' devices (`variable_devices` patched), and through `PipelineModel` with CPUs
counted as accelerators.
"""

import inspect
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_spectrain
from tf_spectrain.app import trainers
from tf_spectrain.partition import model_memory

LOCAL = "/job:localhost/replica:0/task:0/device:"
MESSAGE = "keeps its variables"  # in the warning, and in no other


def mlp():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((200,), name="features")
    h = keras.layers.Dense(1024, name="fc1")(inputs)
    outputs = keras.layers.Dense(256, name="fc2")(h)
    return keras.Model(inputs, outputs, name="mlp")


def mib(arrays):
    """The size in MiB of NumPy arrays, as the warning prints it."""
    return f"{sum(a.nbytes for a in arrays) / 2**20:.1f} MiB"


def our_warnings(record):
    return [w for w in record if issubclass(w.category, UserWarning) and MESSAGE in str(w.message)]


@pytest.mark.parametrize(
    "variables, stages, shared",
    [
        # short and long names, any case, are one device
        ([LOCAL + "GPU:0"], ["/GPU:0"], ["/GPU:0"]),
        ([LOCAL + "GPU:0"], ["gpu:0"], ["/GPU:0"]),
        ([LOCAL + "GPU:0"], ["Gpu:0", "/GPU:1"], ["/GPU:0"]),
        ([LOCAL + "GPU:1"], ["/device:gPu:1"], ["/GPU:1"]),
        (["/device:GPU:0"], ["/GPU"], ["/GPU:0"]),  # "/GPU" means GPU:0
        ([LOCAL + "TPU:2"], ["/TPU:0", "/device:TPU:2"], ["/TPU:2"]),
        # CPUs never count, whichever CPU
        ([LOCAL + "CPU:0"], ["/CPU:0", "/CPU:1"], []),
        ([LOCAL + "CPU:1"], ["/cpu:1"], []),
        ([LOCAL + "GPU:0"], ["/CPU:0", "/CPU:1"], []),
        # a GPU holding variables but no stage
        ([LOCAL + "GPU:0"], ["/GPU:1", "/GPU:2"], []),
        ([LOCAL + "GPU:3", LOCAL + "CPU:0"], ["/GPU:0", "/CPU:0"], []),
        # several devices: in the stages' order, each once
        (
            [LOCAL + "GPU:0", LOCAL + "GPU:1", LOCAL + "GPU:1", LOCAL + "CPU:0"],
            ["/GPU:1", "/GPU:2", "/GPU:0", "/GPU:1", "/CPU:0"],
            ["/GPU:1", "/GPU:0"],
        ),
        # no variables, or variables without a device
        ([], ["/GPU:0"], []),
        ([""], ["/GPU:0"], []),
        # another task's GPU is another device
        (
            ["/job:worker/replica:0/task:1/device:GPU:0"],
            ["/job:worker/task:1/device:GPU:0"],
            ["/job:worker/replica:0/task:1/device:GPU:0"],
        ),
        (["/job:worker/replica:0/task:1/device:GPU:0"], ["/job:worker/task:2/GPU:0"], []),
    ],
)
def test_shared_accelerators(variables, stages, shared):
    assert model_memory.shared_accelerators(variables, stages) == shared


@pytest.mark.parametrize(
    "devices, build_device",
    [
        (["/CPU:0", "/CPU:1"], None),
        (["cpu:0"], None),
        ([LOCAL + "CPU:1", "/device:CPU:0"], None),
        (["/GPU:0", "/GPU:1"], "/CPU:0"),
        (["/CPU:0", "/GPU:0"], "/CPU:0"),
        (["/device:TPU:0"], "/CPU:0"),
        (["gpu:1"], "/CPU:0"),
    ],
)
def test_model_build_device(devices, build_device):
    assert model_memory.model_build_device(devices) == build_device


def test_variable_devices_are_the_full_names_of_the_variables_devices():
    with tf.device("/CPU:2"):
        model = mlp()
    names = model_memory.variable_devices(model)
    assert len(names) == len(model.variables) == 4
    assert names == [LOCAL + "CPU:2"] * 4


def test_warns_once_naming_the_device_and_the_size(monkeypatch):
    model = mlp()
    monkeypatch.setattr(
        model_memory, "variable_devices", lambda m: [LOCAL + "GPU:0"] * len(m.variables)
    )
    with pytest.warns(UserWarning) as record:
        shared = model_memory.warn_if_model_on_stage_device(model, ["/GPU:0", "/GPU:1"])
    assert shared == ["/GPU:0"]
    assert len(our_warnings(record)) == len(record) == 1
    message = str(record[0].message)
    size = mib(model.get_weights())
    assert size == "1.8 MiB"  # (200 * 1024 + 1024 + 1024 * 256 + 256) float32
    assert f"({size}) on /GPU:0," in message
    assert 'with tf.device("/CPU:0"): model = ...' in message


def test_the_size_counts_only_the_variables_on_shared_devices(monkeypatch):
    model = mlp()
    # fc1's kernel on GPU:0 (a stage's), the rest on GPU:3 (no stage's).
    on = [LOCAL + "GPU:0"] + [LOCAL + "GPU:3"] * (len(model.variables) - 1)
    assert model.variables[0] is model.get_layer("fc1").kernel
    monkeypatch.setattr(model_memory, "variable_devices", lambda m: on)
    with pytest.warns(UserWarning, match="keeps its variables") as record:
        model_memory.warn_if_model_on_stage_device(model, ["/GPU:1", "gpu:0"])
    size = mib([model.get_layer("fc1").kernel.numpy()])
    assert size == "0.8 MiB"
    assert f"({size}) on /GPU:0," in str(record[0].message)


def test_several_shared_devices_are_all_named(monkeypatch):
    model = mlp()
    on = [LOCAL + "GPU:0", LOCAL + "GPU:0", LOCAL + "GPU:1", LOCAL + "GPU:1"]
    monkeypatch.setattr(model_memory, "variable_devices", lambda m: on)
    with pytest.warns(UserWarning, match="keeps its variables") as record:
        shared = model_memory.warn_if_model_on_stage_device(model, ["/GPU:0", "/GPU:1"])
    assert shared == ["/GPU:0", "/GPU:1"]
    assert f"({mib(model.get_weights())}) on /GPU:0, /GPU:1," in str(record[0].message)


def test_no_warning_on_cpus_or_on_a_gpu_without_a_stage(monkeypatch):
    model = mlp()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert model_memory.warn_if_model_on_stage_device(model, ["/CPU:0", "/CPU:1"]) == []
        monkeypatch.setattr(
            model_memory, "variable_devices", lambda m: [LOCAL + "GPU:2"] * len(m.variables)
        )
        assert model_memory.warn_if_model_on_stage_device(model, ["/GPU:0", "/GPU:1"]) == []
    assert our_warnings(record) == []


def tiny():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    h = keras.layers.Dense(4, name="a")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="b")(h))


def test_pipeline_model_on_cpu_devices_does_not_warn():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pipe = tf_spectrain.PipelineModel(tiny(), cuts=["a"], devices=["/CPU:0", "/CPU:1"])
    assert pipe.num_stages == 2
    assert our_warnings(record) == []


def test_pipeline_model_warning_points_at_the_callers_line(monkeypatch):
    # Count CPUs as accelerators: the model on CPU:0 then shares it with stage 0.
    monkeypatch.setattr(model_memory, "CPU", "no such device type")
    model = tiny()
    with pytest.warns(UserWarning, match="keeps its variables") as record:
        line = inspect.currentframe().f_lineno + 1
        tf_spectrain.PipelineModel(model, cuts=["a"], devices=["/CPU:0", "/CPU:1"])
    ours = our_warnings(record)
    assert len(ours) == 1
    assert (ours[0].filename, ours[0].lineno) == (__file__, line)
    message = str(ours[0].message)
    assert f"({mib(model.get_weights())}) on /CPU:0," in message


def test_build_trainer_builds_a_pipelines_model_on_the_build_device(monkeypatch):
    # No GPU here: have the helper answer a CPU the model would not be built on otherwise.
    asked = []

    def build_device(devices):
        asked.append(list(devices))
        return "/CPU:3"

    monkeypatch.setattr(model_memory, "model_build_device", build_device)
    pipe = trainers.build_trainer(tiny, "sync", ["/CPU:0", "/CPU:1"], learning_rate=0.1,
                                  cuts=["a"])
    assert asked == [["/CPU:0", "/CPU:1"]]
    assert model_memory.variable_devices(pipe.model) == [LOCAL + "CPU:3"] * 4
    # The stages are still on their own devices.
    assert [v.value.device for v in pipe.stages[1].variables] == [LOCAL + "CPU:1"] * 2
    np.testing.assert_array_equal(pipe.model.get_layer("a").kernel.numpy(),
                                  tiny().get_layer("a").kernel.numpy())


def test_build_trainer_builds_baselines_as_before(monkeypatch):
    monkeypatch.setattr(model_memory, "model_build_device", pytest.fail)
    model = trainers.build_trainer(tiny, "single", ["/CPU:2"], learning_rate=0.1)
    assert model_memory.variable_devices(model)[0] == LOCAL + "CPU:2"


@pytest.mark.parametrize(
    "variables, device, local",
    [
        ([LOCAL + "GPU:0"] * 2, "/GPU:0", True),
        ([LOCAL + "GPU:0"], "gpu:0", True),
        ([LOCAL + "CPU:0"], "/GPU:0", False),  # train.py's model on the CPU, stage on a GPU
        ([LOCAL + "GPU:1"], "/GPU:0", False),
        ([LOCAL + "CPU:0", LOCAL + "CPU:3"], "/CPU:2", True),  # logical CPUs share memory
        ([LOCAL + "GPU:0"], "/CPU:0", False),
        (["", LOCAL + "GPU:0"], "/GPU:0", True),
        ([], "/GPU:1", True),
    ],
)
def test_reads_locally(variables, device, local):
    assert model_memory.reads_locally(variables, device) is local


def test_profile_model_times_placed_copies_when_the_variables_are_elsewhere(monkeypatch):
    from tf_spectrain import partition
    from tf_spectrain.costmodel import measure

    placed = []
    real = partition.place_stages

    def spy(stages, devices):
        placed.append(list(devices))
        return real(stages, devices)

    monkeypatch.setattr(partition, "place_stages", spy)
    model = tiny()
    before = [w.copy() for w in model.get_weights()]
    measure.profile_model(model, 4, repeats=1, warmup=0, device="/CPU:1")
    assert placed == []  # the variables are on a CPU: read in place
    monkeypatch.setattr(model_memory, "reads_locally", lambda names, device: False)
    profile = measure.profile_model(model, 4, repeats=1, warmup=0, device="/CPU:1")
    assert placed == [["/CPU:1"] * len(profile)]
    assert profile.names == [layer.name for layer in model.layers[1:]]
    for a, b in zip(model.get_weights(), before):  # the model itself is left alone
        np.testing.assert_array_equal(a, b)
