"""Modes "nesterov" and "2bw" (SPECTRAIN.md section 6e) in the engine, against the NumPy reference.

The pipelines train the MLP of test_pipeline_modes.py; their final weights and losses must
equal the independent reference's (spectrain_reference.py) to float32 tolerance, while each
mode's result is far from stash's (so the comparison can tell them apart). The pure rules
(`applies_update`, `check_accumulate`, `nesterov_coefficient`, the probes' horizons) are
checked on tables, and a 2bw stage's weight copies against stash's.
"""

import keras
import numpy as np
import pytest
import spectrain_reference as ref
from runtimes import EAGER, compile_quietly
from test_faults import StopAt
from test_pipeline_modes import (
    BATCH,
    EPOCHS,
    LAYERS,
    LR,
    MOMENTUM,
    NUM_BATCHES,
    STAGE_SIZES,
    cuts_for,
    keras_mlp,
    max_diff,
    train_pipeline,
)

from tf_spectrain import prediction
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.schedule import modes
from tf_spectrain.schedule.options import PipelineOptions

ATOL = 2e-5
ADAM = dict(beta_1=0.875, beta_2=1 - 2 ** -10)  # exact in float32 (see test_pipeline_modes)
ADAM_LR, ADAM_WD = 0.01, 0.125


@pytest.fixture(scope="module")
def problem():
    return ref.make_problem(7, LAYERS, NUM_BATCHES, BATCH)


def flat(final):
    return [a for pair in final for a in pair]


def reference(problem, num_stages, mode, epochs=EPOCHS, **options):
    params, batches = problem
    options.setdefault("lr", LR)
    if options.get("optimizer", "sgd") == "sgd":
        options.setdefault("momentum", MOMENTUM)
    final, losses = ref.train_reference(params, STAGE_SIZES[num_stages], batches, mode=mode,
                                        epochs=epochs, **options)
    return flat(final), losses


def epoch_means(losses, epochs=EPOCHS):
    return np.mean(np.reshape(losses, (epochs, -1)), axis=1)


# --- the pure rules ------------------------------------------------------------------------


@pytest.mark.parametrize("num_batches, accumulate, applied", [
    (7, 1, [0, 1, 2, 3, 4, 5, 6]),
    (7, 3, [2, 5, 6]),  # the epoch's last mini-batch closes a short group
    (8, 4, [3, 7]),
    (3, 4, [2]),  # an epoch shorter than a group: one update at its end
])
def test_applies_update_on_a_table(num_batches, accumulate, applied):
    got = [i for i in range(num_batches) if modes.applies_update(i, num_batches, accumulate)]
    assert got == applied


def test_accumulate_is_checked_with_clear_messages():
    assert PipelineOptions(mode="2bw").updates_every(4) == 4
    assert PipelineOptions(mode="2bw", accumulate=6).updates_every(4) == 6
    assert PipelineOptions(mode="stash").updates_every(4) == 1
    with pytest.raises(ValueError, match=r"at least the number of stages \(4\).*accumulate=3"):
        PipelineOptions(mode="2bw", accumulate=3).updates_every(4)
    with pytest.raises(ValueError, match=r"mode '2bw'. Received: accumulate=4 with mode='stash'"):
        PipelineOptions(mode="stash", accumulate=4)
    with pytest.raises(ValueError, match="accumulate"):
        PipelineOptions(mode="2bw", accumulate=0)
    with pytest.raises(TypeError, match="accumulate"):
        PipelineOptions(mode="2bw", accumulate=2.5)


def test_accumulate_below_the_stage_count_is_refused_before_anything_is_built(problem):
    with pytest.raises(ValueError, match=r"at least the number of stages \(3\)"):
        PipelineModel(keras_mlp(problem[0]), cuts=cuts_for(STAGE_SIZES[3]), mode="2bw",
                      accumulate=2)


