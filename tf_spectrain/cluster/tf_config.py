"""The `TF_CONFIG` environment variable, parsed into a `Cluster` (pure Python).

`TF_CONFIG` is the convention of tf.distribute and of Kubernetes TFJob operators::

    {"cluster": {"worker": ["h0:2222", "h1:2222"], "chief": ["h2:2222"]},
     "task": {"type": "worker", "index": 1}}

Only the jobs `worker` and `chief` (the trainer) are accepted.
"""

import json

from tf_spectrain import checks
from tf_spectrain.cluster.addresses import check_addresses
from tf_spectrain.cluster.spec import CHIEF, WORKER, Cluster
from tf_spectrain.messages import did_you_mean

# Keys of TF_CONFIG that tf.distribute's resolvers read; tf_spectrain uses "cluster" and
# "task" and accepts the others so that a TFJob's TF_CONFIG works unchanged.
_TF_CONFIG_KEYS = ("cluster", "task", "rpc_layer", "environment", "session_master",
                   "eval_session_master")


def config_error(message, text):
    """A ValueError that says what is wrong with `TF_CONFIG` (`text`) and shows it."""
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
        raise config_error(f"must be JSON text; it cannot be parsed ({error})", text) from None
    if not isinstance(config, dict):
        raise config_error(
            'must be a JSON object such as {"cluster": {"worker": ["h0:2222"]}, "task": '
            f'{{"type": "worker", "index": 0}}}}, not a {type(config).__name__}', text)
    for key in config:
        if key not in _TF_CONFIG_KEYS:
            raise config_error(
                f"may only have the keys {list(_TF_CONFIG_KEYS)}; it has {key!r}"
                f"{did_you_mean(key, _TF_CONFIG_KEYS)}", text)
    rpc_layer = config.get("rpc_layer", "grpc")
    if rpc_layer not in ("grpc", None, ""):
        raise config_error(f"rpc_layer must be 'grpc' (the only one tf_spectrain uses); "
                            f"it is {rpc_layer!r}", text)
    jobs = config.get("cluster")
    if not isinstance(jobs, dict):
        raise config_error('must have a "cluster" object with a "worker" list, such as '
                            '{"worker": ["h0:2222", "h1:2222"]}', text)
    for job in jobs:
        if job not in (WORKER, CHIEF):
            raise config_error(
                f"cluster may only hold the jobs 'worker' and 'chief' (the trainer); it has "
                f"{job!r}{did_you_mean(job, (WORKER, CHIEF))} (tf_spectrain has no parameter "
                "servers or evaluators)", text)
    workers = jobs.get(WORKER)
    if not isinstance(workers, list) or not workers:
        raise config_error(
            "cluster.worker must be a non-empty list of 'host:port' addresses, task 0 first; "
            f"it is {checks.show(workers)}", text)
    chief = jobs.get(CHIEF)
    if chief is not None and (not isinstance(chief, list) or len(chief) != 1):
        raise config_error(
            "cluster.chief must be a list of exactly one 'host:port' address (the trainer); "
            f"it is {checks.show(chief)}", text)
    addresses = check_addresses("TF_CONFIG", workers + (chief or []), text)
    workers, chief = addresses[: len(workers)], (addresses[-1] if chief else None)
    task = _parse_task(config.get("task"), len(workers), chief is not None, text)
    return Cluster(workers=workers, chief=chief, task=task, source="TF_CONFIG")


def _parse_task(task, num_workers, has_chief, text):
    """`TF_CONFIG`'s `"task"` as `(type, index)`, or None when it names no task."""
    if task is None or task == {}:
        return None
    if not isinstance(task, dict) or set(task) - {"type", "index"} or "type" not in task:
        raise config_error(
            'task must be an object {"type": "worker" or "chief", "index": <int>}; it is '
            f"{checks.show(task)}", text)
    kind, index = task["type"], task.get("index", 0)
    if kind not in (WORKER, CHIEF):
        raise config_error(f"task.type must be 'worker' or 'chief'; it is {kind!r}"
                            f"{did_you_mean(kind, (WORKER, CHIEF))}", text)
    if kind == CHIEF and not has_chief:
        raise config_error("task.type is 'chief' but cluster has no 'chief' job", text)
    count = num_workers if kind == WORKER else 1
    if not checks.is_int(index) or not 0 <= index < count:
        raise config_error(
            f"task.index must be an integer in [0, {count - 1}] (cluster.{kind} lists {count} "
            f"address(es)); it is {checks.show(index)}", text)
    return (kind, int(index))
