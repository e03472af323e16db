"""`runtime.graphs.FlatCalls`: a window graph called by its concrete function on flat tensors
gives what the `tf.function` call gives, traces once per structure, dtype and shape, and
takes the plain call where a leaf is not a tensor."""

import numpy as np
import tensorflow as tf

from tf_spectrain.runtime.graphs import FlatCalls


def test_flat_calls_equal_the_plain_call_and_trace_once_per_signature():
    traces = []

    @tf.function
    def window(xs, carried, rates):
        traces.append(1)
        total = xs["1"] * 10.0 + xs["0"] + tf.add_n(carried["a"])
        if rates is not None:
            total = total * rates["0"]
        return {"out": total, "carried": {"a": [total, xs["0"]]}}

    calls = FlatCalls()
    rng = np.random.default_rng(0)

    def args(n, rates=True):
        xs = {"0": tf.constant(rng.normal(size=(n, 2)), tf.float32),
              "1": tf.constant(rng.normal(size=(n, 2)), tf.float32)}
        carried = {"a": [tf.constant(rng.normal(size=(n, 2)), tf.float32) for _ in range(2)]}
        return xs, carried, ({"0": tf.constant(0.5)} if rates else None)

    for n, rates in [(3, True), (3, True), (4, True), (3, False), (3, True)]:
        given = args(n, rates)
        prepared, inputs = calls.prepare(window, given)
        got = calls.call(prepared, inputs)
        want = window(*given)
        np.testing.assert_array_equal(got["out"].numpy(), want["out"].numpy())
        for a, b in zip(tf.nest.flatten(got["carried"]), tf.nest.flatten(want["carried"])):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # (3, rates), (4, rates), (3, no rates): three traces, none again for the repeats.
    assert len(traces) == 3


def test_a_leaf_that_is_not_a_tensor_takes_the_plain_call():
    @tf.function
    def scaled(x, factor):
        return x * factor

    calls = FlatCalls()
    prepared, inputs = calls.prepare(scaled, (tf.constant([1.0, 2.0]), 3.0))
    assert prepared is scaled
    np.testing.assert_array_equal(calls.call(prepared, inputs).numpy(), [3.0, 6.0])
