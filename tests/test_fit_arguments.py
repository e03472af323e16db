"""Keras' data arguments on the pipeline: each against plain Keras on the same model and data.

`sample_weight`, `class_weight`, `weighted_metrics`, `validation_split`, `validation_steps`,
`validation_batch_size`, `validation_freq`, weighted `validation_data` and datasets,
`evaluate(sample_weight, steps, callbacks)`, `predict(steps, callbacks)`, and data Keras'
adapters take (a `PyDataset`, a generator). Sync mode equals Keras' `fit` (shuffle=False);
the asynchronous modes are checked against the same pipeline trained on labels that carry
the weights into a hand-weighted loss, an independent route to the same weighted loss.
"""

import warnings

import keras
import numpy as np
import pytest

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.runtime import executor, window_epoch

DEVICES = ["/CPU:0", "/CPU:1"]
N, BATCH, FEATURES, CLASSES = 48, 8, 6, 3
RTOL, ATOL = 1e-5, 2e-6


def mlp(outputs=CLASSES, activation="softmax"):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(8, activation="tanh", name="d0")(inputs)
    h = keras.layers.Dense(8, activation="tanh", name="d1")(h)
    return keras.Model(inputs, keras.layers.Dense(outputs, activation=activation, name="out")(h))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, N).astype("int32")
    w = rng.uniform(0.1, 3.0, N).astype("float32")
    return x, y, w


COMPILE = dict(loss="sparse_categorical_crossentropy", metrics=["accuracy"],
               weighted_metrics=["accuracy", "sparse_categorical_crossentropy"])


def both(mode="sync", compile_args=COMPILE, steps_per_execution="auto", **pipe_args):
    """A Keras model and a pipeline of an identical one, compiled alike."""
    keras_model = mlp()
    keras_model.compile(optimizer=keras.optimizers.SGD(0.1), **compile_args)
    pipe_args.setdefault("devices", DEVICES)
    pipe = PipelineModel(mlp(), cuts=["d0"], mode=mode, **pipe_args)
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), steps_per_execution=steps_per_execution,
                 **compile_args)
    return keras_model, pipe


def assert_same_history(got, expected):
    assert sorted(got.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(got.history[key], values, rtol=RTOL, atol=ATOL, err_msg=key)


def assert_same_weights(pipe, keras_model):
    for a, b in zip(pipe.model.get_weights(), keras_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("steps_per_execution", [1, "auto"])
def test_sample_weight_weights_the_loss_and_weighted_metrics_as_keras(data, steps_per_execution):
    x, y, w = data
    keras_model, pipe = both(steps_per_execution=steps_per_execution)
    args = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0, sample_weight=w)
    expected = keras_model.fit(x, y, **args)
    got = pipe.fit(x, y, **args)
    assert "weighted_accuracy" in got.history  # named as Keras names a repeated metric
    assert_same_history(got, expected)
    assert_same_weights(pipe, keras_model)


def test_shuffled_arrays_are_taken_in_keras_order_under_a_global_seed(data):
    x, y, w = data
    keras_model, pipe = both()
    histories = []
    for trainer in (keras_model, pipe):
        keras.utils.set_random_seed(11)  # a script's seed: the order comes from it alone
        histories.append(trainer.fit(x, y, batch_size=BATCH, epochs=3, verbose=0,
                                     validation_split=0.25))
    assert_same_history(histories[1], histories[0])
    assert_same_weights(pipe, keras_model)


def test_class_weight_becomes_sample_weights_as_in_keras(data):
    x, y, _ = data
    keras_model, pipe = both()
    args = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                class_weight={0: 0.5, 1: 2.0, 2: 1.0})
    assert_same_history(pipe.fit(x, y, **args), keras_model.fit(x, y, **args))
    assert_same_weights(pipe, keras_model)


def test_class_weight_weights_only_the_training_part_of_validation_split_as_keras(data):
    x, y, _ = data
    keras_model, pipe = both()
    args = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_split=0.25,
                class_weight={0: 0.2, 1: 3.0, 2: 1.0})
    assert_same_history(pipe.fit(x, y, **args), keras_model.fit(x, y, **args))


