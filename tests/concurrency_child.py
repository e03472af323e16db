"""Child process of test_concurrency: times 2-stage pipeline fits, prints CPU/wall as JSON.

    python tests/concurrency_child.py [--mode spectrain] [--serialised-mode stash] [--steps 40]

One intra-op thread per op, the CPU split into 2 logical devices: each stage can use one
core, so CPU time / wall time is about 2 when the stages run at once and about 1 when they
run one at a time (a little more: with two inter-op threads, independent ops of one pass,
such as a backward's weight and input gradients, run side by side). The child first times
a pipeline in `--mode` whose stages run freely (pass by pass, then in windows of 8
mini-batches, one graph each), then a fresh pipeline in `--serialised-mode`
whose stages take turns (a lock around every pass), to show that the measurement tells the
two apart. Both in one process: the thread settings are the same for both, and a second
TensorFlow start would cost more than the two measurements.
"""

import argparse
import json
import os
import threading
import time
import warnings

from runtimes import EAGER, compile_quietly

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def conv_model(keras):
    """Two blocks of two convolutions; the cut after the first splits the work about 10:14."""
    x = inp = keras.Input((32, 32, 3))
    for block, width in ((1, 32), (2, 64)):
        for n in (1, 2):
            x = keras.layers.Conv2D(width, 3, padding="same", activation="relu",
                                    name=f"block{block}_conv{n}")(x)
        x = keras.layers.MaxPooling2D(name=f"block{block}_pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    return keras.Model(inp, keras.layers.Dense(10, name="logits")(x))


def serialise(runner_cls):
    """Makes every pass of every stage hold one process-wide lock (from now on)."""
    lock = threading.Lock()
    for name in ("forward", "backward", "update"):
        original = getattr(runner_cls, name)

        def locked(self, *args, _original=original, **kwargs):
            with lock:
                return _original(self, *args, **kwargs)

        setattr(runner_cls, name, locked)


def measure(tf_spectrain, keras, np, devices, mode, steps, b, steps_per_execution=EAGER):
    """CPU/wall of a timed `fit` of a fresh pipeline in `mode` (after a tracing `fit`).

    Pass by pass (`EAGER`: `run_eagerly=True`, the stage threads), or in windows of that many
    mini-batches (one graph per window); windows trace one graph per window shape, so
    their tracing `fit` is as long as the timed one.
    """
    keras.utils.set_random_seed(0)
    pipe = tf_spectrain.PipelineModel(
        conv_model(keras), cuts=["block1_pool"], devices=devices, mode=mode
    )
    compile_quietly(pipe, tf_spectrain.SpecTrainSGD(0.01, momentum=0.9),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=steps_per_execution)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(b * steps, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, len(x))
    warm = 3 * b if steps_per_execution == EAGER else len(x)
    pipe.fit(x[:warm], y[:warm], batch_size=b, epochs=1, verbose=0, shuffle=False)  # tracing
    cpu, wall = time.process_time(), time.perf_counter()
    pipe.fit(x, y, batch_size=b, epochs=1, verbose=0, shuffle=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cores": cpu / wall, "wall": wall, "cpu": cpu, "mode": mode}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="spectrain")
    p.add_argument("--serialised-mode", default="stash")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import keras

    import tf_spectrain
    from tf_spectrain.runtime.stage import StageRunner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        devices = tf_spectrain.setup_devices(2)
    free = measure(tf_spectrain, keras, np, devices, args.mode, args.steps, args.batch_size)
    windows = measure(tf_spectrain, keras, np, devices, args.mode, args.steps, args.batch_size,
                      steps_per_execution=8)
    serialise(StageRunner)
    taking_turns = measure(tf_spectrain, keras, np, devices, args.serialised_mode, args.steps,
                           args.batch_size)
    print(json.dumps({"free": free, "windows": windows, "taking_turns": taking_turns}))


if __name__ == "__main__":
    main()
