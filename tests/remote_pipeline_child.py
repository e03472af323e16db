"""Child process of test_remote_pipeline: the trainer of a pipeline across loopback workers
(one child makes the equality and the watchdog checks, on the same two workers, since each
start of a trainer and of its workers costs several seconds of TensorFlow imports).

    python tests/remote_pipeline_child.py --cluster h0:p0,h1:p1 --mode sync,spectrain \
        [--slow 1.2 --deadline 0.4 --interval 0.3] [--stop PID]

Connects (2 devices per worker) and prints one JSON line of what the given flags ask for,
in this order:

`--mode`: trains a small MLP as a 4-stage pipeline on the workers' devices in each mode
(with per-example sample weights, which the labels carry to the last stage),
then the same pipeline from the same weights on this process' own CPU, and reports the
largest weight difference, where the stages' variables live and the loss history; then
the same for two replicas of a 2-stage pipeline, one on each worker, against one pipeline
with the same batch on this process' CPU.

The watchdog (tf_spectrain.cluster.watchdog): `--slow S` trains 2 mini-batches of a model
whose stage 3 (worker 1's CPU:1) busies its worker for S seconds in every forward, with the
watchdog's deadline set to `--deadline` (and its interval to `--interval`, if given), and
reports the error (None), stage 3's forwards and the watchdog's checks (task, start and end
times); `--stop PID` then stops that worker (SIGSTOP) once the first epoch of the default
watchdog has trained 5 mini-batches, and reports how long `fit` took to fail, the error,
the threads left, and, after killing the stopped worker (SIGKILL), the pipeline's and the
watchdog's threads still left once those have ended (or 10 s passed). `--stop` goes last:
it leaves worker 1 dead.
"""

import argparse
import json
import os
import signal
import threading
import time

from runtimes import EAGER, compile_quietly

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


def build_slow(keras, tf, seconds):
    """`build` with a layer before d3 (stage 3) that keeps its device busy for `seconds`."""
    keras.utils.set_random_seed(0)

    def busy(t):
        # Matrix products until `seconds` have passed, inside the stage's tf.function.
        start = tf.timestamp()
        m = tf.fill([200, 200], 0.005) + 0.0 * tf.reduce_mean(t)
        m = tf.while_loop(lambda m: tf.timestamp() - start < seconds,
                          lambda m: [tf.tanh(tf.matmul(m, m))], [m])[0]
        return t + 0.0 * tf.stop_gradient(tf.reduce_mean(m))

    inputs = keras.Input((6,))
    h = inputs
    for n in range(4):
        last = n == 3
        if last:
            h = keras.layers.Lambda(busy, name="busy")(h)
        h = keras.layers.Dense(3 if last else 8, activation=None if last else "relu",
                               name=f"d{n}")(h)
    return keras.Model(inputs, h)


def busy_run(tf_spectrain, keras, tf, devices, seconds, deadline, interval, np):
    """Trains 2 mini-batches past a busy stage 3 with watchdog deadline `deadline`.

    `interval` (None: the default) is the watchdog's pause between rounds of checks.
    """
    from tf_spectrain.cluster import watchdog

    checks = []
    call = watchdog.WorkerProbe.__call__

    def timed(probe):
        start = time.perf_counter()
        call(probe)
        checks.append((probe.task, start, time.perf_counter()))

    watchdog.WorkerProbe.__call__ = timed
    before = watchdog.configure(deadline=deadline, interval=interval)
    model = build_slow(keras, tf, seconds)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 6)).astype("float32"), np.arange(16) % 3
    try:
        # Pass by pass, so that stage 3's forwards have their own times.
        pipe, _ = train(tf_spectrain, keras, model, devices, "sync", x, y, epochs=1,
                        steps_per_execution=EAGER)
        error = None
    except Exception as failure:  # reported to the test, which checks it
        pipe, error = None, f"{type(failure).__name__}: {failure}"
    finally:
        watchdog.WorkerProbe.__call__ = call
        watchdog.configure(**before)
    forwards = [] if pipe is None else [
        (start, end) for kind, _, start, end in pipe.runners[3].timeline if kind == "forward"]
    return {"error": error, "forwards": forwards, "checks": checks}


