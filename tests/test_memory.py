"""What each stage keeps alive (`runtime.memory`), per schedule, mode and `recompute`.

The counts come from the tensors the stages really keep, pass by pass; the expected numbers
are worked out here by hand from the model's shapes and the schedule's closed forms
(GPipe keeps all M micro-batches, 1F1B-flush `min(N - k, M)`, the asynchronous schedule
`(N - k) * M`), not from `tf_spectrain.schedule`.
"""

import keras
import numpy as np
import pytest

from tf_spectrain.pipeline_model import PipelineModel
from tf_spectrain.prediction import SpecTrainSGD
from tf_spectrain.runtime.memory import StageMemory, device_peak_bytes, tensor_bytes

N, WIDTH, BATCH, NUM_BATCHES = 4, 16, 16, 5
F32 = 4


def mlp():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((WIDTH,))
    h = inputs
    for n in range(N):
        h = keras.layers.Dense(WIDTH if n < N - 1 else 3, activation="relu" if n < N - 1 else None,
                               name=f"dense{n}")(h)
    return keras.Model(inputs, h)


def train(mode="sync", micro_batches=1, **options):
    pipe = PipelineModel(mlp(), cuts=[f"dense{n}" for n in range(N - 1)], mode=mode,
                         micro_batches=micro_batches, **options)
    pipe.compile(optimizer=SpecTrainSGD(learning_rate=0.01, momentum=0.9),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_BATCHES * BATCH, WIDTH)).astype("float32")
    y = rng.integers(0, 3, size=NUM_BATCHES * BATCH)
    pipe.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return pipe


@pytest.mark.parametrize("order, expected", [("gpipe", [8, 8, 8, 8]), ("1f1b", [4, 3, 2, 1])])
def test_one_f_one_b_keeps_fewer_micro_batches_than_gpipe(order, expected):
    memory = train("sync", 8, schedule=order).state.memory
    assert [m.peak_micro_batches for m in memory] == expected
    micro = BATCH // 8
    for k, m in enumerate(memory):
        outputs = WIDTH if k < N - 1 else 3
        # A kept tape: the stage's one Dense output; plus its inputs (and labels, last stage).
        per_micro = micro * (WIDTH + outputs) * F32 + (micro * 8 if k == N - 1 else 0)
        assert m.peak_in_flight == expected[k] * per_micro, k


def test_recompute_always_keeps_only_inputs_and_weight_copies():
    auto = train("stash", 2).state.memory
    always = train("stash", 2, recompute="always").state.memory
    micro = BATCH // 2
    params = [WIDTH * WIDTH + WIDTH] * (N - 1) + [WIDTH * 3 + 3]
    for k in range(N):
        assert auto[k].peak_micro_batches == always[k].peak_micro_batches == (N - k) * 2
        labels = micro * 8 if k == N - 1 else 0
        inputs = micro * WIDTH * F32 + labels
        # The last stage runs F(i), B(i) back to back: no update between, so no copy.
        copies = (N - k) * params[k] * F32 if k < N - 1 else 0
        assert always[k].peak_in_flight == (N - k) * 2 * inputs + copies, k
        assert auto[k].peak_in_flight > always[k].peak_in_flight - copies
        assert auto[k].weights == always[k].weights == params[k] * F32


def test_weights_and_slots_are_the_stage_variables():
    pipe = train("spectrain")
    for runner, m in zip(pipe.runners, pipe.state.memory):
        params = sum(int(np.prod(v.shape)) for v in runner.trainable) * F32
        assert m.weights == params
        # Momentum for every weight, plus the optimizer's scalar counters.
        assert params <= m.slots <= params + 64
        assert m.peak == m.weights + m.slots + m.peak_in_flight
        assert m.device_peak is None  # CPU devices: TensorFlow tracks no peak


def test_stage_memory_counts_shared_weight_copies_once():
    model = mlp()
    optimizer = keras.optimizers.SGD(momentum=0.9)
    optimizer.build(model.trainable_variables)
    memory = StageMemory(model, optimizer, "/CPU:0")
    x = np.zeros((2, WIDTH), "float32")
    copy = [np.zeros((10,), "float32")]
    memory.kept((0, 0), [x], weight_copy=copy)
    memory.kept((0, 1), [x], weight_copy=copy)
    assert memory.peak_in_flight == 2 * x.nbytes + 40
    memory.released((0, 0))
    memory.kept((1, 0), [x], tape_examples=2)
    assert memory.peak_in_flight == 2 * x.nbytes + 40 + memory.activations_per_example * 2
    memory.released((0, 1))
    memory.released((1, 0))
    memory.reset_peak()
    assert memory.peak_in_flight == 0 and memory.peak_micro_batches == 0
    # Every layer output of the model, per example: three Dense of WIDTH, one of 3.
    assert memory.activations_per_example == (3 * WIDTH + 3) * F32
    assert tensor_bytes([x, np.zeros((3,), "int64"), "not a tensor"]) == x.nbytes + 24
    assert device_peak_bytes("/CPU:0") is None