@pytest.mark.parametrize("options", [
    dict(micro_batches=2),
    dict(replicas=2, devices=["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]),
])
def test_sample_weights_with_micro_batches_and_replicas_equal_keras(data, options):
    x, y, w = data
    keras_model, pipe = both(**options)
    args = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0, sample_weight=w)
    assert_same_history(pipe.fit(x, y, **args), keras_model.fit(x, y, **args))
    assert_same_weights(pipe, keras_model)


def test_validation_split_steps_batch_size_and_freq_as_keras(data):
    x, y, w = data
    keras_model, pipe = both()
    args = dict(batch_size=BATCH, epochs=4, shuffle=True, verbose=0, validation_split=0.25,
                validation_batch_size=4, validation_steps=2, validation_freq=2,
                sample_weight=w)
    keras_model.fit(x, y, **args)  # warms nothing up: only the History's shape is compared
    got = pipe.fit(x, y, **args)
    # validation after epochs 2 and 4 only, Keras' rule; training on the first 36 examples
    assert len(got.history["val_loss"]) == 2 and len(got.history["loss"]) == 4
    assert pipe.progress.epoch_progress[2] == 36 // BATCH + 1
    # the validation losses are those of the last 12 examples' first 2 batches of 4
    keras_model, pipe = both()
    args.update(shuffle=False, epochs=2)
    assert_same_history(pipe.fit(x, y, **args), keras_model.fit(x, y, **args))


def test_weighted_validation_data_and_weighted_dataset_as_keras(data):
    import tensorflow as tf

    x, y, w = data
    keras_model, pipe = both()
    ds = tf.data.Dataset.from_tensor_slices((x[:32], y[:32], w[:32])).batch(BATCH)
    args = dict(epochs=2, verbose=0, validation_data=(x[32:], y[32:], w[32:]))
    assert_same_history(pipe.fit(ds, **args), keras_model.fit(ds, **args))
    assert_same_weights(pipe, keras_model)


def test_a_dataset_of_unknown_length_trains_as_keras_after_one_counting_pass(data):
    import tensorflow as tf

    x, y, _ = data
    ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: b >= 0).batch(BATCH)
    keras_model, pipe = both()
    with pytest.warns(UserWarning, match="counted 6 batches"):
        got = pipe.fit(ds, epochs=2, verbose=0)
    assert_same_history(got, keras_model.fit(ds, epochs=2, verbose=0))


def test_evaluate_with_sample_weight_steps_and_callbacks_as_keras(data):
    x, y, w = data
    keras_model, pipe = both()
    expected = keras_model.evaluate(x, y, sample_weight=w, batch_size=BATCH, steps=3,
                                    verbose=0, return_dict=True)
    seen = []

    class Hooks(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            seen.append("begin")

        def on_test_batch_end(self, batch, logs=None):
            seen.append(batch)

        def on_test_end(self, logs=None):
            seen.append(("end", round(logs["loss"], 5)))

    got = pipe.evaluate(x, y, sample_weight=w, batch_size=BATCH, steps=3, verbose=0,
                        return_dict=True, callbacks=[Hooks()])
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=RTOL, err_msg=key)
    assert seen == ["begin", 0, 1, 2, ("end", round(expected["loss"], 5))]