@pytest.mark.parametrize("base, num_stages, expected", [
    (0.9, 1, [0.9]),
    (0.9, 2, [0.945, 0.9]),
    (0.9, 4, [0.9675, 0.945, 0.9225, 0.9]),
    (0.5, 2, [0.745, 0.5]),
    (0.0, 2, [0.495, 0.0]),
    (0.995, 3, [0.995, 0.995, 0.995]),  # from 0.99 up: kept
])
def test_nesterov_coefficient_on_a_table(base, num_stages, expected):
    got = [modes.nesterov_coefficient(base, k, num_stages) for k in range(num_stages)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("mode, num_stages, expected", [
    ("nesterov", 4, [(3, 0), (2, 0), (2, 1), (1, 1)]),  # as stash: the paper's gaps
    ("stash", 4, [(3, 0), (2, 0), (2, 1), (1, 1)]),
    ("2bw", 4, [(1, 1), (1, 1), (1, 1), (0, 0)]),  # one update ahead, but the last stage
    ("2bw", 1, [(0, 0)]),
])
def test_probe_horizons_of_the_new_modes(mode, num_stages, expected):
    got = [modes.probe_horizons(mode, k, num_stages) for k in range(num_stages)]
    assert got == expected


# --- 2bw -----------------------------------------------------------------------------------


@pytest.mark.parametrize("num_stages, accumulate, micro_batches, options", [
    (3, None, 1, {}),
    (4, 4, 1, {}),
    (4, 5, 1, {"steps_per_execution": 64}),  # one window per epoch, groups held in it
    # Windows of one: a window's place in its group decides which held gradient it adds to.
    (3, 3, 1, {"steps_per_execution": 1}),
    (2, 3, 2, {}),
    (3, 3, 2, {"recompute": "always"}),
    # Windows of 2: groups of 3 and 4 held across windows, the last group cut short.
    (3, 3, 1, {"steps_per_execution": 2}),
    (4, 4, 2, {"steps_per_execution": 2, "recompute": "always"}),
])
def test_2bw_matches_the_reference(problem, num_stages, accumulate, micro_batches, options):
    want, losses = reference(problem, num_stages, "2bw",
                             accumulate=accumulate or num_stages, micro_batches=micro_batches)
    options = dict({"steps_per_execution": EAGER}, **options)
    got, history = train_pipeline(*problem, num_stages, "2bw", "paper",
                                  micro_batches=micro_batches, accumulate=accumulate, **options)
    assert max_diff(got, want) < ATOL
    np.testing.assert_allclose(history.history["loss"], epoch_means(losses), rtol=1e-4)
    stash, _ = reference(problem, num_stages, "stash", micro_batches=micro_batches)
    assert max_diff(want, stash) > 100 * ATOL


@pytest.mark.parametrize("steps_per_execution", [EAGER, 2])
def test_2bw_with_replicas_matches_the_reference(problem, steps_per_execution):
    # Each replica's gradient is summed over the replicas at every mini-batch's update; the
    # group's sum is held once, so the copies apply the same mean.
    want, _ = reference(problem, 2, "2bw", accumulate=2, micro_batches=2)
    got, _ = train_pipeline(*problem, 2, "2bw", "paper", micro_batches=2, accumulate=2,
                            replicas=2, devices=["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"],
                            steps_per_execution=steps_per_execution)
    assert max_diff(got, want) < ATOL


@pytest.mark.parametrize("steps_per_execution, accumulate, stop_after, applied", [
    (EAGER, 4, 0, 1),  # stopped after mini-batch 0: 3 fed, one group of them cut short
    (2, 4, 1, 1),  # after the first window (mini-batches 0-1): 3 fed, held across windows
])
def test_2bw_stopped_mid_group_applies_what_it_held(problem, steps_per_execution, accumulate,
                                                    stop_after, applied):
    # Stopped in an epoch of 5: the mini-batches already fed finish, and their unfinished
    # group is applied at the stop, as in an epoch of that many.
    params, batches = problem
    model = keras_mlp(params)
    pipe = PipelineModel(model, cuts=cuts_for(STAGE_SIZES[3]), mode="2bw",
                         accumulate=accumulate)
    compile_quietly(pipe, prediction.SpecTrainSGD(LR, momentum=MOMENTUM),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=steps_per_execution)
    x = np.concatenate([b[0] for b in batches]).astype("float32")
    y = np.concatenate([b[1] for b in batches])
    pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
             callbacks=[StopAt(stop_after)])
    done = pipe.epoch_progress[1]
    assert 1 <= done < NUM_BATCHES and done % accumulate != 0
    final, _ = ref.train_reference(params, STAGE_SIZES[3], batches[:done], mode="2bw", lr=LR,
                                   momentum=MOMENTUM, accumulate=accumulate)
    assert max_diff(model.get_weights(), flat(final)) < ATOL
    assert all(r.updates == applied for r in pipe.runners)


