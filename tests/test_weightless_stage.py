"""A stage without trainable weights (only padding, rescaling, pooling) trains in every mode.

keras.applications' ResNet50 starts with `conv1_pad` (ZeroPadding2D): a cut right after it
leaves stage 0 without weights, whose update must be a no-op rather than an error.
"""

import keras
import numpy as np
import pytest

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def padded_model():
    inp = keras.Input((6, 6, 2))
    x = keras.layers.ZeroPadding2D(1, name="pad")(inp)
    x = keras.layers.Rescaling(0.5, name="scale")(x)
    x = keras.layers.Conv2D(3, 3, name="conv")(x)
    x = keras.layers.Flatten(name="flat")(x)
    return keras.Model(inp, keras.layers.Dense(4, name="logits")(x))


@pytest.mark.parametrize("mode", ["sync", "stash", "vanilla", "spectrain"])
def test_a_stage_without_weights_trains(mode):
    keras.utils.set_random_seed(0)
    model = padded_model()
    w0 = model.get_weights()
    pipe = PipelineModel(model, cuts=["scale"], mode=mode)
    assert pipe.stages[0].trainable_weights == []
    pipe.compile(SpecTrainSGD(0.05, momentum=0.9), LOSS)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 6, 6, 2)).astype("float32"), rng.integers(0, 4, 16)
    pipe.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    assert pipe.runners[-1].updates == 8
    moved = [np.abs(a - b).max() for a, b in zip(model.get_weights(), w0)]
    assert min(moved) > 0
    if mode == "sync":  # sequential SGD: the same steps as Keras
        reference = padded_model()
        reference.set_weights(w0)
        reference.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS)
        reference.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_stage_without_weights_is_probed(tmp_path):
    # Telemetry measures prediction errors on every stage, each after its update; a
    # weightless stage has none to measure (the distance of no weights is 0), and used to
    # fail there: tf.add_n of an empty list.
    from tf_spectrain.callbacks import Telemetry

    keras.utils.set_random_seed(0)
    model = padded_model()
    pipe = PipelineModel(model, cuts=["scale"], mode="spectrain")
    pipe.compile(SpecTrainSGD(0.05, momentum=0.9), LOSS)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 6, 6, 2)).astype("float32"), rng.integers(0, 4, 16)
    telemetry = Telemetry(tmp_path, log_every=1, prediction_every=1)
    pipe.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=[telemetry])
    assert pipe.runners[-1].updates == 4
    assert np.isfinite(pipe.evaluate(x, y, verbose=0))
