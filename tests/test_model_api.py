"""`PipelineModel` as the Keras model it replaces
(`tf_spectrain.front.model_api`, `optimizer_view`).

Every check compares with plain Keras on the same model, weights and data: the wrapped
model's own methods, `keras.Model.train_on_batch` and friends (a sync pipeline is
sequential SGD, so it must equal them), and files saved from the pipeline reloaded and
trained on by Keras alone. Tiny models (three Dense layers, 3 stages) on /CPU:0..2.
"""

import warnings

import keras
import numpy as np
import pytest

import tf_spectrain
from tf_spectrain.pipeline_model import PipelineModel

BATCH, EPOCHS = 8, 2
RTOL, ATOL = 1e-5, 1e-6


def make_mlp(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,), name="features")
    h = keras.layers.Dense(8, activation="tanh", name="a")(inputs)
    h = keras.layers.Dense(8, activation="tanh", name="b")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="c")(h), name="mlp")


def make_data(n=32, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def twin(model):
    """An independent Keras model with the same architecture and current weights."""
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    return clone


def compile_args(optimizer="adam"):
    make = {"adam": lambda: keras.optimizers.Adam(0.01),
            "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9)}[optimizer]
    return dict(optimizer=make(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])


def sync_pipe(model, optimizer="adam", **kwargs):
    pipe = PipelineModel(model, cuts=["a", "b"], mode="sync", **kwargs)
    pipe.compile(**compile_args(optimizer))
    return pipe


def assert_weights_close(got, expected, rtol=RTOL, atol=ATOL):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# --- what the model is ------------------------------------------------------------------------


def test_model_attributes_and_methods_are_the_wrapped_models(capsys):
    model = make_mlp()
    pipe = sync_pipe(model)
    assert pipe.name == "mlp" and pipe.layers == model.layers
    assert pipe.get_layer("b") is model.get_layer("b") and pipe.get_layer(index=1).name == "a"
    assert pipe.inputs == model.inputs and pipe.outputs == model.outputs
    assert pipe.count_params() == model.count_params() == 5 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3
    assert pipe.to_json() == model.to_json()
    assert [v.path for v in pipe.weights] == [v.path for v in model.weights]
    assert len(pipe.trainable_weights) == len(pipe.trainable_variables) == 6
    assert pipe.non_trainable_weights == []
    # Any other public keras.Model attribute is the wrapped model's (`__getattr__`).
    assert pipe.compiled is True and pipe.get_config() == model.get_config()
    assert "get_layer" in dir(pipe) and "input_shape" not in vars(pipe)
    x, _ = make_data(4)
    np.testing.assert_allclose(pipe(x), model(x))  # calling it runs the Keras model
    pipe.summary()
    out = capsys.readouterr().out
    assert "Total params" in out and "Pipeline: 3 stages (sync)" in out and "cut after a, b" in out
    lines = []
    pipe.summary(print_fn=lines.append)
    assert any("Pipeline: 3 stages" in line for line in lines)


def test_attributes_that_would_bypass_the_pipeline_are_refused_with_what_to_do():
    pipe = sync_pipe(make_mlp())
    with pytest.raises(AttributeError, match="after the pipeline was cut"):
        pipe.quantize("int8")
    with pytest.raises(AttributeError, match="train_on_batch"):
        pipe.train_step((None, None))
    with pytest.raises(AttributeError, match="no attribute '_private'"):
        pipe._private  # noqa: B018 - never forwarded
    with pytest.raises(AttributeError, match="nor has its Keras model 'mlp'"):
        pipe.no_such_thing  # noqa: B018
    assert not hasattr(pipe, "add")


def test_metrics_names_stop_training_and_history():
    x, y = make_data()
    pipe = sync_pipe(make_mlp())
    assert pipe.metrics_names == ["loss", "accuracy"]
    assert list(pipe.evaluate(x, y, verbose=0, return_dict=True)) == ["loss", "accuracy"]
    history = pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert pipe.history is history is pipe.model.history
    pipe.stop_training = True
    assert pipe.model.stop_training is True


# --- weights ------------------------------------------------------------------------------------


def test_set_weights_reach_the_stages_and_get_weights_reads_the_trained_ones():
    x, y = make_data()
    model = make_mlp()
    pipe = sync_pipe(model)
    pipe.predict(x, verbose=0)  # the stages hold the initial weights now
    other = make_mlp(seed=7).get_weights()
    pipe.set_weights(other)
    reference = make_mlp(seed=7)
    np.testing.assert_allclose(pipe.predict(x, verbose=0), reference.predict(x, verbose=0),
                               rtol=RTOL, atol=ATOL)
    reference.compile(**compile_args())
    reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    assert_weights_close(pipe.get_weights(), reference.get_weights())


# --- one batch ----------------------------------------------------------------------------------


def test_on_batch_methods_equal_keras():
    x, y = make_data()
    model = make_mlp()
    reference = twin(model)
    reference.compile(**compile_args())
    pipe = sync_pipe(model)
    pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    trained = pipe.epochs_trained
    for start in (0, 8, 16):
        xb, yb = x[start:start + BATCH], y[start:start + BATCH]
        got = pipe.train_on_batch(xb, yb)
        expected = reference.train_on_batch(xb, yb)
        np.testing.assert_allclose(got, expected, rtol=RTOL)
    assert pipe.epochs_trained == trained  # a batch is not an epoch (shuffle order)
    assert pipe.history.epoch == [0]  # the fit's History stays the model's
    assert_weights_close(model.get_weights(), reference.get_weights())
    got = pipe.train_on_batch(x[:BATCH], y[:BATCH], return_dict=True)
    expected = reference.train_on_batch(x[:BATCH], y[:BATCH], return_dict=True)
    assert got.keys() == expected.keys()
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=RTOL)
    np.testing.assert_allclose(pipe.test_on_batch(x[:BATCH], y[:BATCH]),
                               reference.test_on_batch(x[:BATCH], y[:BATCH]), rtol=RTOL)
    np.testing.assert_allclose(pipe.predict_on_batch(x[:5]), reference.predict_on_batch(x[:5]),
                               rtol=RTOL, atol=ATOL)
    with pytest.raises(TypeError, match="one batch of arrays"):
        pipe.predict_on_batch(None)


def test_on_batch_methods_of_a_model_with_two_outputs_equal_keras():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,), name="x")
    h = keras.layers.Dense(8, activation="tanh", name="a")(inputs)
    h = keras.layers.Dense(8, activation="tanh", name="b")(h)
    model = keras.Model(inputs, [keras.layers.Dense(3, name="o1")(h),
                                 keras.layers.Dense(1, name="o2")(h)])
    reference = twin(model)
    x, y1 = make_data(16)
    y2 = x[:, :1] * 2

    def compiled():
        return dict(optimizer=keras.optimizers.SGD(0.1),
                    loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
                    metrics=[["accuracy"], ["mae"]])

    pipe = PipelineModel(model, cuts=["a", "b"], mode="sync")
    pipe.compile(**compiled())
    reference.compile(**compiled())
    for part in (slice(0, 8), slice(8, 16)):
        np.testing.assert_allclose(pipe.train_on_batch(x[part], [y1[part], y2[part]]),
                                   reference.train_on_batch(x[part], [y1[part], y2[part]]),
                                   rtol=RTOL)
    got = pipe.test_on_batch(x, [y1, y2], return_dict=True)
    expected = reference.test_on_batch(x, [y1, y2], return_dict=True)
    assert got == pytest.approx(expected, rel=RTOL)
    assert pipe.metrics_names == ["loss", "o1_loss", "o2_loss", "o1_accuracy", "o2_mae"]
    np.testing.assert_allclose(pipe.test_on_batch(x, [y1, y2]),
                               [got[name] for name in pipe.metrics_names], rtol=RTOL)


