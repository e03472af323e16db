"""`benchmarks.sync_gradient`: the one-step check of sync pipelines against Keras, tiny."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks import sync_gradient


def _branches():
    """Two stems, a residual add and a concat: several tensors cross most cuts."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 2), name="image")
    a = keras.layers.Conv2D(3, 3, padding="same", name="a")(inputs)
    b = keras.layers.Conv2D(3, 1, name="b")(inputs)
    b = keras.layers.BatchNormalization(name="bn")(b)
    s = keras.layers.Add(name="add")([a, b])
    c = keras.layers.Conv2D(3, 3, padding="same", name="c")(s)
    h = keras.layers.Concatenate(name="cat")([s, c, a])
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    outputs = keras.layers.Dense(4, activation="softmax", name="out")(h)
    return keras.Model(inputs, outputs)


# Layers (Keras' order): 0 image, 1 b, 2 a, 3 bn, 4 add (s), 5 c, 6 cat, 7 gap, 8 out.
# One cut of each kind (the others, 2, 3 and 6, cross tensors of the same kinds as 4 and 7):
CUT_KINDS = {
    1: ["b", "image"],  # a model input crosses (a reads the image in stage 1)
    4: ["add", "a"],  # the residual sum (read twice in stage 1, by c and cat) and a skip
    5: ["c", "add", "a"],  # three tensors, the most of any cut
    7: ["gap"],  # one tensor, stage 1 is the head alone
}


def test_a_cut_of_each_kind_of_a_branchy_model_equals_keras_after_one_step():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6, 6, 2)).astype("float32")
    y = np.arange(4)
    assert [layer.name for layer in _branches().layers] == [
        "image", "b", "a", "bn", "add", "c", "cat", "gap", "out"]
    positions = sorted(CUT_KINDS)
    rows = sync_gradient.sweep(_branches, x, y, positions, ["/CPU:0", "/CPU:1"])
    assert [r["position"] for r in rows] == positions
    assert [r["crossing"] for r in rows] == [len(CUT_KINDS[p]) for p in positions]
    for row in rows:
        assert row["relative_error"] < 1e-4, row
        assert row["variables_off"] == 0, row
        assert row["relu_flips"] == 0 and row["keras_eager"] < 1e-5, row


def test_a_planned_pipeline_of_a_branchy_model_equals_keras_after_one_step():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6, 6, 2)).astype("float32")
    row = sync_gradient.auto_row(_branches, x, np.arange(4), 3, ["/CPU:0", "/CPU:1", "/CPU:2"])
    names = [layer.name for layer in _branches().layers]
    assert len(row["cuts"]) == 2 and all(c in names for c in row["cuts"])
    assert len(row["crossing"]) == 2 and min(row["crossing"]) >= 1
    assert row["relative_error"] < 1e-4 and row["variables_off"] == 0, row
    assert row["planning_seconds"] > 0


def test_dropout_is_switched_off_for_the_comparison():
    inputs = keras.Input((4,))
    h = keras.layers.Dropout(0.5, name="drop")(keras.layers.Dense(3)(inputs))
    model = sync_gradient._without_dropout(keras.Model(inputs, h))
    x = np.ones((8, 4), "float32")
    np.testing.assert_array_equal(model(x, training=True), model(x, training=False))


def test_relative_error_sees_a_wrong_gradient():
    w0 = [np.zeros(3), np.zeros(2)]
    keras_w = [np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0])]
    assert sync_gradient.relative_error(keras_w, keras_w, w0) == (0.0, 0)
    swapped = [np.array([0.0, 1.0, 0.0]), np.array([0.0, 1.0])]  # one variable wrong
    error, off = sync_gradient.relative_error(swapped, keras_w, w0)
    assert error == pytest.approx(1.0) and off == 1


@pytest.mark.parametrize(
    "items, count, expected",
    [(range(10), 4, [0, 3, 6, 9]), (range(3), 5, [0, 1, 2]), (range(5), 1, [0]),
     (range(9), 3, [0, 4, 8])],
)
def test_evenly_spaced(items, count, expected):
    assert sync_gradient.evenly_spaced(items, count) == expected


def test_cut_sensitivity_is_float_noise_for_a_smooth_model():
    def smooth():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5,))
        h = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))

    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    y = np.arange(4) % 3
    assert 0 <= sync_gradient.cut_sensitivity(smooth, x, y, position=1) < 1e-3
    assert sync_gradient.cut_sensitivity(smooth, x, y, position=1, noise=0.3) > 1e-3


