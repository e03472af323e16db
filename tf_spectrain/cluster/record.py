"""A worker's record (its versions, task and cluster), kept in a TensorFlow variable.

The worker writes a small string tensor into a *named* resource variable on its own
`CPU:0`, through its server's in-process master (a `tf.compat.v1.Session` on
`server.target`), before the server starts serving. The trainer reads it with a remote
`ReadVariableOp` placed on that worker's `CPU:0` after connecting: TensorFlow's runtime
carries it, nothing else. A server that is not a tf_spectrain worker has no such variable,
and reading it fails with `FailedPreconditionError`.

Resources are shared between the sessions of a server because TensorFlow's default
`isolate_session_state` is False; a trainer that sets it True cannot see the record.
"""

import tensorflow as tf

from tf_spectrain._version import __version__
from tf_spectrain.cluster import device_names, spec

RECORD_NAME = "tf_spectrain_worker_record"
VERSION_KEYS = ("tensorflow", "tf_spectrain")


def local_versions():
    """The versions this process runs: `{"tensorflow": ..., "tf_spectrain": ...}`."""
    return {"tensorflow": tf.__version__, "tf_spectrain": __version__}


def make_record(cluster, task, versions=None):
    """Builds a worker's record as a dict of strings.

    Args:
        cluster: the worker's `Cluster`.
        task: its task index.
        versions: a dict that replaces entries of `local_versions()` (tests use it to play
            an older worker); None for the real versions.

    Returns:
        A dict with the keys "tensorflow", "tf_spectrain", "task" and "cluster".
    """
    record = dict(local_versions(), **(versions or {}))
    record.update(task=str(task), cluster=cluster.as_flag())
    return record


def _handle():
    # A named (not anonymous) handle: every session of the server finds the same variable.
    return tf.raw_ops.VarHandleOp(dtype=tf.string, shape=tf.TensorShape([None]),
                                  shared_name=RECORD_NAME)


def publish_record(server, cluster, task, record):
    """Writes `record` into the named variable on worker `task`'s `CPU:0`.

    Call it after creating the server and before starting it: the in-process master
    reaches the local devices without serving any request. A device filter keeps the
    session from contacting the other workers, which may not be up.

    Args:
        server: the worker's `tf.distribute.Server`.
        cluster: its `Cluster`.
        task: its task index.
        record: a dict of strings (`make_record`).

    Returns:
        The names of the server's devices, in TensorFlow's order.
    """
    prefix = device_names.worker_device_prefix(task)
    graph = tf.Graph()
    with graph.as_default(), tf.device(f"{prefix}/device:CPU:0"):
        items = tf.constant([f"{key}={value}" for key, value in sorted(record.items())])
        assign = tf.raw_ops.AssignVariableOp(resource=_handle(), value=items)
    config = tf.compat.v1.ConfigProto(device_filters=[f"/job:{spec.WORKER}/task:{task}"])
    with tf.compat.v1.Session(server.target, graph=graph, config=config) as session:
        session.run(assign)
        return [d.name for d in session.list_devices()]


def read_record(task):
    """Reads worker `task`'s record through a remote op (the trainer must be connected).

    Args:
        task: the worker's task index.

    Returns:
        The record as a dict of strings.

    Raises:
        tf.errors.FailedPreconditionError: if that server holds no record (it is not a
            tf_spectrain worker).
        tf.errors.OpError: if the worker cannot be reached.
    """
    with tf.device(f"{device_names.worker_device_prefix(task)}/device:CPU:0"):
        items = tf.raw_ops.ReadVariableOp(resource=_handle(), dtype=tf.string)
    record = {}
    for item in items.numpy():
        key, _, value = item.decode().partition("=")
        record[key] = value
    return record