def test_predict_with_steps_and_callbacks_as_keras(data):
    x, _, _ = data
    keras_model, pipe = both()
    ends = []

    class Hooks(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            ends.append((batch, len(logs["outputs"])))

    got = pipe.predict(x, batch_size=BATCH, steps=2, callbacks=[Hooks()], verbose=0)
    np.testing.assert_allclose(got, keras_model.predict(x, batch_size=BATCH, steps=2, verbose=0),
                               rtol=RTOL, atol=ATOL)
    assert got.shape == (2 * BATCH, CLASSES) and ends == [(0, BATCH), (1, BATCH)]


class Batches(keras.utils.PyDataset):
    """Batches of arrays, as a user's `PyDataset` serves them."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        part = slice(i * BATCH, (i + 1) * BATCH)
        return self.x[part], self.y[part]


def test_a_py_dataset_and_a_generator_train_as_in_keras(data):
    x, y, _ = data
    keras_model, pipe = both()
    args = dict(epochs=2, verbose=0, shuffle=False)  # True would shuffle the batches' order
    assert_same_history(pipe.fit(Batches(x, y), **args),
                        keras_model.fit(Batches(x, y), **args))

    def batches():
        while True:
            for i in range(N // BATCH):
                yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]

    keras_model, pipe = both()
    args = dict(epochs=2, verbose=0, steps_per_epoch=N // BATCH)
    assert_same_history(pipe.fit(batches(), **args), keras_model.fit(batches(), **args))
    assert_same_weights(pipe, keras_model)


def test_several_outputs_take_sample_weights_and_weighted_metrics_as_keras(data):
    x, y, w = data

    def two_heads():
        keras.utils.set_random_seed(5)
        inputs = keras.Input((FEATURES,))
        h = keras.layers.Dense(8, activation="tanh", name="d0")(inputs)
        a = keras.layers.Dense(CLASSES, activation="softmax", name="a")(h)
        b = keras.layers.Dense(1, name="b")(h)
        return keras.Model(inputs, [a, b])

    compile_args = dict(loss=["sparse_categorical_crossentropy", "mse"],
                        metrics=[["accuracy"], ["mae"]], weighted_metrics=[["accuracy"], None])
    keras_model = two_heads()
    keras_model.compile(optimizer=keras.optimizers.SGD(0.1), **compile_args)
    pipe = PipelineModel(two_heads(), cuts=["d0"], devices=DEVICES, mode="sync")
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), **compile_args)
    labels = [y, x[:, :1]]
    args = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0, sample_weight=w)
    got = pipe.fit(x, labels, **args)
    assert "a_weighted_accuracy" in got.history
    assert_same_history(got, keras_model.fit(x, labels, **args))


def test_a_dict_of_inputs_feeds_the_models_input_dict_by_its_keys_as_in_keras(data):
    # As keras-io's structured-data example: the model's input dict holds a transformed
    # tensor (Keras makes it an input named '...CLONE'), and data come by the dict's keys.
    import tensorflow as tf

    x, y, _ = data

    def by_keys():
        keras.utils.set_random_seed(4)
        a = keras.Input((2,), name="a")
        scaled = keras.layers.Rescaling(0.5)(keras.Input((4,), name="raw_b"))
        inputs = {"b": scaled, "a": a}
        h = keras.layers.Concatenate()([inputs["b"], a])
        h = keras.layers.Dense(8, activation="tanh", name="d0")(h)
        return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(h))

    features = {"b": x[:, :4], "a": x[:, 4:]}
    keras_model = by_keys()
    pipe = PipelineModel(by_keys(), cuts=["d0"], devices=DEVICES, mode="sync")
    for model in (keras_model, pipe):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    args = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_same_history(pipe.fit(features, y, **args), keras_model.fit(features, y, **args))
    ds = tf.data.Dataset.from_tensor_slices((features, y)).batch(BATCH)
    assert_same_history(pipe.fit(ds, epochs=1, verbose=0), keras_model.fit(ds, epochs=1, verbose=0))
    one = {k: v[:1] for k, v in features.items()}
    np.testing.assert_allclose(pipe.predict(one, verbose=0), keras_model.predict(one, verbose=0),
                               rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(pipe.predict(ds, verbose=0), keras_model.predict(ds, verbose=0),
                               rtol=RTOL, atol=ATOL)


def test_a_missing_last_axis_of_one_is_added_as_keras_adds_it(data):
    # keras-io's structured data: `Input(shape=(1,))` fed a column of shape (n,)
    x, y, _ = data

    def one_column():
        keras.utils.set_random_seed(6)
        inputs = keras.Input((1,), name="age")
        h = keras.layers.Dense(8, activation="tanh", name="d0")(inputs)
        return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(h))

    keras_model = one_column()
    pipe = PipelineModel(one_column(), cuts=["d0"], devices=DEVICES, mode="sync")
    for model in (keras_model, pipe):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    args = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    column = x[:, 0]
    assert_same_history(pipe.fit(column, y, **args), keras_model.fit(column, y, **args))
    np.testing.assert_allclose(pipe.predict(column, verbose=0),
                               keras_model.predict(column, verbose=0), rtol=RTOL, atol=ATOL)


def weights_in_labels(y_and_w, probabilities):
    """The weighted sparse cross-entropy, the weights read from the labels' second column."""
    y, w = y_and_w[:, 0], y_and_w[:, 1]
    per_example = keras.losses.sparse_categorical_crossentropy(y, probabilities)
    return keras.ops.sum(per_example * w) / keras.ops.cast(keras.ops.shape(w)[0], "float32")


@pytest.mark.parametrize("mode", ["stash", "spectrain"])
def test_asynchronous_modes_weight_the_loss_as_a_hand_weighted_loss_does(data, mode):
    x, y, w = data
    runs = []
    for weighted in (True, False):
        pipe = PipelineModel(mlp(), cuts=["d0"], devices=DEVICES, mode=mode)
        loss = "sparse_categorical_crossentropy" if weighted else weights_in_labels
        pipe.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
        labels = y if weighted else np.stack([y, w], axis=1).astype("float32")
        history = pipe.fit(x, labels, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                           sample_weight=w if weighted else None)
        runs.append((history.history["loss"], pipe.model.get_weights()))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=RTOL)
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("run_eagerly", [True, False])
def test_run_eagerly_runs_pass_by_pass_with_a_warning_and_trains_as_keras(
        data, monkeypatch, run_eagerly):
    from tf_spectrain.runtime import loop

    runs = []
    monkeypatch.setattr(loop, "EpochRun", lambda *a, **k: runs.append("pass by pass") or
                        executor.EpochRun(*a, **k))
    monkeypatch.setattr(loop, "WindowedEpoch", lambda *a, **k: runs.append("windows") or
                        window_epoch.WindowedEpoch(*a, **k))
    x, y, _ = data
    keras_model = mlp()
    keras_model.compile(optimizer=keras.optimizers.SGD(0.1), run_eagerly=run_eagerly,
                        **COMPILE)
    pipe = PipelineModel(mlp(), cuts=["d0"], devices=DEVICES, mode="sync")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe.compile(optimizer=keras.optimizers.SGD(0.1), run_eagerly=run_eagerly,
                     steps_per_execution=1, **COMPILE)
    said = [str(w.message) for w in caught if "run_eagerly" in str(w.message)]
    assert len(said) == run_eagerly and all("pass by pass" in m for m in said), said
    args = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert_same_history(pipe.fit(x, y, **args), keras_model.fit(x, y, **args))
    assert runs == ["pass by pass" if run_eagerly else "windows"] * 2
    assert pipe.model.run_eagerly is run_eagerly  # the wrapped model compiled as Keras would


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_jit_compile_true_compiles_every_stage_with_xla_and_trains_as_keras(
        data, steps_per_execution):
    x, y, _ = data
    keras_model = mlp()
    keras_model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True, **COMPILE)
    pipe = PipelineModel(mlp(), cuts=["d0"], devices=DEVICES, mode="sync")
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True,
                 steps_per_execution=steps_per_execution, **COMPILE)
    assert all(r.passes.jit_compile for r in pipe.runners)
    args = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_same_history(pipe.fit(x, y, **args), keras_model.fit(x, y, **args))
    # The passes are XLA functions (tf.function has no public reader of the flag).
    assert pipe.runners[0].passes.forward_fn.__wrapped__._jit_compile  # noqa: SLF001


