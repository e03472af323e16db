"""Child process of test_worker: the trainer's side, which must not run in pytest's process.

    python tests/cluster_child.py CASES_JSON

CASES_JSON is a list of cases, run one after the other in this process, each a dict:
`name`, `cluster` (`h0:p0,h1:p1`, or "TF_CONFIG" to pass None and read the `tf_config`
entry, which is put in the environment), and optional `per_worker`, `timeout` and `ops`.

`connect_cluster` reconfigures the process's eager context (tests/conftest.py has already
initialised pytest's with 4 local devices), so the trainer runs here. Prints one JSON line,
`{name: result}`: for each case the devices and the connect time, or the error's type and
message; with `ops`, also a matmul and a variable placed on task 1 next to the same
computed locally with NumPy. A case that fails does not stop the next ones.
"""

import json
import os
import sys
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


def run_case(case, tf, np, tf_spectrain):
    """Connects as `case` says; returns what the test checks."""
    if case.get("tf_config") is not None:
        os.environ["TF_CONFIG"] = case["tf_config"]
    cluster = None if case["cluster"] == "TF_CONFIG" else case["cluster"]
    start = time.monotonic()
    try:
        devices = tf_spectrain.connect_cluster(
            cluster, devices_per_worker=case.get("per_worker"),
            timeout=case.get("timeout", 5.0))
    except Exception as error:  # reported to the test, which checks it
        return {"error": type(error).__name__, "message": str(error),
                "elapsed": time.monotonic() - start}
    result = {"devices": devices, "elapsed": time.monotonic() - start,
              "local": tf.config.list_logical_devices()[0].name}
    if case.get("ops"):
        result.update(remote_ops(tf, np))
    return result


def main():
    cases = json.loads(sys.argv[1])

    import numpy as np
    import tensorflow as tf

    import tf_spectrain

    results = {}
    for case in cases:
        try:
            results[case["name"]] = run_case(case, tf, np, tf_spectrain)
        except Exception as error:  # a failure of the case itself (remote_ops, say)
            results[case["name"]] = {"failed": f"{type(error).__name__}: {error}"}
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)  # skip TensorFlow's teardown of a connected context
