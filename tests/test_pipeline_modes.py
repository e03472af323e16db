"""Every mode against the independent NumPy reference of SPECTRAIN.md (spectrain_reference.py).

A small MLP is trained as a 2-, 3- and 4-stage pipeline for several epochs; the final weights
of each mode must equal the reference's to float32 tolerance, while the modes differ from one
another by far more than that tolerance (so the comparison can tell them apart).
"""

import itertools

import keras
import numpy as np
import pytest
import spectrain_reference as ref

from tf_spectrain.optimizer import SpecTrainSGD
from tf_spectrain.pipeline_model import PipelineModel

LAYERS = [6, 10, 10, 10, 4]  # 4 Dense layers
STAGE_SIZES = {2: [2, 2], 3: [1, 2, 1], 4: [1, 1, 1, 1]}
LR, MOMENTUM, EPOCHS = 0.2, 0.9, 3
NUM_BATCHES, BATCH = 5, 8
ATOL = 2e-5
MODES = [("sync", "paper"), ("vanilla", "paper"), ("stash", "paper"),
         ("spectrain", "paper"), ("spectrain", "consistent")]


def keras_mlp(params):
    inputs = keras.Input((LAYERS[0],))
    h = inputs
    for n, (w, _) in enumerate(params):
        last = n == len(params) - 1
        h = keras.layers.Dense(w.shape[1], activation=None if last else "relu", name=f"dense{n}")(h)
    model = keras.Model(inputs, h)
    model.set_weights([a.astype("float32") for pair in params for a in pair])
    return model


def cuts_for(stage_sizes):
    ends = np.cumsum(stage_sizes)[:-1] - 1
    return [f"dense{e}" for e in ends]


def train_pipeline(params, batches, num_stages, mode, target, micro_batches=1, **options):
    model = keras_mlp(params)
    pipe = PipelineModel(model, cuts=cuts_for(STAGE_SIZES[num_stages]), mode=mode,
                         spectrain_target=target, micro_batches=micro_batches, **options)
    pipe.compile(optimizer=SpecTrainSGD(learning_rate=LR, momentum=MOMENTUM),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.concatenate([b[0] for b in batches]).astype("float32")
    y = np.concatenate([b[1] for b in batches])
    history = pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return model.get_weights(), history


@pytest.fixture(scope="module")
def problem():
    return ref.make_problem(7, LAYERS, NUM_BATCHES, BATCH)


def reference(problem, num_stages, mode, target, micro_batches=1):
    params, batches = problem
    final, losses = ref.train_reference(
        params, STAGE_SIZES[num_stages], batches, mode=mode, lr=LR, momentum=MOMENTUM,
        epochs=EPOCHS, target=target, micro_batches=micro_batches)
    return [a for pair in final for a in pair], losses


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


@pytest.mark.parametrize("num_stages", [2, 3, 4])
@pytest.mark.parametrize("mode, target", MODES)
def test_mode_matches_numpy_reference(problem, num_stages, mode, target):
    expected, expected_losses = reference(problem, num_stages, mode, target)
    got, history = train_pipeline(*problem, num_stages, mode, target)
    assert max_diff(got, expected) < ATOL
    # The epoch loss Keras reports is the mean of the per-mini-batch losses.
    epoch_losses = np.mean(np.reshape(expected_losses, (EPOCHS, NUM_BATCHES)), axis=1)
    np.testing.assert_allclose(history.history["loss"], epoch_losses, rtol=1e-4)


@pytest.mark.parametrize("num_stages", [3, 4])
def test_modes_are_far_apart(problem, num_stages):
    results = {m: reference(problem, num_stages, *m)[0] for m in MODES}
    for a, b in itertools.combinations(MODES, 2):
        assert max_diff(results[a], results[b]) > 100 * ATOL, (a, b)


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_sync_micro_batches_equal_full_batch(problem, micro_batches):
    expected, _ = reference(problem, 3, "sync", "paper")
    got, _ = train_pipeline(*problem, 3, "sync", "paper", micro_batches=micro_batches)
    assert max_diff(got, expected) < ATOL


@pytest.mark.parametrize("mode, target", MODES[1:])
def test_micro_batches_in_every_mode_match_the_reference(problem, mode, target):
    # SPECTRAIN.md section 5a: F(i) and B(i) run the micro-batches back to back, one update.
    expected, _ = reference(problem, 3, mode, target, micro_batches=2)
    got, _ = train_pipeline(*problem, 3, mode, target, micro_batches=2)
    assert max_diff(got, expected) < ATOL


@pytest.mark.parametrize("micro_batches", [4, 8])
def test_one_f_one_b_flush_gives_the_gpipe_result(problem, micro_batches):
    expected, _ = reference(problem, 4, "sync", "paper", micro_batches=micro_batches)
    got, history = train_pipeline(*problem, 4, "sync", "paper", micro_batches=micro_batches,
                                  schedule="1f1b")
    assert max_diff(got, expected) < ATOL


@pytest.mark.parametrize("mode, target", MODES)
def test_recompute_always_gives_the_reference_result(problem, mode, target):
    # Every backward recomputes (stash and consistent at a kept copy of the forward's
    # weights), micro-batches included: the same steps as the reference.
    expected, _ = reference(problem, 3, mode, target, micro_batches=2)
    got, _ = train_pipeline(*problem, 3, mode, target, micro_batches=2, recompute="always")
    assert max_diff(got, expected) < ATOL