# --- the wrapped model compiled, its optimizer the pipeline's state ---------------------------


def _loaded(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.models.load_model(path)
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]
    return loaded


@pytest.mark.parametrize("mode", ["sync", "spectrain"])
def test_saved_model_reloads_compiled_with_the_pipelines_optimizer_state(tmp_path, mode):
    x, y = make_data()
    model = make_mlp()
    pipe = PipelineModel(model, cuts=["a", "b"], mode=mode)
    args = compile_args("sgd")
    if mode == "spectrain":
        args["optimizer"] = tf_spectrain.SpecTrainSGD(0.1, momentum=0.9)
    pipe.compile(**args)
    assert pipe.optimizer is model.optimizer and model.compiled
    pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    pipe.save(tmp_path / "m.keras")
    loaded = _loaded(tmp_path / "m.keras")
    # A plain Keras SGD, even for SpecTrainSGD (its training is SGD's): no tf_spectrain needed.
    assert type(loaded.optimizer) is keras.optimizers.SGD
    assert int(loaded.optimizer.iterations) == EPOCHS * 4
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.1)
    # Its momentum slots are the stages' (stage k holds the slots of its layer's weights).
    slots = {v.name: v.numpy() for v in loaded.optimizer.variables if "momentum" in v.name}
    stage_slots = [v.numpy() for o in pipe.stage_optimizers for v in o.variables
                   if "momentum" in v.name]
    assert len(slots) == len(stage_slots) == 6
    assert_weights_close(list(slots.values()), stage_slots, rtol=0, atol=0)
    assert np.abs(stage_slots[0]).max() > 0
    got = loaded.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    expected = pipe.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert got == pytest.approx(expected, rel=RTOL)