def test_cut_sensitivity_is_large_where_max_pooling_meets_ties():
    def pooled():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4, 4, 2))
        mix = keras.layers.Conv2D(1, 1, use_bias=False, kernel_initializer="ones", name="mix")
        h = keras.layers.MaxPooling2D(2, name="pool")(mix(inputs))
        h = keras.layers.Flatten()(h)
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))

    # Channels (1, 0) and (0, 1) alternate: every pooling window holds four equal values
    # that came from different inputs, so which one takes the gradient moves mix's.
    x = np.zeros((2, 4, 4, 2), "float32")
    x[:, ::2, ::2, 0] = x[:, 1::2, 1::2, 0] = 1.0
    x[:, 1::2, ::2, 1] = x[:, ::2, 1::2, 1] = 1.0
    sensitivity = sync_gradient.cut_sensitivity(pooled, x, np.array([0, 1]), position=1)
    assert sensitivity > 0.01


def _two_relus(signs):
    """Dense, ReLU, Dense, ReLU, Dense: each ReLU's input is the bias `sign * 1e-3` before it.

    `signs` yields one pair of signs per build, so two builds can put the ReLU inputs on
    opposite sides of 0, as two graphs' rounding can for an input within float noise of 0.
    """

    def build():
        first, second = next(signs)
        keras.utils.set_random_seed(0)
        inputs = keras.Input((3,))
        h = keras.layers.Dense(4, kernel_initializer="zeros",
                               bias_initializer=keras.initializers.Constant(first * 1e-3))(inputs)
        h = keras.layers.ReLU(name="r0")(h)
        h = keras.layers.Dense(4, kernel_initializer="zeros",
                               bias_initializer=keras.initializers.Constant(second * 1e-3))(h)
        h = keras.layers.Activation("relu", name="r1")(h)
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))

    return build


@pytest.mark.parametrize(
    "keras_signs, pipe_signs, flips",
    [((1, 1), (1, 1), 0), ((1, -1), (1, -1), 0), ((1, 1), (-1, 1), 4 * 2),
     ((1, 1), (1, -1), 4 * 2), ((1, -1), (-1, 1), 2 * 4 * 2)],
)
def test_relu_flips_counts_the_relu_inputs_of_the_other_sign_in_either_stage(
    keras_signs, pipe_signs, flips
):
    # relu_flips builds Keras' model first and the pipeline's second; the cut after r0
    # leaves r0 in stage 0 and r1 in stage 1, with 4 units each, on a batch of 2.
    build = _two_relus(iter([keras_signs, pipe_signs]))
    x = np.random.default_rng(0).normal(size=(2, 3)).astype("float32")
    got = sync_gradient.relu_flips(build, x, np.array([0, 1]), 2, ["/CPU:0", "/CPU:1"])
    assert got == flips


def test_keras_eager_error_is_float_noise_for_a_smooth_model_and_sees_an_eager_only_change():
    def model(eager_factor):
        def build():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((5,))
            h = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
            # Scales by eager_factor only when run eagerly: Keras' fit and its eager run
            # then take different steps, which keras_eager_error must show.
            h = keras.layers.Lambda(
                lambda t: t * (eager_factor if tf.executing_eagerly() else 1.0)
            )(h)
            return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))

        return build

    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    y = np.arange(4) % 3
    assert sync_gradient.keras_eager_error(model(1.0), x, y) < 1e-5
    assert sync_gradient.keras_eager_error(model(2.0), x, y) > 0.1


def test_the_tolerance_follows_the_dtype():
    assert sync_gradient.parse_args([]).tolerance == 1e-4
    assert sync_gradient.parse_args(["--dtype", "float64"]).tolerance == 1e-9
    assert sync_gradient.parse_args(["--dtype", "float64", "--tolerance", "1e-6"]).tolerance == 1e-6
    with pytest.raises(SystemExit):
        sync_gradient.parse_args(["--dtype", "float16"])


def test_several_models_run_one_process_each(monkeypatch, capsys):
    calls = []

    class Done:
        def __init__(self, code):
            self.returncode = code

    def fake_run(cmd, env, check):
        calls.append(cmd)
        return Done(1 if "ResNet50" in cmd[-2] else 0)

    monkeypatch.setattr(sync_gradient.subprocess, "run", fake_run)
    status = sync_gradient.main(["--models", "ResNet50,Xception", "--dtype", "float64"])
    assert status == 1  # the worst child's status
    assert [c[c.index("--models", 5) + 1] for c in calls] == ["ResNet50", "Xception"]
    assert all(c[-1] == "--no-header" and "float64" in c for c in calls)
    assert capsys.readouterr().out.count("| model |") == 1
