"""Shared by the checkpoint tests: a tiny pipeline with state beyond its weights, and
how to train it on a few digits and compare its whole state (weights and optimizer slots)."""

import keras
import numpy as np

from tf_spectrain import data
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

LIMIT, BATCH, EPOCHS = 48, 16, 3  # 3 mini-batches per epoch


def tiny_model(seed=0, width=12):
    """Dropout (random state) and BatchNorm (moving statistics): state beyond the weights."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.AveragePooling2D(4, name="pool")(inputs)
    h = keras.layers.Flatten(name="flatten")(h)
    h = keras.layers.Dense(width, activation="relu", name="dense0")(h)
    h = keras.layers.Dropout(0.3, name="drop")(h)
    h = keras.layers.BatchNormalization(momentum=0.5, name="bn")(h)
    h = keras.layers.Dense(width, activation="relu", name="dense1")(h)
    outputs = keras.layers.Dense(10, name="logits")(h)
    return keras.Model(inputs, outputs, name="tiny")


def pipeline(mode="spectrain", cuts=("dense0", "bn"), width=12, optimizer=None):
    pipe = PipelineModel(tiny_model(width=width), cuts=list(cuts), mode=mode)
    pipe.compile(
        optimizer() if optimizer else SpecTrainSGD(0.05, momentum=0.9, weight_decay=1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ["accuracy"],
    )
    return pipe


def epochs_data(start, stop, skip=0):
    return data.load_epochs(
        "digits", BATCH, epochs=stop, start_epoch=start, skip_batches=skip, seed=7, limit=LIMIT
    )


def train(pipe, start, stop, skip=0, callbacks=None):
    steps = data.steps_per_epoch("digits", BATCH, LIMIT) - skip
    pipe.fit(epochs_data(start, stop, skip), epochs=stop, initial_epoch=start,
             steps_per_epoch=steps, verbose=0, callbacks=callbacks)


def state(pipe):
    """Every stage's variables and optimizer variables, as arrays."""
    out = []
    for stage, optimizer in zip(pipe.stages, pipe.stage_optimizers):
        out += [np.array(v.numpy()) for v in stage.variables]
        out += [np.array(v.numpy()) for v in optimizer.variables]
    return out


def assert_same_state(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
