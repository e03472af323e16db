"""Test set-up: split the CPU into 4 logical devices before TensorFlow initialises.

This runs at import time, before any test module creates a TensorFlow op, so every test can
place work on `/CPU:0` .. `/CPU:3`.
"""

import os
import warnings

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tf_spectrain  # noqa: E402

NUM_DEVICES = 4

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    DEVICES = tf_spectrain.setup_devices(NUM_DEVICES)

# Initialise TensorFlow now, with these 4 devices: otherwise the first test to call
# setup_devices(n) itself (train.py in-process with --gpus 3, say) would configure n.
import tensorflow as tf  # noqa: E402

assert len(tf.config.list_logical_devices("CPU")) == NUM_DEVICES


@pytest.fixture(scope="session")
def loopback_run(tmp_path_factory):
    """One trainer child (tests/remote_pipeline_child.py) on two loopback workers of 2 CPU
    devices each, for test_remote_pipeline and test_watchdog: each start of a trainer or a
    worker costs seconds of TensorFlow imports, so one child makes the checks of both.

    In order: the `--mode` pipelines equal local ones (result `equal`), a busy worker under
    a short watchdog deadline (`busy`), then worker 1 stopped and killed (`stop`); also the
    `cluster` string. The workers are killed (by pid) before the result is returned.
    """
    from test_remote_pipeline import _workers, run_child
    from test_watchdog import BUSY_DEADLINE, BUSY_INTERVAL, BUSY_SECONDS

    workers = _workers(tmp_path_factory.mktemp("loopback"))
    cluster, procs = next(workers)
    try:
        result = run_child("--cluster", cluster, "--mode", "sync,spectrain",
                           "--slow", BUSY_SECONDS, "--deadline", BUSY_DEADLINE,
                           "--interval", BUSY_INTERVAL, "--stop", procs[1].pid)
    finally:
        workers.close()  # kills both workers by pid
    return dict(result, cluster=cluster)