def test_jit_compile_auto_follows_keras_on_this_machine():
    keras_model = mlp()
    keras_model.compile(optimizer=keras.optimizers.SGD(0.1), **COMPILE)  # "auto"
    pipe = PipelineModel(mlp(), cuts=["d0"], devices=DEVICES, mode="sync")
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), **COMPILE)
    assert [r.passes.jit_compile for r in pipe.runners] == [bool(keras_model.jit_compile)] * 2
    pipe.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False, **COMPILE)
    assert not any(r.passes.jit_compile for r in pipe.runners)


def test_a_layer_without_xla_support_turns_xla_off_with_a_warning_naming_it():
    class NoXla(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.supports_jit = False

        def call(self, x):
            return x

    inputs = keras.Input((4,))
    h = keras.layers.Dense(5, name="d0")(inputs)
    out = keras.layers.Dense(3, name="d1")(NoXla(name="no_xla")(h))
    pipe = PipelineModel(keras.Model(inputs, out), cuts=["d0"], devices=DEVICES, mode="sync")
    with pytest.warns(UserWarning, match=r"\['no_xla'\] do not support XLA"):
        pipe.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True, **COMPILE)
    assert not any(r.passes.jit_compile for r in pipe.runners)


@pytest.mark.parametrize("args, error, words", [
    (dict(validation_split=1.5), ValueError, "validation_split=1.5"),
    (dict(validation_split="0.1"), TypeError, "validation_split='0.1'"),
    (dict(class_weight=[1, 2]), TypeError, "class_weight"),
    (dict(class_weight={0: 1.0}, sample_weight=np.ones(N)), ValueError, "sample_weight"),
    (dict(sample_weight=np.ones(N - 1)), ValueError, f"{N} long"),
    (dict(validation_freq=0), ValueError, "validation_freq"),
    (dict(validation_steps=0), ValueError, "validation_steps"),
    (dict(validation_batch_size=1.5), TypeError, "validation_batch_size"),
])
def test_bad_data_arguments_are_refused_before_training_naming_the_value(data, args, error,
                                                                        words):
    x, y, _ = data
    _, pipe = both()
    with pytest.raises(error, match=words.replace("(", r"\(").replace("[", r"\[")):
        pipe.fit(x, y, batch_size=BATCH, verbose=0, **args)
    assert pipe.progress.images_seen == 0


def test_wrapping_a_model_leaves_numpys_global_generator_as_keras_leaves_it():
    # keras.io's functional-API guide draws its data with np.random after building the model
    keras.utils.set_random_seed(5)
    model = mlp()
    state = np.random.get_state()
    PipelineModel(model, cuts=["d0"], devices=DEVICES, mode="sync")
    after = np.random.get_state()
    assert state[2] == after[2] and np.array_equal(state[1], after[1])


def test_wrapping_a_model_leaves_pythons_random_state_so_the_next_model_is_keras(data):
    # keras.io's regression tutorial builds and trains a second model after the first: its
    # initial weights come from Keras' default seeds, drawn from Python's `random`.
    def first():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="a"),
                                 keras.layers.Dense(2, name="b")])

    def second():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).get_weights()

    keras.utils.set_random_seed(5)
    first()
    expected = second()
    keras.utils.set_random_seed(5)
    PipelineModel(first(), cuts=["a"], devices=DEVICES, mode="sync")
    for a, b in zip(second(), expected):
        np.testing.assert_array_equal(a, b)
