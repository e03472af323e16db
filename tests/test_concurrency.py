"""The stages of a pipeline really run at once: each stage's layer waits inside its pass for
the other stage's, and the two must meet.

A stage whose passes only start once the other stage's have ended can never be inside its
layer while the other is, whatever the machine's load; stages that run at once meet within
the first passes of a fit (each waits up to `WAIT` seconds for the other). So this checks
overlap without timing anything: pass by pass (a thread per stage) and in windows (one
graph per window, whose ops TensorFlow runs as their inputs arrive). A lock around every
pass stands in for a runtime that runs the stages one at a time, and must be caught.

How many cores the overlapping stages use is a timing figure, measured in
`benchmarks/overlap.py` (CPU/wall beside images/s).
"""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import DEVICES
from runtimes import EAGER, compile_quietly

import tf_spectrain
from tf_spectrain.runtime.stage import StageRunner

WAIT = 1.0  # seconds a stage's layer waits for the other's (the first pass always does)


class Meeting:
    """Where the two stages' layers meet: `met` is set once both are inside at once."""

    def __init__(self, wait):
        self.wait = wait
        self.inside = set()
        self.entries = 0
        self.lock = threading.Lock()
        self.met = threading.Event()

    def enter(self, k):
        """Stage k's layer: inside until the other stage comes in too, or `wait` passes."""
        with self.lock:
            self.entries += 1
            self.inside.add(k)
            if len(self.inside) == 2:
                self.met.set()
        self.met.wait(self.wait)
        with self.lock:
            self.inside.discard(k)
        return np.float32(0.0)


MEETINGS = {}  # name -> Meeting: a layer's config names its meeting (stages copy layers)


class Meet(keras.layers.Layer):
    """Passes its input (and its gradient) on; `Meeting.enter` of its stage runs in each of
    its forward and backward passes, inside the graph."""

    def __init__(self, meeting, stage, **kwargs):
        super().__init__(**kwargs)
        self.meeting, self.stage = meeting, stage

    def get_config(self):
        return {**super().get_config(), "meeting": self.meeting, "stage": self.stage}

    def call(self, x):
        meeting, stage = MEETINGS[self.meeting], self.stage

        def enter(t):  # in the forward and in the backward
            waited = tf.numpy_function(lambda _: meeting.enter(stage), [t], tf.float32,
                                       stateful=False)
            return tf.ensure_shape(waited, ())

        @tf.custom_gradient
        def through(x):
            return x + enter(x), lambda dy: dy + enter(dy)

        return through(x)

    def compute_output_shape(self, input_shape):
        return input_shape


def _fit(meeting, mode, steps_per_execution, batches=3):
    MEETINGS.clear()
    MEETINGS["m"] = meeting
    keras.utils.set_random_seed(0)
    x = inp = keras.Input((8,))
    x = keras.layers.Dense(16, activation="relu", name="dense0")(x)
    x = Meet("m", 0, name="meet0")(x)
    x = Meet("m", 1, name="meet1")(x)
    model = keras.Model(inp, keras.layers.Dense(4, name="logits")(x))
    pipe = tf_spectrain.PipelineModel(model, cuts=["meet0"], devices=DEVICES[:2], mode=mode)
    compile_quietly(pipe, tf_spectrain.SpecTrainSGD(0.01, momentum=0.9),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=steps_per_execution)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * batches, 8)).astype("float32")
    y = rng.integers(0, 4, len(x))
    pipe.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)


@pytest.mark.parametrize("steps_per_execution", [EAGER, 8])
@pytest.mark.parametrize("mode", ["spectrain", "stash"])
def test_two_stages_are_inside_their_passes_at_once(mode, steps_per_execution):
    meeting = Meeting(WAIT)
    _fit(meeting, mode, steps_per_execution)
    assert meeting.met.is_set(), f"{meeting.entries} passes, never both stages at once"


def test_stages_that_take_turns_are_caught(monkeypatch):
    lock = threading.Lock()
    for name in ("forward", "backward", "update"):
        original = getattr(StageRunner, name)

        def locked(self, *args, _original=original, **kwargs):
            with lock:
                return _original(self, *args, **kwargs)

        monkeypatch.setattr(StageRunner, name, locked)
    meeting = Meeting(0.3)  # each pass waits it out alone: keep the fit short
    _fit(meeting, "stash", EAGER, batches=2)
    assert meeting.entries >= 4  # every forward of both stages came in, and waited
    assert not meeting.met.is_set()
