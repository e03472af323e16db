"""Test set-up: split the CPU into 4 logical devices before TensorFlow initialises.

This runs at import time, before any test module creates a TensorFlow op, so every test can
place work on `/CPU:0` .. `/CPU:3`.
"""

import os
import warnings

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
