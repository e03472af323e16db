"""Cluster specs: `--cluster h0:p0,h1:p1,...` and the `TF_CONFIG` variable (pure Python).

A cluster is a list of worker addresses, task 0 first. Every address is a worker
(`python -m tf_spectrain.app.worker`); the trainer is a separate client that holds no slot, or,
with `TF_CONFIG`, the single `chief` task. `TF_CONFIG` is the convention of tf.distribute
and of Kubernetes TFJob operators::

    {"cluster": {"worker": ["h0:2222", "h1:2222"], "chief": ["h2:2222"]},
     "task": {"type": "worker", "index": 1}}

Addresses are compared as written (host names in lower case): `localhost:5000` and
`127.0.0.1:5000` are different addresses here, since telling that they are the same host
needs name resolution. No TensorFlow import: the errors come before anything starts.
"""

import dataclasses
import json
import os

from tf_spectrain import checks
from tf_spectrain.messages import did_you_mean

WORKER = "worker"
CHIEF = "chief"

MAX_PORT = 65535

# Keys of TF_CONFIG that tf.distribute's resolvers read; tf_spectrain uses "cluster" and
# "task" and accepts the others so that a TFJob's TF_CONFIG works unchanged.
_TF_CONFIG_KEYS = ("cluster", "task", "rpc_layer", "environment", "session_master",
                   "eval_session_master")

_ADDRESS_RULE = (
    "host:port, with a non-empty host (an IPv6 address in brackets, as in [::1]:2222) and "
    f"a port that is an integer in [1, {MAX_PORT}]"
)


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


def worker_device_prefix(index):
    """The device name prefix of worker `index`: `/job:worker/replica:0/task:<index>`.

    Args:
        index: the worker's task index.

    Returns:
        The prefix string; a device name follows it, e.g. `/device:CPU:0`.
    """
    return f"/job:{WORKER}/replica:0/task:{index}"


def split_address(address):
    """Splits a `"host:port"` string into its host and port (no checks).

    Args:
        address: the address; an IPv6 host is written in brackets (`"[::1]:2222"`).

    Returns:
        `(host, port_text)`; `port_text` is None when there is no colon.
    """
    host, colon, port = address.rpartition(":")
    if not colon:
        return address, None
    return host, port


def _address_problem(address):
    """What is wrong with one address, or None when it is valid."""
    if not address:
        return "an empty address"
    host, port = split_address(address)
    if port is None:
        return f"{address!r} has no port"
    if not host:
        return f"{address!r} has an empty host"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not bare or (":" in host and bare == host) or any(c in bare for c in "[] /"):
        return f"{address!r} has an invalid host {host!r}"
    if not port.isdigit():
        return f"{address!r} has a port {port!r} that is not an integer"
    if not 1 <= int(port) <= MAX_PORT:
        return f"{address!r} has a port {port} out of range"
    return None


def normalize_address(address):
    """The canonical form of a valid address: host in lower case, port without zeros.

    Args:
        address: a valid `"host:port"` string.

    Returns:
        The address written as `host:port`.
    """
    host, port = split_address(address)
    return f"{host.lower()}:{int(port)}"


def check_addresses(name, addresses, shown):
    """Checks a list of worker addresses: each valid, none repeated, at least one.

    Args:
        name: the flag or argument, for messages (`"--cluster"`, `"TF_CONFIG"`).
        addresses: the list of address strings.
        shown: the value as the user gave it, for the "Received:" part.

    Returns:
        A tuple of normalised addresses.

    Raises:
        ValueError: if the list is empty, an address is malformed, or one is repeated.
    """
    rule = f"a comma-separated list of worker addresses, each {_ADDRESS_RULE}"
    if not addresses:
        raise ValueError(f"{_label(name)} must be {rule}; it lists no address. "
                         f"{checks.received(name, shown)}")
    result = []
    for index, address in enumerate(addresses):
        text = address.strip() if isinstance(address, str) else address
        if not isinstance(text, str):
            raise TypeError(
                f"{_label(name)} must list addresses as strings; task {index} is "
                f"{checks.show(address)} of type {type(address).__name__}. "
                f"{checks.received(name, shown)}"
            )
        problem = _address_problem(text)
        if problem:
            raise ValueError(f"{_label(name)} must be {rule}; task {index} is {problem}. "
                             f"{checks.received(name, shown)}")
        normal = normalize_address(text)
        if normal in result:
            first = result.index(normal)
            raise ValueError(
                f"{_label(name)} must list each worker once; tasks {first} and {index} are "
                f"both {normal!r} (each worker needs its own host:port). "
                f"{checks.received(name, shown)}"
            )
        result.append(normal)
    return tuple(result)


