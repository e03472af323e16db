"""Which cluster a process belongs to, and its slot in it, from its flags or `TF_CONFIG`.

A worker (`python -m tf_spectrain.app.worker`) needs `--cluster` and `--task`, or a
`TF_CONFIG` that names a worker task (`worker_slot`); the trainer reads `--cluster`, or a
`TF_CONFIG` with no task or the chief's (`trainer_cluster`). Pure Python.
"""

import os

from tf_spectrain.cluster.spec import CHIEF, WORKER, check_task, parse_cluster
from tf_spectrain.cluster.tf_config import config_error, parse_tf_config


def worker_slot(cluster_flag=None, task_flag=None, environ=None):
    """The cluster and task index of a worker process, from its flags or `TF_CONFIG`.

    `--cluster` and `--task` go together; without them `TF_CONFIG` must name a worker task.

    Args:
        cluster_flag: the `--cluster` value, or None.
        task_flag: the `--task` value (an int), or None.
        environ: the environment (default: `os.environ`).

    Returns:
        `(cluster, task)`: a `Cluster` and the index of this worker in it.

    Raises:
        ValueError: if the flags are incomplete, or `TF_CONFIG` is missing, invalid, or does
            not name a worker task.
    """
    if cluster_flag is not None:
        cluster = parse_cluster(cluster_flag)
        if task_flag is None:
            raise ValueError(
                "--task is required with --cluster: the index of this worker's address in "
                f"--cluster (0 to {cluster.num_workers - 1}). Received: --cluster {cluster_flag}"
            )
        return cluster, check_task(cluster, task_flag)
    if task_flag is not None:
        raise ValueError(f"--task needs --cluster (or TF_CONFIG alone, with its task). "
                         f"Received: --task {task_flag} without --cluster")
    text = _environ(environ).get("TF_CONFIG")
    if text is None:
        raise ValueError("A worker needs --cluster h0:p0,h1:p1,... and --task T, or the "
                         "TF_CONFIG environment variable; neither was given.")
    cluster = parse_tf_config(text)
    if cluster.task is None or cluster.task[0] != WORKER:
        role = ("the chief, which is the trainer (train.py), not a worker"
                if cluster.task else "no task")
        raise config_error(
            f"must name a worker task for a worker process ({{\"task\": {{\"type\": "
            f"\"worker\", \"index\": <int>}}}}); it names {role}", text)
    return cluster, cluster.task[1]


def trainer_cluster(cluster_flag=None, environ=None):
    """The cluster as the trainer sees it, from `--cluster` or `TF_CONFIG`.

    Args:
        cluster_flag: the `--cluster` value, or None to read `TF_CONFIG`.
        environ: the environment (default: `os.environ`).

    Returns:
        A `Cluster` (its task None, or `("chief", 0)`), or None when neither is given.

    Raises:
        ValueError: if the value is invalid, or `TF_CONFIG` names a worker task (that
            process would be a worker, not the trainer).
    """
    if cluster_flag is not None:
        return parse_cluster(cluster_flag)
    text = _environ(environ).get("TF_CONFIG")
    if text is None:
        return None
    cluster = parse_tf_config(text)
    if cluster.task is not None and cluster.task[0] != CHIEF:
        raise config_error(
            f"names worker task {cluster.task[1]} for this process, but the trainer is the "
            "chief or holds no slot; start workers with `python -m tf_spectrain.app.worker` and "
            'give the trainer {"task": {"type": "chief", "index": 0}} or no task', text)
    return cluster


def _environ(environ):
    """`environ`, or `os.environ` when it is None."""
    return os.environ if environ is None else environ
