"""What a graph function returns stays on the device it was computed on
(`runtime.graphs.outputs_stay_put`), and a window graph hands on what it left untouched
without returning it: across hosts, neither travels to the trainer and back.

`tf.function` returns every output through an Identity op of no device, which TensorFlow
places on the caller's device; with stages on workers on other hosts that moved every
stashed weight and every activation in flight through the trainer at every window
(docs/RESULTS.md section 18). Here, on local devices, the graphs themselves are checked.
"""

import keras
import numpy as np
import tensorflow as tf

import tf_spectrain
from tf_spectrain.runtime.graphs import graph_function


def _returned(concrete):
    """The ops whose outputs a concrete function returns."""
    return [t.op for t in concrete.graph.outputs]


def test_a_graph_function_returns_each_output_from_its_own_device():
    def two_devices(x):
        with tf.device("/CPU:1"):
            a = x * 2.0
        with tf.device("/CPU:2"):
            b = x + 1.0
        v.assign_add(1.0)  # a stateful op: the outputs' Identities get control inputs
        return {"a": a, "b": b}

    v = tf.Variable(0.0)
    for autograph, expected in [(False, {"/device:CPU:1", "/device:CPU:2"}), (True, {""})]:
        function = graph_function(two_devices, autograph=autograph)
        concrete = function.get_concrete_function(tf.ones((3,)))
        ops = _returned(concrete)
        assert all(op.type == "Identity" for op in ops)
        # With autograph (not used for stage or window graphs) tf.function's own placement
        # stays: the Identity of no device, on the caller's.
        assert {op.device for op in ops} == expected, [op.device for op in ops]
        assert all(op.device in ("", op.inputs[0].device) for op in ops)
        got = function(tf.ones((3,)))
        np.testing.assert_array_equal(got["a"].numpy(), [2.0, 2.0, 2.0])
        np.testing.assert_array_equal(got["b"].numpy(), [2.0, 2.0, 2.0])


def _fit(steps_per_execution):
    """A 3-stage stash pipeline fitted one epoch of 6 mini-batches: `(pipe, weights)`."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="d0")(inputs)
    hidden = keras.layers.Dense(8, activation="relu", name="d1")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3, name="d2")(hidden))
    pipe = tf_spectrain.PipelineModel(model, cuts=["d0", "d1"],
                                      devices=["/CPU:1", "/CPU:2", "/CPU:3"], mode="stash")
    pipe.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 steps_per_execution=steps_per_execution)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 6)).astype("float32"), rng.integers(0, 3, 48)
    pipe.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    return pipe, [w.numpy() for w in pipe.model.weights]


def test_window_graphs_return_only_what_they_computed_and_from_where_they_computed_it():
    pipe, weights = _fit(1)
    concretes = list(pipe._windows.calls._concrete.values())  # noqa: SLF001
    assert len(concretes) >= 3  # windows of one: the fill, the steady state, the drain
    carried_in = passed_through = 0
    for concrete in concretes:
        graph = concrete.graph
        given = {t.name for t in graph.inputs if "carried" in t.name}  # not xs, ys
        for op in _returned(concrete):
            source = op.inputs[0]
            assert op.type == "Identity"
            # Nothing computed on a stage comes back by way of another device.
            assert op.device == source.device, (op.name, op.device, source.device)
            passed_through += source.name in given
        carried_in += sum(1 for t in graph.inputs if "carried" in t.name)
    assert carried_in > 0  # the steady state's windows take the fill's values in flight
    assert passed_through == 0  # a value held for later is handed on by the caller
    # The values handed on are the right ones: the same training in one window per epoch.
    _, whole = _fit(6)
    for a, b in zip(weights, whole):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