def _label(name):
    return name if name.startswith("--") or name == "TF_CONFIG" else f"`{name}`"


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
            f"{_label(name)} must be a string 'host:port,host:port,...' or a list of "
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


def _config_error(message, text):
    return ValueError(f"TF_CONFIG {message}. {checks.received('TF_CONFIG', text)}")


def parse_tf_config(text):
    """Parses the `TF_CONFIG` environment variable's value into a `Cluster`.

    Only the jobs `"worker"` (a non-empty list) and `"chief"` (a list of one address: the
    trainer) are accepted; `"task"` is optional, with `"type"` one of them and `"index"` an
    integer in range.

    Args:
        text: the JSON text.

    Returns:
        A `Cluster` with `source="TF_CONFIG"`, its `task` from `"task"` (or None).

    Raises:
        ValueError: if the text is not JSON, or its structure or an address is invalid.
    """
    if not isinstance(text, str):
        checks.check_instance("TF_CONFIG", text, str)
    try:
        config = json.loads(text)
    except ValueError as error:
        raise _config_error(f"must be JSON text; it cannot be parsed ({error})", text) from None
    if not isinstance(config, dict):
        raise _config_error(
            'must be a JSON object such as {"cluster": {"worker": ["h0:2222"]}, "task": '
            f'{{"type": "worker", "index": 0}}}}, not a {type(config).__name__}', text)
    for key in config:
        if key not in _TF_CONFIG_KEYS:
            raise _config_error(
                f"may only have the keys {list(_TF_CONFIG_KEYS)}; it has {key!r}"
                f"{did_you_mean(key, _TF_CONFIG_KEYS)}", text)
    rpc_layer = config.get("rpc_layer", "grpc")
    if rpc_layer not in ("grpc", None, ""):
        raise _config_error(f"rpc_layer must be 'grpc' (the only one tf_spectrain uses); "
                            f"it is {rpc_layer!r}", text)
    jobs = config.get("cluster")
    if not isinstance(jobs, dict):
        raise _config_error('must have a "cluster" object with a "worker" list, such as '
                            '{"worker": ["h0:2222", "h1:2222"]}', text)
    for job in jobs:
        if job not in (WORKER, CHIEF):
            raise _config_error(
                f"cluster may only hold the jobs 'worker' and 'chief' (the trainer); it has "
                f"{job!r}{did_you_mean(job, (WORKER, CHIEF))} (tf_spectrain has no parameter "
                "servers or evaluators)", text)
    workers = jobs.get(WORKER)
    if not isinstance(workers, list) or not workers:
        raise _config_error(
            "cluster.worker must be a non-empty list of 'host:port' addresses, task 0 first; "
            f"it is {checks.show(workers)}", text)
    chief = jobs.get(CHIEF)
    if chief is not None and (not isinstance(chief, list) or len(chief) != 1):
        raise _config_error(
            "cluster.chief must be a list of exactly one 'host:port' address (the trainer); "
            f"it is {checks.show(chief)}", text)
    addresses = check_addresses("TF_CONFIG", workers + (chief or []), text)
    workers, chief = addresses[: len(workers)], (addresses[-1] if chief else None)
    task = _parse_task(config.get("task"), len(workers), chief is not None, text)
    return Cluster(workers=workers, chief=chief, task=task, source="TF_CONFIG")


