"""Keras' knobs in a pipeline: learning rates changed during an epoch, schedules, clipping.

Every mode is checked against the NumPy reference of SPECTRAIN.md (spectrain_reference.py,
extended with per-step learning rates and Keras' clipping rules), and sync mode also
against plain Keras `model.fit`.
"""

import keras
import numpy as np
import pytest
import spectrain_reference as ref
from step_helpers import rel_error
from test_pipeline_modes import (
    ATOL,
    BATCH,
    EPOCHS,
    LAYERS,
    MODES,
    MOMENTUM,
    NUM_BATCHES,
    STAGE_SIZES,
    cuts_for,
    keras_mlp,
    max_diff,
)

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD

NUM_STAGES = 3
LR = 0.2


@pytest.fixture(scope="module")
def problem():
    return ref.make_problem(11, LAYERS, NUM_BATCHES, BATCH)


def _arrays(batches):
    x = np.concatenate([b[0] for b in batches]).astype("float32")
    return x, np.concatenate([b[1] for b in batches])


def _warmup(step):
    """A learning rate that changes at every mini-batch: warm-up, then decay."""
    return LR * min(1.0, (step + 1) / 4) * 0.9 ** max(0, step - 4)


class _BatchRate(keras.callbacks.Callback):
    """Sets the learning rate at every batch begin, as a warm-up callback does."""

    def __init__(self, rate, num_batches):
        super().__init__()
        self.rate, self.num_batches, self.epoch = rate, num_batches, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.learning_rate = self.rate(self.epoch * self.num_batches + batch)


