"""Cluster specs: the `Cluster`, the `--cluster h0:p0,h1:p1,...` flag and `--task` (pure Python).

A cluster is a list of worker addresses, task 0 first. Every address is a worker
(`python -m tf_spectrain.app.worker`); the trainer is a separate client that holds no slot, or,
with `TF_CONFIG`, the single `chief` task. `TF_CONFIG` is the convention of tf.distribute
and of Kubernetes TFJob operators::

    {"cluster": {"worker": ["h0:2222", "h1:2222"], "chief": ["h2:2222"]},
     "task": {"type": "worker", "index": 1}}

Beside this module: `addresses` (the `host:port` rule), `tf_config` (`TF_CONFIG`), `slots`
(the cluster and slot a worker or the trainer takes from its flags or `TF_CONFIG`) and
`device_names` (the stages' devices among a connected cluster's). No TensorFlow import:
the errors come before anything starts.
"""

import dataclasses

from tf_spectrain import checks
from tf_spectrain.cluster.addresses import check_addresses, label

WORKER = "worker"
CHIEF = "chief"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where the workers are, and which slot (if any) this process holds.

    Attributes:
        workers: the worker addresses `"host:port"`, task 0 first.
        chief: the chief's address when `TF_CONFIG` names one, else None.
        task: this process's slot as `(type, index)`, e.g. `("worker", 1)` or
            `("chief", 0)`; None for a trainer that holds no slot.
        source: where the spec came from (`"--cluster"` or `"TF_CONFIG"`), for messages.
    """

    workers: tuple
    chief: str = None
    task: tuple = None
    source: str = "--cluster"

    @property
    def num_workers(self):
        """The number of workers."""
        return len(self.workers)

    def jobs(self):
        """The jobs as a dict for `tf.train.ClusterSpec`: `{"worker": [...], "chief": [...]}`.

        Returns:
            A dict from job name to a list of addresses (no `"chief"` key without a chief).
        """
        jobs = {WORKER: list(self.workers)}
        if self.chief is not None:
            jobs[CHIEF] = [self.chief]
        return jobs

    def as_flag(self):
        """The workers as a `--cluster` value: `"h0:p0,h1:p1"`."""
        return ",".join(self.workers)

    def describe(self, index):
        """Names worker `index` for messages: `"task 1 (h1:2222)"`."""
        return f"task {index} ({self.workers[index]})"


def parse_cluster(value, name="--cluster"):
    """Parses a `--cluster` value, or a list of addresses, into a `Cluster`.

    The trainer holds no slot in such a cluster: `task` is None.

    Args:
        value: `"h0:p0,h1:p1,..."` (spaces around commas are ignored), or a list or tuple of
            `"host:port"` strings, or a `Cluster` (returned as it is).
        name: the flag or argument, for messages.

    Returns:
        A `Cluster` of the workers, in order.

    Raises:
        TypeError: if `value` is neither a string nor a list of strings.
        ValueError: if an address is malformed or repeated, or none is given.
    """
    if isinstance(value, Cluster):
        return value
    if isinstance(value, str):
        addresses = [] if not value.strip() else value.split(",")
    elif isinstance(value, (list, tuple)):
        addresses = list(value)
    else:
        raise TypeError(
            f"{label(name)} must be a string 'host:port,host:port,...' or a list of "
            f"'host:port' strings. {checks.received(name, value)} of type "
            f"{type(value).__name__}"
        )
    return Cluster(workers=check_addresses(name, addresses, value), source=name)


def check_task(cluster, task, name="--task"):
    """Checks a worker task index against a cluster.

    Args:
        cluster: a `Cluster`.
        task: the index of a worker in it.
        name: the flag or argument, for messages.

    Returns:
        `task` as an int.

    Raises:
        TypeError, ValueError: if `task` is not an integer in `[0, num_workers - 1]`.
    """
    n = cluster.num_workers
    return checks.check_int(
        name, task, 0, n - 1,
        meaning=f"the index of this worker's address in {cluster.source}, which lists {n} "
                f"worker(s): {cluster.as_flag()}",
    )
