"""tf_spectrain.app.trainers: one factory for every mode, as train.py and the benchmarks use it.

Only one-device MirroredStrategy here: a second multi-device strategy in the test process
clashes with the collective ops of test_cli's dp run.
"""

import keras
import numpy as np
import pytest

from tf_spectrain import checkpoint
from tf_spectrain.app import trainers
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.schedule import modes

DEVICES = ["/CPU:0", "/CPU:1"]


def mlp():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,), name="features")
    h = inputs
    for n, width in enumerate([6, 6, 3]):
        h = keras.layers.Dense(width, name=f"dense{n}")(h)
    return keras.Model(inputs, h, name="mlp")


def build(mode, devices=DEVICES, **kwargs):
    settings = dict(learning_rate=0.05, momentum=0.8, weight_decay=1e-4, metrics=["accuracy"])
    settings.update(kwargs)
    return trainers.build_trainer(mlp, mode, devices, **settings)


def _settings(optimizer):
    config = optimizer.get_config()
    return (config["learning_rate"], config["momentum"], config["weight_decay"])


@pytest.mark.parametrize("mode", modes.PIPELINE_MODES)
def test_pipeline_modes_build_a_compiled_pipeline(mode):
    pipe = build(mode)
    assert isinstance(pipe, PipelineModel) and pipe.mode == mode
    assert pipe.devices == DEVICES
    # The default: cuts planned from measured time (which ones depends on the timings).
    assert pipe.planned_cuts and pipe.cuts == pipe.partition_plan.cuts and len(pipe.cuts) == 1
    if mode == "nesterov":  # each stage's Nesterov form, its momentum raised by its delay
        assert all(type(o) is keras.optimizers.SGD and o.nesterov for o in pipe.stage_optimizers)
        momenta = [modes.nesterov_coefficient(0.8, k, 2) for k in range(2)]
    else:
        assert all(type(o) is SpecTrainSGD for o in pipe.stage_optimizers)
        momenta = [0.8, 0.8]
    for optimizer, momentum in zip(checkpoint.trainer_optimizers(pipe), momenta):
        assert _settings(optimizer) == pytest.approx((0.05, momentum, 1e-4))
    assert checkpoint.trainer_model(pipe) is pipe.model
    # The caller's seed gives the weights: the same as a model built right after it.
    for a, b in zip(pipe.model.get_weights(), mlp().get_weights()):
        np.testing.assert_array_equal(a, b)


def test_cuts_given_or_chosen_by_a_function_of_the_model():
    assert build("stash", cuts=["dense0"]).cuts == ["dense0"]
    assert build("sync", cuts=lambda model: [model.layers[-2].name]).cuts == ["dense1"]
    sync = build("sync", cuts=("dense1",), micro_batches=2, spectrain_target="consistent")
    assert (sync.micro_batches, sync.spectrain_target) == (2, "consistent")


@pytest.mark.parametrize("mode", modes.BASELINES)
def test_baselines_build_a_compiled_keras_model(mode):
    model = build(mode, devices=["/CPU:1"], weight_decay=0)
    assert isinstance(model, keras.Model) and checkpoint.trainer_model(model) is model
    assert type(model.optimizer) is keras.optimizers.SGD
    assert checkpoint.trainer_optimizers(model) == [model.optimizer]
    learning_rate, momentum, weight_decay = _settings(model.optimizer)
    assert (learning_rate, momentum) == pytest.approx((0.05, 0.8))
    assert weight_decay is None  # 0 means none
    kernel = model.trainable_variables[0]
    if mode == "single":
        assert kernel.value.device.endswith("CPU:1")
    else:
        assert model.distribute_strategy.num_replicas_in_sync == 1
    x = np.zeros((4, 5), "float32")
    assert model.evaluate(x, np.zeros(4, "int32"), verbose=0)[0] >= 0  # compiled, with a loss


def test_dp_across_hosts_is_one_stage_replicated_and_takes_data_parallel_steps():
    # Across hosts dp is the pipeline's replicas of one stage (Keras' fit cannot run under
    # MultiWorkerMirroredStrategy); their steps are those of the same batch on one copy.
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(32, 5)).astype("float32"), rng.integers(0, 3, 32).astype("int32")
    across = build("dp", devices=["/CPU:1", "/CPU:2"], across_hosts=True, weight_decay=0)
    assert isinstance(across, PipelineModel)
    assert (across.mode, across.num_stages, across.replicas, across.cuts) == ("sync", 1, 2, [])
    assert across.replica_devices == [["/CPU:1"], ["/CPU:2"]]
    one = build("dp", devices=["/CPU:1"], weight_decay=0)  # MirroredStrategy, one device
    for trainer in (across, one):
        trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(across.model.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "args, error, pattern",
    [
        ((mlp, "pipe", DEVICES), ValueError, r"`mode` must be one of .*'single', 'dp'\]"),
        ((mlp, "sync", []), ValueError, r"at least one device"),
        ((mlp, "sync", "/CPU:0"), TypeError, r"`devices` must be a list or tuple"),
        ((mlp(), "sync", DEVICES), TypeError, r"`build_model` must be a function"),
    ],
)
def test_bad_arguments(args, error, pattern):
    with pytest.raises(error, match=pattern):
        trainers.build_trainer(*args, learning_rate=0.1)
