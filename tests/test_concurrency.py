"""The stages of a pipeline really run at once: CPU time against wall time in a subprocess.

Each stage's thread can use one core (one intra-op thread per op, two logical devices on
two cores), so a 2-stage fit whose stages overlap uses clearly more than one core, and one
whose stages take turns uses one. The fits run in a child process (TensorFlow's thread
settings are fixed when it starts), one child for both measurements. A lock around every
pass stands in for a runtime that runs the stages one at a time, and must be caught.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.exclusive  # it measures how many cores two stages use

CHILD = Path(__file__).with_name("concurrency_child.py")
ROOT = CHILD.parent.parent
# Measured here: 1.75-1.77 cores for stash and paper SpecTrain, 1.32-1.33 with the stages
# taking turns (independent ops inside one pass still run side by side on the two
# inter-op threads, so not 1.0).
OVERLAPPED = 1.55  # stages that run at once use more than this many cores
MARGIN = 0.2  # ... and this many more than the same pipeline with its stages taking turns

needs_two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores to show overlap"
)


@pytest.fixture(scope="module")
def measured():
    """CPU/wall of a spectrain pipeline's fit (`free`) and of the same model as a stash
    pipeline with a lock that lets one stage compute at a time (`taking_turns`).

    One child measures both (a TensorFlow start costs more than a measurement): the
    thread settings are the same for both."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run(
        [sys.executable, str(CHILD), "--mode", "spectrain", "--serialised-mode", "stash"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    print(record)
    return record["free"]["cores"], record["taking_turns"]["cores"], record["windows"]["cores"]


@needs_two_cores
def test_two_stages_use_more_than_one_core(measured):
    used, taking_turns, _ = measured  # spectrain: stash runs the same threads, fewer passes
    assert used > OVERLAPPED
    assert used > taking_turns + MARGIN


@needs_two_cores
def test_two_stages_in_one_window_graph_use_more_than_one_core(measured):
    # Windows of 8 mini-batches: one graph per window, whose ops TensorFlow runs on their
    # devices as their inputs arrive; the stages overlap without a thread each.
    _, taking_turns, windows = measured
    assert windows > OVERLAPPED
    assert windows > taking_turns + MARGIN


@needs_two_cores
def test_stages_that_take_turns_are_caught(measured):
    _, taking_turns, _ = measured
    assert taking_turns < OVERLAPPED