def test_a_saved_sync_run_resumes_in_keras_as_an_uninterrupted_keras_run(tmp_path):
    # Adam: the file must hold every stage's moments and the update count (bias correction).
    x, y = make_data()
    model = make_mlp()
    reference = twin(model)
    reference.compile(**compile_args())
    reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS + 1, shuffle=False, verbose=0)
    pipe = sync_pipe(model)
    pipe.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    pipe.save(tmp_path / "m.keras")
    loaded = _loaded(tmp_path / "m.keras")
    loaded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(loaded.get_weights(), reference.get_weights())
    # A fresh optimizer would have given something else.
    restarted = _loaded(tmp_path / "m.keras")
    restarted.compile(**compile_args())
    restarted.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert max(np.abs(a - b).max() for a, b in
               zip(restarted.get_weights(), reference.get_weights())) > 1e-3


def test_load_weights_gives_a_new_pipeline_the_optimizer_state_of_every_stage(tmp_path):
    x, y = make_data()
    first = sync_pipe(make_mlp())
    first.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    first.save_weights(tmp_path / "w.weights.h5")
    second = sync_pipe(make_mlp(seed=3))
    second.load_weights(tmp_path / "w.weights.h5")
    assert [int(o.iterations) for o in second.stage_optimizers] == [EPOCHS * 4] * 3
    first.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    second.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(second.get_weights(), first.get_weights(), rtol=0, atol=0)


def test_a_learning_rate_set_on_the_models_optimizer_reaches_every_stage():
    # As `model.optimizer.learning_rate = ...` between two Keras fits (fine-tuning scripts).
    x, y = make_data()
    model = make_mlp()
    reference = twin(model)
    reference.compile(**compile_args("sgd"))
    pipe = sync_pipe(model, "sgd")
    for rate in (0.1, 0.02):
        pipe.optimizer.learning_rate = rate
        reference.optimizer.learning_rate = rate
        pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        assert [float(o.learning_rate) for o in pipe.stage_optimizers] == pytest.approx([rate] * 3)
    assert_weights_close(model.get_weights(), reference.get_weights())


def test_recompiling_and_recutting_point_the_model_optimizer_at_the_new_stages():
    x, y = make_data()
    model = make_mlp()
    pipe = PipelineModel(model, mode="sync", num_stages=2, profile_batch_size=BATCH)
    pipe.compile(**compile_args())
    pipe.compile(**compile_args())
    pipe.use_cuts(["b"] if pipe.cuts != ["b"] else ["a"])
    pipe.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    shared = {id(v) for o in pipe.stage_optimizers for v in o.variables}
    assert all(id(v) in shared for v in model.optimizer.variables)
