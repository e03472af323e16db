"""Device names of a cluster's workers, and the devices the stages take among them.

A worker's devices are named `/job:worker/replica:0/task:<index>/device:<GPU|CPU>:<k>`.
Pure Python: the names come from a connected cluster (`connect.connect_cluster`).
"""

from tf_spectrain.cluster.spec import WORKER


def worker_device_prefix(index):
    """The device name prefix of worker `index`, e.g. `/job:worker/replica:0/task:1`."""
    return f"/job:{WORKER}/replica:0/task:{index}"


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