@pytest.mark.parametrize("num_stages, devices", [(4, None), (8, ["/CPU:0"] * 8)])
def test_2bw_keeps_one_older_weight_copy_where_stash_keeps_one_per_delay(num_stages, devices):
    # With recompute="always" the stages keep explicit copies of the forward's weights: a
    # copy of the current weights shares their memory until the next update, so the copies
    # counted are of older versions: stash's stage k holds N - 1 - k, 2bw's at most one.
    layers = [6] + [8] * num_stages
    params, batches = ref.make_problem(3, layers, 2 * num_stages + 1, BATCH)
    x = np.concatenate([b[0] for b in batches]).astype("float32")
    y = np.concatenate([b[1] for b in batches]) % layers[-1]
    copies = {}
    for mode in ("stash", "2bw"):
        inputs = keras.Input((layers[0],))
        h = inputs
        for n, (w, _) in enumerate(params):
            h = keras.layers.Dense(w.shape[1], name=f"dense{n}")(h)
        pipe = PipelineModel(keras.Model(inputs, h), mode=mode, recompute="always",
                             cuts=[f"dense{n}" for n in range(num_stages - 1)],
                             devices=devices)
        compile_quietly(pipe, keras.optimizers.SGD(0.01, momentum=0.9),
                        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        steps_per_execution=EAGER)  # the copies each pass keeps
        pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        copies[mode] = [r.memory.estimate().peak_weight_copies for r in pipe.runners]
    assert copies["stash"] == [num_stages - 1 - k for k in range(num_stages)]
    assert copies["2bw"] == [1] * (num_stages - 1) + [0]


# --- nesterov ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_stages, steps_per_execution, micro_batches", [
    (4, EAGER, 1), (4, 2, 1), (3, "auto", 2), (2, 1, 2)])
def test_nesterov_sgd_matches_the_reference(problem, num_stages, steps_per_execution,
                                            micro_batches):
    want, losses = reference(problem, num_stages, "nesterov", micro_batches=micro_batches)
    got, history = train_pipeline(*problem, num_stages, "nesterov", "paper",
                                  micro_batches=micro_batches,
                                  optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM),
                                  steps_per_execution=steps_per_execution)
    assert max_diff(got, want) < ATOL
    np.testing.assert_allclose(history.history["loss"], epoch_means(losses), rtol=1e-4)
    stash, _ = reference(problem, num_stages, "stash", micro_batches=micro_batches)
    assert max_diff(want, stash) > 100 * ATOL


@pytest.mark.parametrize("mode, steps_per_execution", [("nesterov", 2), ("2bw", 1)])
def test_the_new_modes_compiled_with_xla_match_the_reference(problem, mode,
                                                             steps_per_execution):
    want, _ = reference(problem, 3, mode, **({"accumulate": 3} if mode == "2bw" else {}))
    optimizer = keras.optimizers.SGD(LR, momentum=MOMENTUM) if mode == "nesterov" else None
    got, _ = train_pipeline(*problem, 3, mode, "paper", optimizer=optimizer,
                            steps_per_execution=steps_per_execution, jit_compile=True)
    assert max_diff(got, want) < ATOL


@pytest.mark.parametrize("optimizer, num_stages, options", [
    ("adamw", 3, {}),
    ("adamw", 4, {"micro_batches": 2, "recompute": "always"}),
    ("adam", 2, {"steps_per_execution": EAGER}),
])
def test_nesterov_adam_family_matches_the_reference(problem, optimizer, num_stages, options):
    # AdamW and Adam become NAdam with PyTorch's schedule (momentum_decay 0.004), each stage
    # with its beta_1 raised by its delay.
    decay = ADAM_WD if optimizer == "adamw" else None
    keras_optimizer = (keras.optimizers.AdamW(ADAM_LR, weight_decay=ADAM_WD, **ADAM)
                       if optimizer == "adamw" else keras.optimizers.Adam(ADAM_LR, **ADAM))
    want, _ = reference(problem, num_stages, "nesterov", epochs=1, lr=ADAM_LR,
                        optimizer=optimizer, weight_decay=decay, momentum_decay=0.004,
                        micro_batches=options.get("micro_batches", 1), **ADAM)
    got, _ = train_pipeline(*problem, num_stages, "nesterov", "paper", epochs=1,
                            optimizer=keras_optimizer, **options)
    start = flat(problem[0])
    assert max_diff(got, want) / max_diff(want, start) < 3e-5


