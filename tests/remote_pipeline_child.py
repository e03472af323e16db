"""Child process of test_remote_pipeline: the trainer of a pipeline across loopback workers.

    python tests/remote_pipeline_child.py --cluster h0:p0,h1:p1 --mode sync,spectrain
    python tests/remote_pipeline_child.py --cluster ... --mode stash --kill PID

Connects (2 devices per worker), trains a small MLP as a 4-stage pipeline on the workers'
devices, then the same pipeline from the same weights on this process' own CPU, and prints
one JSON line: the largest weight difference, where the stages' variables live and the
loss history. With `--kill PID`, it kills that worker (SIGKILL) during the first epoch
instead and reports how long `fit` took to fail after the kill, the error and its notes,
and the threads left.
"""

import argparse
import json
import os
import signal
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build(keras):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = inputs
    for n in range(4):
        last = n == 3
        h = keras.layers.Dense(3 if last else 8, activation=None if last else "relu",
                               name=f"d{n}")(h)
    return keras.Model(inputs, h)


def train(tf_spectrain, keras, model, devices, mode, x, y, epochs=2):
    pipe = tf_spectrain.PipelineModel(model, cuts=["d0", "d1", "d2"], devices=devices,
                                      mode=mode)
    pipe.compile(tf_spectrain.SpecTrainSGD(0.1, momentum=0.9),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = pipe.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    return pipe, history.history["loss"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--mode", default="sync")
    parser.add_argument("--kill", type=int, default=None)
    args = parser.parse_args()

    import keras
    import numpy as np

    import tf_spectrain

    devices = tf_spectrain.connect_cluster(args.cluster, devices_per_worker=2)
    model = build(keras)
    rng = np.random.default_rng(0)
    if args.kill is not None:
        x = rng.normal(size=(8000, 6)).astype("float32")
        killed = []

        def kill():
            time.sleep(2.0)
            os.kill(args.kill, signal.SIGKILL)
            killed.append(time.monotonic())

        threading.Thread(target=kill, daemon=True).start()
        try:
            train(tf_spectrain, keras, model, devices, args.mode, x, np.arange(8000) % 3)
            result = {"error": None}
        except Exception as error:  # reported to the test, which checks it
            result = {"error": type(error).__name__,
                      "notes": list(getattr(error, "__notes__", [])),
                      "after_kill": time.monotonic() - killed[0] if killed else None}
        result["threads"] = sorted(t.name for t in threading.enumerate())
        print(json.dumps(result), flush=True)
        return
    x, y = rng.normal(size=(40, 6)).astype("float32"), np.arange(40) % 3
    w0 = model.get_weights()
    results = {}
    for mode in args.mode.split(","):
        model.set_weights(w0)
        pipe, remote_loss = train(tf_spectrain, keras, model, devices, mode, x, y)
        remote = model.get_weights()
        where = [stage.variables[0].value.device for stage in pipe.stages]
        evaluated = pipe.evaluate(x, y, verbose=0)
        model.set_weights(w0)
        local_device = "/job:localhost/replica:0/task:0/device:CPU:0"
        _, local_loss = train(tf_spectrain, keras, model, [local_device] * 4, mode, x, y)
        results[mode] = {
            "max_diff": max(float(np.max(np.abs(a - b)))
                            for a, b in zip(remote, model.get_weights())),
            "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(remote, w0)),
            "devices": devices, "variables_on": where, "remote_loss": remote_loss,
            "local_loss": local_loss, "evaluate": evaluated,
        }
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)  # skip TensorFlow's teardown of a connected context
