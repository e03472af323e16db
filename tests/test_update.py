"""Tests for `tf_spectrain.runtime.update.StageUpdate`, a stage's update half, on its own.

Expectations come from NumPy (sums and norms of the gradients handed in) and from Keras'
SGD (the update applied).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_spectrain.runtime import replicas
from tf_spectrain.runtime.passes import StagePasses
from tf_spectrain.runtime.update import StageUpdate


def _update(learning_rate=0.5):
    """A `StageUpdate` of a one-layer stage with plain SGD, and the stage's variables."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    optimizer = keras.optimizers.SGD(learning_rate)
    optimizer.build(model.trainable_variables)
    passes = StagePasses(0, model, "/CPU:0", optimizer)
    return StageUpdate(0, "/CPU:0", optimizer, passes), model.trainable_variables


def _grads(variables, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=v.shape).astype("float32") for v in variables]


def test_backwards_add_up_and_one_update_applies_their_sum():
    update, variables = _update()
    before = [v.numpy().copy() for v in variables]
    first, second = _grads(variables, 1), _grads(variables, 2)
    update.add([tf.constant(g) for g in first])
    update.add([tf.constant(g) for g in second])
    want = sum(float(np.sum(np.square(a + b))) for a, b in zip(first, second))
    np.testing.assert_allclose(float(update.pending_square_norm()), want, rtol=1e-6)
    assert bool(update.pending_finite())
    update.update()
    for v, w, a, b in zip(variables, before, first, second):
        np.testing.assert_allclose(v.numpy(), w - 0.5 * (a + b), rtol=1e-6, atol=1e-6)
    assert update.gradient is None and update.updates == 1


def test_an_update_without_a_backward_raises_and_counts_nothing():
    update, _ = _update()
    with pytest.raises(RuntimeError, match="stage 0: update without a backward"):
        update.update()
    with pytest.raises(RuntimeError, match="stage 0: no pending gradient"):
        update.pending_finite()
    assert update.updates == 0


def test_a_non_finite_gradient_is_skipped_and_counted_when_asked():
    update, variables = _update()
    update.skip_non_finite = True
    before = [v.numpy().copy() for v in variables]
    bad = _grads(variables, 3)
    bad[0][0, 0] = np.inf
    update.add([tf.constant(g) for g in bad])
    assert not bool(update.pending_finite())
    update.update()
    assert update.skipped == 1 and update.updates == 0
    for v, w in zip(variables, before):
        np.testing.assert_array_equal(v.numpy(), w)


def test_without_a_reducer_each_copy_adds_up_every_copys_gradient_in_order():
    update, variables = _update()
    own, other = _grads(variables, 4), _grads(variables, 5)
    update.add([tf.constant(g) for g in own])
    update.reduce_pending([[tf.constant(g) for g in own], [tf.constant(g) for g in other]])
    for got, a, b in zip(update.gradient, own, other):
        np.testing.assert_array_equal(got.numpy(), a + b)
    summed = replicas.sum_over_replicas(own, [own, other], None, "/CPU:0")
    for got, a, b in zip(summed, own, other):
        np.testing.assert_array_equal(got.numpy(), a + b)


def test_reset_forgets_the_pending_gradient_and_window_updates_count():
    update, variables = _update()
    update.add([tf.constant(g) for g in _grads(variables, 6)])
    update.reset()
    assert update.gradient is None
    update.note_updates(3)
    assert update.updates == 3
