"""Data x pipeline hybrids (`PipelineModel(..., replicas=R)`, `runtime.replicas`).

Two replicas of a 2-stage pipeline on the 4 logical CPU devices take the same steps as the
single 2-stage pipeline with the same global batch, in every mode (the gradient of a
mini-batch is the sum of its halves' share-weighted gradients); the replicas' weights and
optimizer state are identical after every epoch; checkpoints restore every replica.
"""

import dataclasses
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_spectrain
from tf_spectrain.cluster import health
from tf_spectrain.runtime import replicas as replicas_lib

DEVICES = ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]
CASES = [("sync", "paper", 1), ("sync", "paper", 2), ("vanilla", "paper", 1),
         ("stash", "paper", 1), ("spectrain", "paper", 1), ("spectrain", "consistent", 1)]


def mlp(seed=0, batchnorm=False, regularized=True):
    keras.utils.set_random_seed(seed)
    reg = keras.regularizers.L2(1e-3) if regularized else None
    inputs = keras.Input((5,))
    h = keras.layers.Dense(8, activation="tanh", kernel_regularizer=reg, name="d0")(inputs)
    if batchnorm:
        h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dense(6, activation="relu", name="d1")(h)
    outputs = keras.layers.Dense(3, name="d2")(h)
    return keras.Model(inputs, outputs)


def data(n=48, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, n)


