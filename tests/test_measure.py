"""Tests for tf_spectrain.costmodel.measure: profiling and measuring with TensorFlow, on
tiny models."""


import pytest

from tf_spectrain import costmodel
from tf_spectrain.costmodel import Hardware

# --- measuring with TensorFlow (tiny models) ----------------------------------------------


def test_profile_model_sizes_match_the_layers():
    import keras

    inputs = keras.Input((6,), name="x")
    h = keras.layers.Dense(5, name="d1")(inputs)
    r = keras.layers.Activation("relu", name="act")(h)
    y = keras.layers.Add(name="add")([h, r])  # h skips over `act`
    out = keras.layers.Dense(3, name="d2")(y)
    model = keras.Model(inputs, out)
    profile = costmodel.profile_model(model, batch_size=4, repeats=1, warmup=1)
    assert profile.names == ["d1", "act", "add", "d2"]
    assert profile.batch_size == 4
    # float32 bytes per example crossing a cut after each layer; after `act` both h and r.
    assert [layer.output_bytes for layer in profile.layers] == [20, 40, 20, 12]
    assert [layer.weight_bytes for layer in profile.layers] == [
        4 * model.get_layer(n).count_params() for n in profile.names
    ]
    assert all(layer.forward_time > 0 and layer.backward_time >= 0 for layer in profile.layers)


def test_profile_model_rejects_bad_arguments():
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(TypeError, match=r"batch_size=1.5"):
        costmodel.profile_model(model, 1.5)
    with pytest.raises(ValueError, match=r"repeats=0"):
        costmodel.profile_model(model, 2, repeats=0)


def test_link_and_concurrency_measurements_are_in_range():
    bandwidth, latency = costmodel.measure_link("/CPU:0", "/CPU:1", large_bytes=2**20, repeats=3)
    assert bandwidth > 0 and 0 <= latency < 1
    calls = []

    def workload(device):
        calls.append(device)
        return lambda: sum(range(1000))

    concurrency = costmodel.measure_concurrency(["/CPU:0", "/CPU:1"], workload, repeats=2)
    assert 0 < concurrency <= 2
    assert calls == ["/CPU:0", "/CPU:1"]
    Hardware(2, 1.0, bandwidth, latency, concurrency)  # fits the hardware description
    with pytest.raises(ValueError, match=r"at least 2 device names"):
        costmodel.measure_concurrency(["/CPU:0"])
    with pytest.raises(TypeError, match=r"workload=3"):
        costmodel.measure_concurrency(["/CPU:0", "/CPU:1"], workload=3)


def test_measure_stages_runs_each_stage_on_its_device_with_its_own_variables():
    # A grouped convolution on a CPU runs as a function of its own (XLA), which cannot
    # read a variable that lives on another device: the stages must be placed copies, as
    # the pipeline runs them (ConvNeXt's depthwise convolutions failed this way).
    import keras

    inputs = keras.Input((8, 8, 4))
    h = keras.layers.Conv2D(4, 3, padding="same", name="first")(inputs)
    h = keras.layers.Conv2D(4, 3, padding="same", groups=2, name="grouped")(h)
    outputs = keras.layers.Dense(3, name="head")(keras.layers.Flatten(name="flat")(h))
    model = keras.Model(inputs, outputs)
    weights = [w.numpy() for w in model.weights]
    times = costmodel.measure_stages(model, ["first"], 2, repeats=1, warmup=0,
                                     device=["/CPU:0", "/CPU:1"])
    assert len(times) == 2 and all(0 < f <= fb for f, fb in times)
    for a, b in zip(weights, model.weights):  # the model itself was not trained
        assert (a == b.numpy()).all()
    with pytest.raises(ValueError, match="one per stage"):
        costmodel.measure_stages(model, ["first"], 2, device=["/CPU:0"])


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_profile_model_counts_a_mixed_precision_policy_s_two_byte_activations(policy):
    # Built under the policy, the layers compute and output in 16 bits while their weights
    # stay float32; the model's inputs and a float32 output layer stay 4 bytes per element.
    import keras

    def build():
        inputs = keras.Input((6,), name="x")
        h = keras.layers.Dense(5, name="d1")(inputs)
        h = keras.layers.Activation("relu", name="act")(h)
        h = keras.layers.Dense(3, name="d2")(h)
        outputs = keras.layers.Activation("linear", dtype="float32", name="out")(h)
        return keras.Model(inputs, outputs)

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        mixed = build()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert mixed.get_layer("d1").dtype_policy.compute_dtype != "float32"
    full = build()
    profiles = {
        name: costmodel.profile_model(model, batch_size=4, repeats=1, warmup=0)
        for name, model in (("float32", full), (policy, mixed))
    }
    # Per example: d1 and act 5 elements, d2 3, out 3 (float32 in both).
    assert [x.output_bytes for x in profiles["float32"].layers] == [20, 20, 12, 12]
    assert [x.output_bytes for x in profiles[policy].layers] == [10, 10, 6, 12]
    for profile in profiles.values():
        assert [x.activation_bytes for x in profile.layers] == [
            x.output_bytes for x in profile.layers
        ]
        assert [x.weight_bytes for x in profile.layers] == [4 * (6 * 5 + 5), 0, 4 * (5 * 3 + 3), 0]
        assert profile.input_bytes == 24  # 6 float32 inputs
    # The planner's terms follow: cut after act (stage 1 keeps act's 5 and d2's and out's
    # 3 + 3 elements per example, at batch 4), weights and slots unchanged.
    half = costmodel.StageTerms(profiles[policy], 4, 2, mode="sync").estimate(2, 3, 1)
    whole = costmodel.StageTerms(profiles["float32"], 4, 2, mode="sync").estimate(2, 3, 1)
    assert whole.activation_bytes == 4 * (20 + 12 + 12)
    assert half.activation_bytes == 4 * (10 + 6 + 12)
    assert (half.param_bytes, half.optimizer_bytes) == (whole.param_bytes, whole.optimizer_bytes)