def stop_run(tf_spectrain, keras, devices, pid, np):
    """Stops worker `pid` 5 batches into training; reports the failure and the threads left."""
    import tensorflow as tf

    model = build(keras)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8000, 6)).astype("float32")
    stopped = []

    class Stop(keras.callbacks.Callback):
        # In the caller's thread, between mini-batches: the stages run on meanwhile.
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4 and not stopped:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(time.monotonic())

    try:
        train(tf_spectrain, keras, model, devices, "stash", x, np.arange(8000) % 3,
              callbacks=[Stop()])
        result = {"error": None}
    except Exception as error:  # reported to the test, which checks it
        result = {"error": type(error).__name__, "message": str(error),
                  "unavailable": isinstance(error, tf.errors.UnavailableError),
                  "notes": list(getattr(error, "__notes__", [])),
                  "after_stop": time.monotonic() - stopped[0] if stopped else None}
    result["threads"] = sorted(t.name for t in threading.enumerate())
    os.kill(pid, signal.SIGKILL)  # the stuck remote ops now fail, and their threads end
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and ours():
        time.sleep(0.1)
    result["threads_after_kill"] = ours()
    return result


def ours():
    """The names of the pipeline's and the watchdog's threads still running.

    Not the data iterators' reaper ("tf_spectrain-iterator-reaper"), which lives on.
    """
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(
        ("stage-", "tf_spectrain-wait", "tf_spectrain-watchdog", "tf_spectrain-check")))


def train(tf_spectrain, keras, model, devices, mode, x, y, epochs=2, callbacks=None,
          replicas=1, cuts=("d0", "d1", "d2"), steps_per_execution="auto", sample_weight=None):
    pipe = tf_spectrain.PipelineModel(model, cuts=list(cuts), devices=devices, mode=mode,
                                      replicas=replicas)
    compile_quietly(pipe, tf_spectrain.SpecTrainSGD(0.1, momentum=0.9),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=steps_per_execution)
    history = pipe.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
                       callbacks=callbacks, sample_weight=sample_weight)
    return pipe, history.history["loss"]


def equality(tf_spectrain, keras, np, devices, modes):
    """The `--mode` checks: each mode's pipeline on the workers and on this process' CPU."""
    model = build(keras)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 6)).astype("float32"), np.arange(40) % 3
    weights = rng.uniform(0.5, 2.0, 40).astype("float32")  # the labels carry them to stage 3
    w0 = model.get_weights()
    results = {}
    local_device = "/job:localhost/replica:0/task:0/device:CPU:0"
    for mode in modes:
        model.set_weights(w0)
        pipe, remote_loss = train(tf_spectrain, keras, model, devices, mode, x, y,
                                  sample_weight=weights)
        remote = model.get_weights()
        where = [stage.variables[0].value.device for stage in pipe.stages]
        evaluated = pipe.evaluate(x, y, verbose=0)
        model.set_weights(w0)
        _, local_loss = train(tf_spectrain, keras, model, [local_device] * 4, mode, x, y,
                              sample_weight=weights)
        results[mode] = {
            "max_diff": max(float(np.max(np.abs(a - b)))
                            for a, b in zip(remote, model.get_weights())),
            "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(remote, w0)),
            "devices": devices, "variables_on": where, "remote_loss": remote_loss,
            "local_loss": local_loss, "evaluate": evaluated,
        }
    # Two replicas of a 2-stage stash pipeline, one on each worker, against one pipeline
    # with the same batch on this process' CPU.
    model.set_weights(w0)
    pipe, remote_loss = train(tf_spectrain, keras, model, devices, "stash", x, y, replicas=2,
                              cuts=["d1"])
    remote = model.get_weights()
    where = [[stage.variables[0].value.device for stage in stages]
             for stages in pipe.replica_stages]
    model.set_weights(w0)
    _, local_loss = train(tf_spectrain, keras, model, [local_device] * 2, "stash", x, y,
                         cuts=["d1"])
    results["replicas"] = {
        "max_diff": max(float(np.max(np.abs(a - b)))
                        for a, b in zip(remote, model.get_weights())),
        "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(remote, w0)),
        "variables_on": where, "remote_loss": remote_loss, "local_loss": local_loss,
    }
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--mode", default=None)
    parser.add_argument("--stop", type=int, default=None)
    parser.add_argument("--slow", type=float, default=None)
    parser.add_argument("--deadline", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=None)
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    import tf_spectrain

    devices = tf_spectrain.connect_cluster(args.cluster, devices_per_worker=2)
    result = {}
    if args.mode is not None:
        result["equal"] = equality(tf_spectrain, keras, np, devices, args.mode.split(","))
    if args.slow is not None:
        result["busy"] = busy_run(tf_spectrain, keras, tf, devices, args.slow,
                                  args.deadline, args.interval, np)
    if args.stop is not None:
        result["stop"] = stop_run(tf_spectrain, keras, devices, args.stop, np)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)  # skip TensorFlow's teardown of a connected context