def _pipe(params, mode, target, **optimizer_options):
    model = keras_mlp(params)
    pipe = PipelineModel(model, cuts=cuts_for(STAGE_SIZES[NUM_STAGES]), mode=mode,
                         spectrain_target=target)
    optimizer_options.setdefault("learning_rate", LR)
    pipe.compile(optimizer=SpecTrainSGD(momentum=MOMENTUM, **optimizer_options),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return pipe, model


def _reference(problem, mode, target, lr=LR, clip=None):
    params, batches = problem
    final, _ = ref.train_reference(params, STAGE_SIZES[NUM_STAGES], batches, mode=mode, lr=lr,
                                   momentum=MOMENTUM, epochs=EPOCHS, target=target, clip=clip)
    return [a for pair in final for a in pair]


def _keras_fit(params, batches, callbacks=(), **optimizer_options):
    model = keras_mlp(params)
    optimizer_options.setdefault("learning_rate", LR)
    model.compile(optimizer=keras.optimizers.SGD(momentum=MOMENTUM, **optimizer_options),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(*_arrays(batches), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=list(callbacks))
    return model.get_weights()


def _keras_fit_once(params, batches, **optimizer_options):
    """`_keras_fit` without callbacks, computed once per problem and optimizer options (several
    tests compare with the same run)."""
    key = (id(params), tuple(sorted(optimizer_options.items())))
    if key not in _KERAS_FITS:
        _KERAS_FITS[key] = (params, _keras_fit(params, batches, **optimizer_options))
    kept_params, weights = _KERAS_FITS[key]
    assert kept_params is params
    return weights


_KERAS_FITS = {}


@pytest.mark.parametrize("mode, target", MODES)
def test_a_rate_set_on_batch_begin_reaches_every_stage_before_that_batchs_update(
    problem, mode, target
):
    params, batches = problem
    pipe, model = _pipe(params, mode, target)
    pipe.fit(*_arrays(batches), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
             callbacks=[_BatchRate(_warmup, NUM_BATCHES)])
    expected = _reference(problem, mode, target, lr=_warmup)
    assert max_diff(model.get_weights(), expected) < ATOL
    # The per-batch rates matter: at the epoch-start rates the weights are far off.
    epochwise = _reference(problem, mode, target,
                           lr=lambda step: _warmup(step - step % NUM_BATCHES))
    assert max_diff(epochwise, expected) > 100 * ATOL
    if mode == "sync":  # and sync equals plain Keras `fit` with the same callback
        w0 = keras_mlp(params).get_weights()
        keras_weights = _keras_fit(params, batches, [_BatchRate(_warmup, NUM_BATCHES)])
        assert rel_error(model.get_weights(), keras_weights, w0) < 1e-5


# A learning-rate schedule in every mode (against the NumPy reference, and in sync mode
# against Keras' `fit`) is test_runtime_edges.py's
# test_a_learning_rate_schedule_in_every_mode_uses_schedule_of_the_step.


CLIPS = [("clipnorm", 0.05), ("clipvalue", 0.004)]


@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("mode, target", MODES)
def test_per_variable_clipping_works_in_every_mode(problem, mode, target, clip):
    params, _ = problem
    pipe, model = _pipe(params, mode, target, **{clip[0]: clip[1]})
    pipe.fit(*_arrays(problem[1]), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    expected = _reference(problem, mode, target, clip=clip)
    assert max_diff(model.get_weights(), expected) < ATOL
    assert max_diff(_reference(problem, mode, target), expected) > 100 * ATOL  # it clips


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_sync_global_clipnorm_clips_by_the_norm_over_all_stages(problem, micro_batches):
    params, batches = problem
    model = keras_mlp(params)
    pipe = PipelineModel(model, cuts=cuts_for(STAGE_SIZES[NUM_STAGES]), mode="sync",
                         micro_batches=micro_batches)
    pipe.compile(optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM, global_clipnorm=0.1),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pipe.fit(*_arrays(batches), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    expected = _reference(problem, "sync", "paper", clip=("global_clipnorm", 0.1))
    assert max_diff(model.get_weights(), expected) < ATOL
    w0 = keras_mlp(params).get_weights()
    keras_weights = _keras_fit_once(params, batches, global_clipnorm=0.1)
    assert rel_error(model.get_weights(), keras_weights, w0) < 1e-5
    # Clipping each stage by its own norm would be something else:
    per_stage = _reference(problem, "sync", "paper", clip=("clipnorm", 0.1))
    assert max_diff(per_stage, expected) > 100 * ATOL
    assert pipe.optimizer.global_clipnorm == 0.1  # the compiled optimizer keeps its config


@pytest.mark.parametrize("mode", ["vanilla", "stash", "spectrain"])
def test_global_clipnorm_is_refused_outside_sync_with_the_reason_and_the_fix(mode):
    model = keras_mlp(ref.make_problem(0, LAYERS, 1, 4)[0])
    pipe = PipelineModel(model, cuts=cuts_for(STAGE_SIZES[2]), mode=mode)
    with pytest.raises(ValueError, match="no such gradient") as info:
        pipe.compile(optimizer=SpecTrainSGD(0.1, momentum=0.9, global_clipnorm=1.0),
                     loss="sparse_categorical_crossentropy")
    assert "clipnorm" in str(info.value) and f"mode={mode!r}" in str(info.value)


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_micro_batches_count_every_stages_layer_losses_once(micro_batches):
    # Weight regularizers on the first and middle stages, an activity regularizer (Keras
    # divides it by the batch size) on the middle one: M micro-batches must add them up
    # to what one whole mini-batch gives, as Keras' fit computes them.
    keras.utils.set_random_seed(4)
    reg = keras.regularizers.L2(0.05)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="a", kernel_regularizer=reg)(inputs)
    h = keras.layers.Dense(8, activation="tanh", name="b", kernel_regularizer=reg,
                           activity_regularizer=keras.regularizers.L1(0.02))(h)
    outputs = keras.layers.Dense(3, name="c")(h)
    model = keras.Model(inputs, outputs)
    w0 = model.get_weights()
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(32, 6)).astype("float32"), rng.integers(0, 3, 32)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    pipe = PipelineModel(model, cuts=["a", "b"], mode="sync", micro_batches=micro_batches)
    pipe.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.5), loss=loss)
    history = pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    reference = keras.models.clone_model(model)
    reference.set_weights(w0)
    reference.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.5), loss=loss)
    expected = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert rel_error(model.get_weights(), reference.get_weights(), w0) < 1e-5
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