def test_nesterov_stages_get_their_own_nesterov_optimizers(problem):
    pipe = PipelineModel(keras_mlp(problem[0]), cuts=cuts_for(STAGE_SIZES[4]), mode="nesterov")
    pipe.compile(keras.optimizers.AdamW(ADAM_LR, weight_decay=ADAM_WD),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for k, runner in enumerate(pipe.runners):
        assert isinstance(runner.optimizer, prediction.Nadam)
        assert runner.optimizer.beta_1 == pytest.approx(modes.nesterov_coefficient(0.9, k, 4))
        assert runner.optimizer.momentum_decay == pytest.approx(0.004)


def test_nesterov_refuses_an_optimizer_without_a_nesterov_form(problem):
    pipe = PipelineModel(keras_mlp(problem[0]), cuts=cuts_for(STAGE_SIZES[2]), mode="nesterov")
    with pytest.raises(ValueError, match="mode 'nesterov' takes SGD, Adam, AdamW or Nadam.*"
                                         "RMSprop"):
        pipe.compile(keras.optimizers.RMSprop(0.01),
                     keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def test_one_stage_2bw_equals_keras_on_merged_batches_with_an_embedding():
    # One stage has no delay: each update applies the mean gradient of A mini-batches of
    # equal size, which is Keras' step on their merged batch. The embedding's gradients are
    # IndexedSlices, held and averaged as such.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, size=(48, 5))
    y = rng.integers(0, 3, size=48)

    def model():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((5,), dtype="int32")
        h = keras.layers.Embedding(20, 4, name="embed")(inputs)
        h = keras.layers.GlobalAveragePooling1D()(h)
        return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    plain = model()
    plain.compile(keras.optimizers.SGD(0.5, momentum=0.9), loss)
    plain.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
    pipe = PipelineModel(model(), cuts=[], mode="2bw", accumulate=3, devices=["/CPU:0"])
    pipe.compile(keras.optimizers.SGD(0.5, momentum=0.9), loss)
    pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert max_diff(pipe.model.get_weights(), plain.get_weights()) < 1e-6
    assert max_diff(pipe.model.get_weights(), model().get_weights()) > 1e-2


@pytest.mark.parametrize("mode, steps_per_execution", [("stash", 2), ("nesterov", 1)])
def test_embedding_gradients_add_up_over_micro_batches(mode, steps_per_execution):
    # An embedding's gradients are IndexedSlices: summed over micro-batches (in windows and
    # pass by pass) they must give the one-micro-batch result, no layer depending on the
    # batch. Windows failed on adding two IndexedSlices before.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, size=(48, 5)).astype("int32")
    y = rng.integers(0, 3, size=48)

    def model():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((5,), dtype="int32")
        h = keras.layers.Embedding(20, 4, name="embed")(inputs)
        h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
        h = keras.layers.Dense(8, activation="tanh", name="d0")(h)
        return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))

    weights = {}
    for micro_batches in (1, 2):
        pipe = PipelineModel(model(), cuts=["pool", "d0"], mode=mode,
                             micro_batches=micro_batches)
        pipe.compile(keras.optimizers.SGD(0.5, momentum=0.9),
                     keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     steps_per_execution=steps_per_execution)
        pipe.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        weights[micro_batches] = pipe.model.get_weights()
    assert max_diff(weights[1], weights[2]) < 1e-5
    assert max_diff(weights[1], model().get_weights()) > 1e-2


def test_2bw_refuses_a_learning_rate_schedule(problem):
    pipe = PipelineModel(keras_mlp(problem[0]), cuts=cuts_for(STAGE_SIZES[2]), mode="2bw")
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    with pytest.raises(ValueError, match="mode '2bw' with a learning-rate schedule.*"
                                         "LearningRateScheduler"):
        pipe.compile(keras.optimizers.SGD(schedule, momentum=0.9),
                     keras.losses.SparseCategoricalCrossentropy(from_logits=True))
