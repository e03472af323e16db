"""Child process of test_worker: the trainer's side, which must not run in pytest's process.

    python tests/cluster_child.py --cluster h0:p0,h1:p1 [--per-worker G] [--timeout S] [--ops]
    TF_CONFIG=... python tests/cluster_child.py --cluster TF_CONFIG

`connect_cluster` reconfigures the process's eager context (tests/conftest.py has already
initialised pytest's with 4 local devices), so the trainer runs here. Prints one JSON line:
the devices and the connect time, or the error's type and message; with `--ops`, also a
matmul and a variable placed on task 1 next to the same computed locally with NumPy.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def remote_ops(tf, np):
    """A matmul on task 1's CPU:1 and a variable on task 1's CPU:0, with NumPy's results."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 5)), rng.standard_normal((5, 3))
    with tf.device("/job:worker/replica:0/task:1/device:CPU:1"):
        product = tf.matmul(tf.constant(a, tf.float32), tf.constant(b, tf.float32))
    with tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
        variable = tf.Variable(tf.constant(a[:, :3], tf.float32))
        variable.assign_add(tf.ones_like(variable) * 2.0)
    value = variable.read_value()
    return {
        "matmul_device": product.device,
        "matmul_max_error": float(np.max(np.abs(product.numpy() - a @ b))),
        "variable_device": variable.device,
        "variable_max_error": float(np.max(np.abs(value.numpy() - (a[:, :3] + 2.0)))),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--per-worker", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--ops", action="store_true")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    import tf_spectrain

    cluster = None if args.cluster == "TF_CONFIG" else args.cluster
    start = time.monotonic()
    try:
        devices = tf_spectrain.connect_cluster(
            cluster, devices_per_worker=args.per_worker, timeout=args.timeout)
    except Exception as error:  # reported to the test, which checks it
        print(json.dumps({"error": type(error).__name__, "message": str(error),
                          "elapsed": time.monotonic() - start}), flush=True)
        return
    result = {"devices": devices, "elapsed": time.monotonic() - start,
              "local": tf.config.list_logical_devices()[0].name}
    if args.ops:
        result.update(remote_ops(tf, np))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)  # skip TensorFlow's teardown of a connected context