def trained(mode, target, micro, replicas, devices, epochs=2, **kwargs):
    model = mlp(**kwargs)
    pipe = tf_spectrain.PipelineModel(model, cuts=["d0"], devices=devices, mode=mode,
                                      spectrain_target=target, micro_batches=micro,
                                      replicas=replicas)
    optimizer = (tf_spectrain.SpecTrainSGD(0.1, momentum=0.9) if mode == "spectrain"
                 else keras.optimizers.SGD(0.1, momentum=0.9))
    pipe.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 metrics=["accuracy"])
    x, y = data()
    copies = []

    class Snapshot(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            copies.append([[[v.numpy() for v in stage.trainable_variables]
                            for stage in stages] for stages in pipe.replica_stages])

    history = pipe.fit(x, y, batch_size=12, epochs=epochs, shuffle=False, verbose=0,
                       callbacks=[Snapshot()])
    return pipe, model, history.history, copies


_SHARED = {}


def shared_two_replicas(mode, target, micro):
    """`trained(mode, target, micro, 2, DEVICES)`, once: the test below checks its steps, and
    the placement and checkpoint tests read it (a pipeline costs its tracing)."""
    key = (mode, target, micro)
    if key not in _SHARED:
        _SHARED[key] = trained(mode, target, micro, 2, DEVICES)
    return _SHARED[key]


@pytest.mark.parametrize("mode, target, micro", CASES)
def test_two_replicas_take_the_steps_of_one_pipeline_with_the_same_batch(mode, target, micro):
    _, single, single_logs, _ = trained(mode, target, micro, 1, DEVICES[:2])
    pipe, model, logs, copies = shared_two_replicas(mode, target, micro)
    moved = max(float(np.max(np.abs(a - b))) for a, b in
                zip(model.get_weights(), mlp().get_weights()))
    assert moved > 1e-2  # training did something
    for a, b in zip(model.get_weights(), single.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logs["loss"], single_logs["loss"], rtol=1e-5)
    np.testing.assert_allclose(logs["accuracy"], single_logs["accuracy"])
    # The replicas apply the same summed gradient: identical weights after every epoch,
    # and identical optimizer state at the end.
    assert len(copies) == 2
    for epoch in copies:
        for stage0, stage1 in zip(epoch[0], epoch[1]):
            for a, b in zip(stage0, stage1):
                np.testing.assert_array_equal(a, b)
    for r0, r1 in zip(pipe.replica_runners[0], pipe.replica_runners[1]):
        assert r0.device != r1.device
        for a, b in zip(r0.optimizer.variables, r1.optimizer.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_replicas_place_stage_k_of_replica_r_on_device_r_times_n_plus_k():
    pipe, _, _, _ = shared_two_replicas("stash", "paper", 1)
    assert pipe.replica_devices == [DEVICES[:2], DEVICES[2:]]
    assert pipe.devices == DEVICES[:2] and pipe.all_devices == DEVICES
    for r, stages in enumerate(pipe.replica_stages):
        for k, stage in enumerate(stages):
            assert stage.variables[0].value.device.endswith(f"CPU:{2 * r + k}")


def test_batchnorm_statistics_are_per_replica_and_averaged_at_epoch_end():
    pipe, model, _, _ = trained("sync", "paper", 1, 2, DEVICES, epochs=1, batchnorm=True)
    bns = [pipe.replica_stages[r][1].get_layer("bn") for r in (0, 1)]
    for a, b in zip(bns[0].non_trainable_weights, bns[1].non_trainable_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(model.get_layer("bn").moving_mean.numpy(),
                               bns[0].moving_mean.numpy())
    # Each replica normalised its own half: the mean of the two halves' statistics differs
    # from one pipeline's statistics of the whole batch (and is what we average to).
    _, single, _, _ = trained("sync", "paper", 1, 1, DEVICES[:2], epochs=1, batchnorm=True)
    assert not np.allclose(model.get_layer("bn").moving_variance.numpy(),
                           single.get_layer("bn").moving_variance.numpy(), rtol=1e-6)


def test_a_checkpoint_restores_every_replica(tmp_path):
    pipe, model, _, _ = shared_two_replicas("spectrain", "paper", 1)  # trained 2 epochs
    path = tf_spectrain.checkpoint.save(pipe, tmp_path, epoch=2)
    saved = [w.copy() for w in model.get_weights()]
    fresh, fresh_model, _, _ = trained("spectrain", "paper", 1, 2, DEVICES, epochs=1, seed=5)
    tf_spectrain.checkpoint.restore_checkpoint(fresh, path)
    for a, b in zip(fresh_model.get_weights(), saved):
        np.testing.assert_array_equal(a, b)
    for stages in fresh.replica_stages:
        for stage, original in zip(stages, pipe.stages):
            for a, b in zip(stage.variables, original.variables):
                np.testing.assert_array_equal(a.numpy(), b.numpy())
    for runners in fresh.replica_runners:
        for runner, original in zip(runners, pipe.runners):
            for a, b in zip(runner.optimizer.variables, original.optimizer.variables):
                np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_reducer_sums_every_dtype_over_the_replicas():
    import threading

    keys = replicas_lib.new_group_keys(1)
    assert keys[0] >= 0x5EC70000 and replicas_lib.new_group_keys(1)[0] != keys[0]
    reducers = [replicas_lib.GradientReducer(2, keys[0], d) for d in DEVICES[:2]]
    values = [[np.full((2, 3), r + 1.0, np.float32), np.arange(4.0) * (r + 1),
               np.float32(r)] for r in range(2)]
    out = [None, None]

    def run(r):
        with tf.device(DEVICES[r]):
            grads = [tf.constant(v) for v in values[r]]
        out[r] = [g.numpy() for g in reducers[r](grads)]

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for r in range(2):
        for got, a, b in zip(out[r], values[0], values[1]):
            np.testing.assert_allclose(got, np.asarray(a) + np.asarray(b))
            assert got.dtype == np.asarray(a).dtype


@pytest.mark.parametrize("kwargs, message", [
    (dict(replicas=0), "`replicas`"),
    (dict(replicas=2, devices=DEVICES[:3]), "4 devices"),
    (dict(replicas=3, devices=DEVICES), "3 x 2 = 6 devices"),
])
def test_bad_replicas_are_refused_before_any_work(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tf_spectrain.PipelineModel(mlp(), cuts=["d0"], **kwargs)


def test_stages_of_a_replica_are_named_by_replica_in_messages():
    assert health.name_stages([2, 3], 2) == "stages 0 and 1 of replica 1"
    assert health.name_stages([1, 3], 2) == "stage 1 of replica 0 and stage 1 of replica 1"
    assert health.name_stages([1], 2) == "stage 1"
    assert health.name_stages([0, 1, 2]) == "stages 0, 1 and 2"


def run_knobs(replicas, devices, stop_at=None):
    """Sync with global_clipnorm, a learning rate set at every batch begin, maybe a stop."""
    model = mlp()
    pipe = tf_spectrain.PipelineModel(model, cuts=["d0"], devices=devices, mode="sync",
                                      replicas=replicas)
    pipe.compile(keras.optimizers.SGD(0.5, momentum=0.9, global_clipnorm=0.3),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Knobs(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            model.optimizer.learning_rate = 0.5 / (1 + batch)

        def on_train_batch_end(self, batch, logs=None):
            if (self.epoch, batch) == stop_at:
                model.stop_training = True

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    x, y = data()
    pipe.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0, callbacks=[Knobs()])
    return pipe, model


def test_clipping_and_batch_learning_rates_match_one_pipeline():
    _, model = run_knobs(2, DEVICES)
    _, single = run_knobs(1, DEVICES[:2])
    for a, b in zip(model.get_weights(), single.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_stop_ends_every_replica_after_the_same_mini_batch():
    pipe, _ = run_knobs(2, DEVICES, stop_at=(1, 1))
    epoch, done, per_epoch = pipe.epoch_progress
    assert epoch == 1 and 2 <= done < per_epoch
    for r0, r1 in zip(*pipe.replica_runners):
        assert int(r0.optimizer.iterations) == int(r1.optimizer.iterations) == 4 + done
        for a, b in zip(r0.model.variables, r1.model.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_batch_too_small_to_split_fails_every_replica_without_a_hang():
    pipe = tf_spectrain.PipelineModel(mlp(), cuts=["d0"], devices=DEVICES, mode="stash",
                                      replicas=2)
    pipe.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    x, y = data(13)
    with pytest.raises(ValueError, match=r"1 examples cannot be split into 2 parts \(2 "
                                         r"replicas x 1 micro-batches\)"):
        pipe.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    x, y = data(24)
    pipe.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)  # still usable


def test_train_py_runs_replicas_as_the_readme_says(tmp_path, monkeypatch):
    from tf_spectrain.app import cli, preparation, training

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    line = next(line for line in readme.splitlines()
                if line.startswith("python train.py") and "--replicas 2" in line)
    monkeypatch.chdir(tmp_path)
    args = dataclasses.replace(cli.parse_args(
        line.split()[2:] + ["--logdir", str(tmp_path), "--export", "none"]
    ), verbose=0)
    run = preparation.prepare(args)
    assert run.trainer.replicas == 2
    assert run.trainer.replica_devices == [DEVICES[:2], DEVICES[2:]]
    assert ("2 replicas of a spectrain pipeline of 2 stages on /CPU:0, /CPU:1; /CPU:2, /CPU:3"
            in preparation.describe(run))
    result = training.train(run)
    assert len(result["history"]["loss"]) == 1 and 0 <= result["test_accuracy"] <= 1


@pytest.mark.parametrize("settings, message", [
    (dict(replicas=0), "--replicas"),
    (dict(replicas=3), "--replicas must divide the devices (4)"),
    (dict(replicas=2, mode="dp"), "--replicas copies a pipeline"),
    (dict(replicas=2, batch_size=15), "a multiple of 2. Received: --batch-size 15"),
    (dict(replicas=2, micro_batches=2, mode="sync", batch_size=6),
     "--replicas 2 x --micro-batches 2: a multiple of 4"),
    (dict(replicas=2, cuts=("flatten", "dense1")), "give 1 cut layers (2 stages in each"),
])
def test_bad_replicas_flags_are_refused_before_any_work(settings, message):
    from tf_spectrain.app.config import RunConfig

    with pytest.raises(ValueError) as caught:
        RunConfig(model="mlp", gpus=4, **settings)
    assert message in str(caught.value)


def test_replicas_and_a_mirrored_strategy_in_one_process_do_not_clash():
    strategy = tf.distribute.MirroredStrategy(DEVICES[:2])

    def mirrored_sum():
        @tf.function
        def step():
            return strategy.reduce(
                "SUM", strategy.run(lambda: tf.cast(tf.distribute.get_replica_context()
                                                    .replica_id_in_sync_group, tf.float32) + 1.0),
                axis=None)
        return float(step())

    assert mirrored_sum() == pytest.approx(3.0)
    _, model, _, _ = trained("sync", "paper", 1, 2, DEVICES, epochs=1)
    _, single, _, _ = trained("sync", "paper", 1, 1, DEVICES[:2], epochs=1)
    assert mirrored_sum() == pytest.approx(3.0)
    for a, b in zip(model.get_weights(), single.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
