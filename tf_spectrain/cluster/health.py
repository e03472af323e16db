"""Which workers are gone, said in the terms of the pipeline: `note_lost_workers`.

When a stage's remote op fails with `UnavailableError` (a worker process died; TensorFlow
reports it within a fraction of a second), the training loop asks which workers of the
connected cluster no longer accept connections and names each with its address and the
stages it held.
"""

import re

import tensorflow as tf

from tf_spectrain.cluster import addresses, sockets

_TASK = re.compile(r"/job:worker/replica:\d+/task:(\d+)")
_NOTE_START = "(tf_spectrain: worker "
_CONNECTED = []  # the Cluster of the last connect_cluster call of this process


def remember(cluster):
    """Records the cluster this process connected to (`connect_cluster` calls it)."""
    _CONNECTED[:] = [cluster]


def connected_cluster():
    """The `Cluster` of this process' last `connect_cluster`, or None."""
    return _CONNECTED[0] if _CONNECTED else None


def task_of(device):
    """The worker task index in a device name (`/job:worker/replica:0/task:1/...`), or None."""
    found = _TASK.search(device or "")
    return int(found.group(1)) if found else None


def held_stages(devices, num_workers):
    """Which stages each worker holds.

    Args:
        devices: the stages' device names, stage 0 first.
        num_workers: the cluster's number of workers (devices of other tasks are ignored).

    Returns:
        A dict `{task: [stage, ...]}` of the workers holding at least one stage; empty
        when every stage is local.
    """
    held = {}
    for k, device in enumerate(devices):
        task = task_of(device)
        if task is not None and task < num_workers:
            held.setdefault(task, []).append(k)
    return held


def name_stages(stages, num_stages=None):
    """`"stage 2"`, `"stages 2 and 3"` or `"stages 1, 2 and 3"`.

    Args:
        stages: positions in the list of stage devices.
        num_stages: the stages of one replica, for a replicated pipeline (whose device list
            holds replica r's stage k at `r * num_stages + k`); None for one pipeline.
    """
    stages = list(stages)
    if num_stages is not None and max(stages) >= num_stages:
        by_replica = {}
        for p in stages:
            by_replica.setdefault(p // num_stages, []).append(p % num_stages)
        return _and([f"{name_stages(ks)} of replica {r}" for r, ks in by_replica.items()])
    if len(stages) == 1:
        return f"stage {stages[0]}"
    return "stages " + _and([str(k) for k in stages])


def _and(words):
    """`"a"`, `"a and b"`, `"a, b and c"`."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" and {words[-1]}"


def lost_workers_note(devices, cluster=None, timeout=1.0, num_stages=None):
    """Names the workers, among those holding stages, that no longer accept connections.

    Args:
        devices: the stages' device names, stage 0 first.
        cluster: the `Cluster`; None for this process' connected cluster.
        timeout: seconds to try each worker's address.
        num_stages: the stages of one replica, when `devices` are those of every replica.

    Returns:
        A note such as `"(tf_spectrain: worker task 1 (127.0.0.1:2223), which held stages
        2 and 3, no longer accepts connections: connection refused)"`, or None when no
        worker holds a stage or every one still answers.
    """
    cluster = connected_cluster() if cluster is None else cluster
    if cluster is None:
        return None
    lost = []
    for task, stages in sorted(held_stages(devices, cluster.num_workers).items()):
        host, port = addresses.split_address(cluster.workers[task])
        reason = sockets.wait_until_listening(host, int(port), timeout)
        if reason is not None:
            held = name_stages(stages, num_stages)
            lost.append(f"worker {cluster.describe(task)}, which held {held}, no longer "
                        f"accepts connections: {reason}")
    if not lost:
        return None
    return ("(tf_spectrain: " + "; ".join(lost) + ". Restart the worker and resume from "
            "the last checkpoint: train.py --resume, or restore_checkpoint.)")


def note_lost_workers(error, devices, num_stages=None):
    """Adds `lost_workers_note` to `error` (once), if a worker holding stages is gone.

    Args:
        error: the exception that ended training.
        devices: the stages' device names (of every replica, with `num_stages`).
        num_stages: the stages of one replica, for a replicated pipeline.

    Returns:
        True if a worker is lost (or `error` says so itself: an `UnavailableError`), in
        which case the stages' weights can no longer be read back.
    """
    if any(str(n).startswith(_NOTE_START) for n in getattr(error, "__notes__", ())):
        return True
    note = lost_workers_note(devices, num_stages=num_stages)
    if note is not None and hasattr(error, "add_note"):
        error.add_note(note)
    return note is not None or isinstance(error, tf.errors.UnavailableError)