def _parse_task(task, num_workers, has_chief, text):
    if task is None or task == {}:
        return None
    if not isinstance(task, dict) or set(task) - {"type", "index"} or "type" not in task:
        raise _config_error(
            'task must be an object {"type": "worker" or "chief", "index": <int>}; it is '
            f"{checks.show(task)}", text)
    kind, index = task["type"], task.get("index", 0)
    if kind not in (WORKER, CHIEF):
        raise _config_error(f"task.type must be 'worker' or 'chief'; it is {kind!r}"
                            f"{did_you_mean(kind, (WORKER, CHIEF))}", text)
    if kind == CHIEF and not has_chief:
        raise _config_error("task.type is 'chief' but cluster has no 'chief' job", text)
    count = num_workers if kind == WORKER else 1
    if not checks.is_int(index) or not 0 <= index < count:
        raise _config_error(
            f"task.index must be an integer in [0, {count - 1}] (cluster.{kind} lists {count} "
            f"address(es)); it is {checks.show(index)}", text)
    return (kind, int(index))


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
        raise _config_error(
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
        raise _config_error(
            f"names worker task {cluster.task[1]} for this process, but the trainer is the "
            "chief or holds no slot; start workers with `python -m tf_spectrain.app.worker` and "
            'give the trainer {"task": {"type": "chief", "index": 0}} or no task', text)
    return cluster


def _environ(environ):
    return os.environ if environ is None else environ


_KINDS = ("GPU", "CPU")


def _parse_device(name):
    """`(task, kind, index)` of a worker device name, or None for any other name."""
    prefix = f"/job:{WORKER}/replica:0/task:"
    if not name.startswith(prefix):
        return None
    task, sep, device = name[len(prefix):].partition("/device:")
    kind, _, index = device.partition(":")
    if not sep or not task.isdigit() or kind not in _KINDS or not index.isdigit():
        return None
    return int(task), kind, int(index)


def stage_devices(names, cluster, per_worker=None):
    """Picks the devices stages use from a connected cluster's device names (pure).

    Worker 0's devices come first, then worker 1's, and so on. A worker with GPUs offers
    its GPUs; a worker without offers its CPU devices (as many as its `--cpu-devices`).

    Args:
        names: device names as `tf.config.list_logical_devices()` gives them, such as
            `"/job:worker/replica:0/task:1/device:CPU:0"`; other jobs' names are ignored.
        cluster: the `Cluster`.
        per_worker: take exactly this many devices of each worker (None: all of them).

    Returns:
        A list of device names, `num_workers * per_worker` long when `per_worker` is set.

    Raises:
        ValueError: if a worker shows no device, or fewer than `per_worker`.
    """
    found = {}
    for name in names:
        parsed = _parse_device(name)
        if parsed is not None:
            task, kind, index = parsed
            found.setdefault(task, {}).setdefault(kind, []).append((index, name))
    result = []
    for task in range(cluster.num_workers):
        kinds = found.get(task, {})
        kind = "GPU" if kinds.get("GPU") else "CPU"
        devices = [name for _, name in sorted(kinds.get(kind, []))]
        if not devices:
            raise ValueError(
                f"Worker {cluster.describe(task)} shows no device after connecting (the "
                f"devices seen are {list(names)}). Check that it runs "
                "`python -m tf_spectrain.app.worker` with this --cluster."
            )
        if per_worker is not None:
            if len(devices) < per_worker:
                hint = (f"start it with --cpu-devices {per_worker}" if kind == "CPU"
                        else f"it has only {len(devices)} GPU(s)")
                raise ValueError(
                    f"Worker {cluster.describe(task)} has {len(devices)} {kind} device(s) "
                    f"({devices}), fewer than the {per_worker} per worker asked for: {hint}."
                )
            devices = devices[:per_worker]
        result += devices
    return result
