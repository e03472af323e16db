"""Mixed precision: Keras dtype policies in every pipeline mode, and dynamic loss scaling.

Sync mode is compared with plain Keras `model.fit` under the same policy (with a
`LossScaleOptimizer` for float16, including a start so high that the first steps
overflow); the asynchronous modes' per-stage scale rule (docs/SPECTRAIN.md, "Mixed
precision and loss scaling") is checked on a model where only one stage overflows.
"""

import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from runtimes import EAGER, compile_quietly

from tf_spectrain import checkpoint
from tf_spectrain.app import cli, trainers
from tf_spectrain.checkpoint import CheckpointError
from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.runtime import loss_scale

POLICIES = ["mixed_bfloat16", "mixed_float16"]
COMPUTE = {"mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16}
ASYNC = [("vanilla", "paper"), ("stash", "paper"), ("spectrain", "paper"),
         ("spectrain", "consistent")]
CUTS = ["dense0", "dense2"]  # 3 stages: dense0 | dense1, dense2 | dense3
BATCH, NUM_BATCHES = 8, 6
LR, MOMENTUM = 0.1, 0.9


@pytest.fixture(autouse=True)
def _float32_policy_after_each_test():
    """Every test starts and ends with Keras' default policy, whatever it set or raised."""
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


class _AmplifyGradient(keras.layers.Layer):
    """The identity forward; the backward multiplies the gradient by `factor`."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        factor = self.factor

        @tf.custom_gradient
        def amplify(t):
            return tf.identity(t), lambda d: d * tf.cast(factor, d.dtype)

        return amplify(x)

    def get_config(self):
        return dict(super().get_config(), factor=self.factor)


def mlp(policy, amplify=None):
    """Four Dense layers (seeded) built under `policy`; `amplify` puts an `_AmplifyGradient`
    at the start of stage 1 (it blows up the gradient stage 1 sends to stage 0)."""
    keras.utils.set_random_seed(3)
    with trainers.precision_policy(policy):
        inputs = keras.Input((6,))
        h = keras.layers.Dense(8, activation="relu", name="dense0")(inputs)
        if amplify is not None:
            h = _AmplifyGradient(amplify, name="amplify")(h)
        for n in (1, 2):
            h = keras.layers.Dense(8, activation="relu", name=f"dense{n}")(h)
        outputs = keras.layers.Dense(3, name="dense3")(h)
        return keras.Model(inputs, outputs)


def data(seed=0, num_batches=NUM_BATCHES):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_batches * BATCH, 6)).astype("float32")
    return x, rng.integers(0, 3, num_batches * BATCH)


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def sgd():
    return SpecTrainSGD(learning_rate=LR, momentum=MOMENTUM)


def scaled(**options):
    return keras.optimizers.LossScaleOptimizer(sgd(), **options)


def keras_fit(model, optimizer, epochs=2):
    model.compile(optimizer=optimizer, loss=loss())
    history = model.fit(*data(), batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return history.history["loss"]


def pipeline_fit(model, optimizer, mode="sync", target="paper", epochs=2, num_batches=NUM_BATCHES):
    pipe = PipelineModel(model, cuts=CUTS, mode=mode, spectrain_target=target)
    pipe.compile(optimizer=optimizer, loss=loss())
    history = pipe.fit(*data(num_batches=num_batches), batch_size=BATCH, epochs=epochs,
                       shuffle=False, verbose=0)
    return pipe, history.history["loss"]


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def scales(pipe):
    return [float(r.loss_scale.scale.numpy()) for r in pipe.runners]


# --- the kernels this file relies on ----------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_has_half_precision_dense_and_conv_kernels(policy):
    """TF on CPU runs Dense and Conv2D forward and backward in float16 and bfloat16."""
    with trainers.precision_policy(policy):
        layers = [keras.layers.Conv2D(2, 3), keras.layers.Flatten(), keras.layers.Dense(3)]
    x = tf.random.normal((2, 5, 5, 1))
    with tf.GradientTape() as tape:
        h = x
        for layer in layers:
            h = layer(h)
        total = tf.reduce_sum(tf.cast(h, tf.float32))
    weights = [w.value for layer in layers for w in layer.trainable_weights]
    grads = tape.gradient(total, weights)
    assert h.dtype == COMPUTE[policy]
    assert all(w.dtype == tf.float32 for w in weights)
    assert all(g is not None and bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)


# --- the loss scale's own rules ------------------------------------------------------------


def test_resolve_follows_keras_compile():
    inner = sgd()
    optimizer, settings = loss_scale.resolve(scaled(initial_scale=4.0, dynamic_growth_steps=7),
                                             mlp("float32"))
    assert isinstance(optimizer, SpecTrainSGD) and settings == loss_scale.LossScaleSettings(4.0, 7)
    defaults = loss_scale.LossScaleSettings()
    assert loss_scale.resolve(inner, mlp("mixed_float16")) == (inner, defaults)
    assert loss_scale.resolve(inner, mlp("mixed_float16"), auto_scale_loss=False) == (inner, None)
    assert loss_scale.resolve(inner, mlp("mixed_bfloat16")) == (inner, None)  # as Keras
    default = keras.optimizers.LossScaleOptimizer(sgd())
    assert (default.initial_scale, default.dynamic_growth_steps) == (
        loss_scale.INITIAL_SCALE, loss_scale.GROWTH_STEPS)


@pytest.mark.parametrize(
    "counter, applied, halve, new_scale, new_counter",
    [
        (0, True, True, 8.0, 1),  # counted
        (2, True, False, 16.0, 0),  # the growth_steps-th in a row: doubles
        (2, False, True, 4.0, 0),  # its own overflow: halves
        (2, False, False, 8.0, 2),  # an overflow from downstream: unchanged
    ],
)
def test_scale_rule(counter, applied, halve, new_scale, new_counter):
    scale = loss_scale.DynamicLossScale(loss_scale.LossScaleSettings(8.0, 3), "/CPU:0", False)
    scale.counter.assign(counter)
    tf.function(scale.after_update)(tf.constant(applied), tf.constant(halve))
    assert (float(scale.scale.numpy()), int(scale.counter.numpy())) == (new_scale, new_counter)


def test_rescale_brings_a_gradient_to_the_stage_scale_in_its_dtype():
    g = tf.constant([1.5, -3.0], tf.float16)
    (out,), scale, finite = loss_scale.rescale([g], tf.constant(2.0), tf.constant(8.0))
    assert out.dtype == tf.float16 and float(scale) == 8.0 and bool(finite)
    np.testing.assert_array_equal(out.numpy(), [6.0, -12.0])
    (out,), _, finite = loss_scale.rescale([tf.constant([np.inf], tf.float16)],
                                           tf.constant(1.0), tf.constant(1.0))
    assert not bool(finite)


# --- sync mode against Keras -----------------------------------------------------------


def test_sync_bfloat16_equals_keras_fit():
    """Same policy, same steps. Each stage is its own graph, so a sum may round in another
    order: in bfloat16 (8 significant bits, relative rounding 2**-9 = 2e-3) one such
    rounding moves a step by about 2e-3 of it, and the weights (12 steps of size < 0.1) by
    a few 1e-4. 2e-3 allows for that (here the two agree exactly), and is far below what
    bfloat16 itself changes: the same training in float32 ends 0.08 away, so a pipeline
    that computed in float32 would fail."""
    reference = mlp("mixed_bfloat16")
    start = reference.get_weights()
    keras_losses = keras_fit(reference, sgd())
    in_float32 = mlp("float32")
    keras_fit(in_float32, sgd())
    model = mlp("mixed_bfloat16")
    pipe, pipe_losses = pipeline_fit(model, sgd())
    assert all(r.loss_scale is None for r in pipe.runners)  # no loss scaling, as Keras
    assert max_diff(model.get_weights(), reference.get_weights()) < 2e-3
    assert max_diff(model.get_weights(), in_float32.get_weights()) > 10 * 2e-3
    assert max_diff(model.get_weights(), start) > 50 * 2e-3
    np.testing.assert_allclose(pipe_losses, keras_losses, rtol=1e-2)


OVERFLOWING = dict(initial_scale=2.0**40, dynamic_growth_steps=3)  # ~25 steps overflow


@pytest.mark.parametrize(
    "options, clipnorm",
    [(None, None),  # mixed_float16 alone: the scale Keras' compile adds (2**15, growth 2000)
     (OVERFLOWING, None),
     (OVERFLOWING, 0.05)],  # global_clipnorm: Keras clips the unscaled gradient
    ids=["auto", "overflowing-start", "overflowing-start-global-clipnorm"],
)
def test_sync_float16_equals_keras_loss_scale_optimizer(options, clipnorm):
    epochs = 2 if options is None else 6

    def optimizer():
        inner = SpecTrainSGD(learning_rate=LR, momentum=MOMENTUM, global_clipnorm=clipnorm)
        return inner if options is None else keras.optimizers.LossScaleOptimizer(inner, **options)

    reference = mlp("mixed_float16")
    keras_fit(reference, optimizer(), epochs=epochs)
    keras_scale = float(reference.optimizer.dynamic_scale.numpy())
    keras_skipped = epochs * NUM_BATCHES - int(reference.optimizer.iterations.numpy())
    model = mlp("mixed_float16")
    pipe, _ = pipeline_fit(model, optimizer(), epochs=epochs)
    # One scale for the whole pipeline: every stage skipped the same steps as Keras and
    # holds Keras' scale and growth counter.
    assert [r.skipped for r in pipe.runners] == [keras_skipped] * 3
    assert scales(pipe) == [keras_scale] * 3
    counter = int(reference.optimizer.step_counter.numpy())
    assert [int(r.loss_scale.counter.numpy()) for r in pipe.runners] == [counter] * 3
    if options is not None:
        assert keras_skipped > 20 and keras_scale < 2.0**20  # it did overflow, and recover
    # float16 rounds to 2**-11 = 5e-4 relative (here the two agree exactly); float32
    # training ends more than 1e-2 away.
    assert max_diff(model.get_weights(), reference.get_weights()) < 2e-3


def test_sync_replicas_share_the_one_scale(tmp_path):
    """2 replicas x 2 stages: all four copies take Keras' decisions on the summed gradient,
    and a checkpoint (of replica 0) gives every copy its scale back."""
    options = OVERFLOWING
    reference = mlp("mixed_float16")
    keras_fit(reference, scaled(**options), epochs=4)
    skipped = 4 * NUM_BATCHES - int(reference.optimizer.iterations.numpy())
    model = mlp("mixed_float16")
    pipe = PipelineModel(model, cuts=["dense1"], mode="sync", replicas=2)
    pipe.compile(optimizer=scaled(**options), loss=loss())
    pipe.fit(*data(), batch_size=BATCH, epochs=4, shuffle=False, verbose=0)
    assert [r.skipped for r in pipe.all_runners] == [skipped] * 4
    keras_scale = float(reference.optimizer.dynamic_scale.numpy())
    assert [float(r.loss_scale.scale.numpy()) for r in pipe.all_runners] == [keras_scale] * 4
    assert max_diff(model.get_weights(), reference.get_weights()) < 2e-3
    path = checkpoint.save(pipe, str(tmp_path), epoch=4)
    fresh = PipelineModel(mlp("mixed_float16"), cuts=["dense1"], mode="sync", replicas=2)
    fresh.compile(optimizer=scaled(**options), loss=loss())
    checkpoint.restore_checkpoint(fresh, path)
    assert [float(r.loss_scale.scale.numpy()) for r in fresh.all_runners] == [keras_scale] * 4


# --- the asynchronous modes ------------------------------------------------------------


def _spy(pipe):
    """Records the dtypes of stage 0's activations and stage 1's gradient hand-offs."""
    seen = {"activations": set(), "gradients": set(), "scales": set()}
    first, second = pipe.runners[0], pipe.runners[1]
    forward, backward = first.forward, second.backward

    def spy_forward(*args, **kwargs):
        outputs = forward(*args, **kwargs)
        seen["activations"].update(t.dtype for t in outputs)
        return outputs

    def spy_backward(*args, **kwargs):
        sent = backward(*args, **kwargs)
        if isinstance(sent, loss_scale.ScaledGradient):
            seen["scales"].add(sent.scale.dtype)
            sent_gradients = sent.gradients
        else:
            sent_gradients = sent
        seen["gradients"].update(t.dtype for t in sent_gradients)
        return sent

    first.forward, second.backward = spy_forward, spy_backward
    return seen


# Each mode/target once, each policy twice (the scale path is float16's); two cases also
# split into micro-batches and recompute every backward (issue 15's options).
@pytest.mark.parametrize("policy, mode, target, options", [
    ("mixed_float16", "stash", "paper", dict(micro_batches=2, recompute="always")),
    ("mixed_float16", "spectrain", "paper", {}),
    ("mixed_bfloat16", "vanilla", "paper", dict(micro_batches=2)),
    ("mixed_bfloat16", "spectrain", "consistent", dict(recompute="always")),
])
def test_async_modes_train_in_the_compute_dtype(policy, mode, target, options):
    model = mlp(policy)
    pipe = PipelineModel(model, cuts=CUTS, mode=mode, spectrain_target=target, **options)
    compile_quietly(pipe, optimizer=sgd(), loss=loss(), steps_per_execution=EAGER)  # spied
    seen = _spy(pipe)
    history = pipe.fit(*data(), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert seen["activations"] == {COMPUTE[policy]} and seen["gradients"] == {COMPUTE[policy]}
    for runner in pipe.runners:
        assert all(v.dtype == "float32" for v in runner.model.variables)
        assert all(runner.optimizer.momentum_of(v).dtype == "float32"
                   for v in runner.trainable)
        steps = runner.plan.forward_steps
        assert all(w.dtype == tf.float32 for w in runner.current_weights(steps))  # W + s * m
        assert int(runner.optimizer.iterations.numpy()) > 0  # it did update
    if policy == "mixed_float16":
        assert seen["scales"] == {tf.float32}
        assert all(r.loss_scale is not None and not r.loss_scale.shared for r in pipe.runners)
    else:
        assert all(r.loss_scale is None for r in pipe.runners)


def test_a_received_gradient_is_brought_to_the_stage_scale():
    """Stage 1 gets `g` at its own scale, or `g / 4` at a quarter of it: the same backward."""
    pipe = PipelineModel(mlp("mixed_float16"), cuts=CUTS, mode="stash")
    pipe.compile(optimizer=sgd(), loss=loss())
    runner = pipe.runners[1]
    own = tf.constant(loss_scale.INITIAL_SCALE)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(BATCH, 8)), tf.float16)  # dense0's output
    g = tf.constant(rng.normal(size=(BATCH, 8)), tf.float16)  # for dense2's output
    results = []
    for sent in (loss_scale.ScaledGradient([g], own), loss_scale.ScaledGradient([g / 4], own / 4)):
        runner.forward((0, 0), x, True)  # keep the activations
        back = runner.backward((0, 0), sent)
        results.append(([p.numpy() for p in runner.pending_gradient], back))
        runner.reset()
    (first, back_first), (second, back_second) = results
    assert float(back_first.scale) == float(back_second.scale) == loss_scale.INITIAL_SCALE
    assert back_first.gradients[0].dtype == tf.float16
    np.testing.assert_array_equal(back_first.gradients[0], back_second.gradients[0])
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert max(float(np.max(np.abs(a))) for a in first) > 0


def test_async_overflow_in_one_stage_skips_it_and_the_stages_before():
    """Stage 1 overflows (its input gradient): it skips and halves its own scale; stage 0
    receives a non-finite gradient and skips without halving; stage 2 applied."""
    pipe, _ = pipeline_fit(mlp("mixed_float16", amplify=2.0**14), sgd(), mode="stash",
                           epochs=1, num_batches=1)
    assert [r.skipped for r in pipe.runners] == [1, 1, 0]
    start = loss_scale.INITIAL_SCALE
    assert scales(pipe) == [start, start / 2, start]
    assert [int(r.loss_scale.counter.numpy()) for r in pipe.runners] == [0, 0, 1]
    assert [int(r.optimizer.iterations.numpy()) for r in pipe.runners] == [0, 0, 1]


def test_sync_overflow_in_one_stage_skips_and_halves_everywhere():
    pipe, _ = pipeline_fit(mlp("mixed_float16", amplify=2.0**14), sgd(), epochs=1,
                           num_batches=1)
    assert [r.skipped for r in pipe.runners] == [1, 1, 1]
    assert scales(pipe) == [loss_scale.INITIAL_SCALE / 2] * 3


def test_async_loss_scaling_with_replicas_is_refused():
    pipe = PipelineModel(mlp("mixed_float16"), cuts=["dense1"], mode="stash", replicas=2)
    with pytest.raises(ValueError, match="loss scaling .* with replicas needs mode='sync'"):
        pipe.compile(optimizer=sgd(), loss=loss())
    pipe.compile(optimizer=sgd(), loss=loss(), auto_scale_loss=False)  # no scaling: fine


# --- checkpoints -------------------------------------------------------------------------


def test_checkpoint_saves_and_restores_every_stage_scale(tmp_path):
    options = OVERFLOWING
    pipe, _ = pipeline_fit(mlp("mixed_float16"), scaled(**options), mode="vanilla", epochs=1)
    saved = scales(pipe)
    counters = [int(r.loss_scale.counter.numpy()) for r in pipe.runners]
    assert saved != [2.0**40] * 3  # the scales moved
    path = checkpoint.save(pipe, str(tmp_path), epoch=1)
    fresh = PipelineModel(mlp("mixed_float16"), cuts=CUTS, mode="vanilla")
    fresh.compile(optimizer=scaled(**options), loss=loss())
    checkpoint.restore_checkpoint(fresh, path)
    assert scales(fresh) == saved
    assert [int(r.loss_scale.counter.numpy()) for r in fresh.runners] == counters
    unscaled = PipelineModel(mlp("mixed_float16"), cuts=CUTS, mode="vanilla")
    unscaled.compile(optimizer=sgd(), loss=loss(), auto_scale_loss=False)
    with pytest.raises(CheckpointError, match="loss_scale: the checkpoint has 'dynamic'"):
        checkpoint.restore_checkpoint(unscaled, path)


def test_a_checkpoint_re_cut_into_fewer_stages_takes_the_smallest_scale(tmp_path):
    pipe, _ = pipeline_fit(mlp("mixed_float16"), scaled(), mode="vanilla", epochs=1)
    for runner, scale, counter in zip(pipe.runners, (8.0, 2.0, 4.0), (5, 6, 7)):
        runner.loss_scale.scale.assign(scale)
        runner.loss_scale.counter.assign(counter)
    path = checkpoint.save(pipe, str(tmp_path), epoch=1)
    fewer = PipelineModel(mlp("mixed_float16"), cuts=["dense1"], mode="vanilla")
    fewer.compile(optimizer=scaled(), loss=loss())
    checkpoint.restore_checkpoint(fewer, path)
    assert scales(fewer) == [2.0, 2.0]  # no stage overflowed at it
    assert [int(r.loss_scale.counter.numpy()) for r in fewer.runners] == [6, 6]
    for a, b in zip(pipe.model.get_weights(), fewer.model.get_weights()):
        np.testing.assert_array_equal(a, b)


# --- train.py --precision ------------------------------------------------------------------


@pytest.mark.parametrize(
    "precision, message",
    [("float16", r"did you mean 'mixed_float16'"),
     ("fp32", r"--precision must be one of \['float32', 'mixed_bfloat16', 'mixed_float16'\]")],
)
def test_bad_precision_flag_exits_2(precision, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--precision", precision])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"Received: --precision {precision}" in err
    assert re.search(message, err)
    assert cli.parse_args([]).precision == "float32"


def test_build_trainer_refuses_an_unknown_precision():
    with pytest.raises(ValueError, match="`precision` must be one of"):
        trainers.build_trainer(lambda: mlp("float32"), "sync", ["/CPU:0"], learning_rate=0.1,
                               precision="half")


def test_train_py_runs_in_mixed_bfloat16(tmp_path, capsys):
    export = str(tmp_path / "model.keras")
    code = cli.main(["--model", "mlp", "--gpus", "2", "--mode", "stash", "--cuts", "dense1",
                     "--limit", "48", "--batch-size", "16", "--epochs", "1",
                     "--keep-checkpoints", "0", "--prediction-every", "0",
                     "--precision", "mixed_bfloat16", "--logdir", str(tmp_path / "run"),
                     "--export", export])
    assert code == 0
    assert "in mixed_bfloat16" in capsys.readouterr().out
    assert keras.mixed_precision.global_policy().name == "float32"  # reset after building
    trained = keras.models.load_model(export, compile=False)
    assert {layer.dtype_policy.name for layer in trained.layers[1:]} == {"mixed_bfloat16"}
    assert os.path.exists(export)
