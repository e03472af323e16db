"""Test set-up: split the CPU into 4 logical devices before TensorFlow initialises.

This runs at import time, before any test module creates a TensorFlow op, so every test can
place work on `/CPU:0` .. `/CPU:3`.
"""

import json
import os
import subprocess
import sys
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


class KerasOnly:
    """The `keras_only` fixture's child process (tests/keras_only_child.py)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.count = 0
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "keras_only_child.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env, cwd=tmp_path)

    def _answer(self):
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(f"the Keras-only process ended (exit code {self.process.wait()})")

    def predict(self, model_path, x):
        """Loads `model_path` in the child and returns its predictions for `x`; fails the
        test if the load or predict fails or the child holds any tf_spectrain module."""
        import numpy as np

        self.count += 1
        x_path = self.tmp_path / f"x{self.count}.npy"
        out_path = self.tmp_path / f"out{self.count}.npy"
        np.save(x_path, x)
        request = {"model": str(model_path), "x": str(x_path), "out": str(out_path)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        assert "error" not in answer, answer.get("error")
        assert answer["tf_spectrain"] == [], "the child imported tf_spectrain"
        return np.load(out_path)


@pytest.fixture(scope="session")
def keras_only(tmp_path_factory):
    """A Python process that imports Keras but never tf_spectrain, shared by the tests that
    check that a saved model loads without tf_spectrain (each fresh process costs seconds of
    TensorFlow imports): `keras_only.predict(path, x)`. Ended (by pid) after the session."""
    loader = KerasOnly(tmp_path_factory.mktemp("keras_only"))
    try:
        ready = loader._answer()
        assert ready == {"ready": True}, ready
        yield loader
    finally:
        loader.process.stdin.close()
        try:
            loader.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(loader.process.pid, 9)
            loader.process.wait()
