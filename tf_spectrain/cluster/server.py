"""Starts the TensorFlow server of one worker (`python -m tf_spectrain.app.worker` runs this).

The server is a `tf.distribute.Server` for the worker's task of the cluster. Its devices
are fixed by its own `ConfigProto`, not by `tf.config` (the process's eager context and the
server have separate devices): `cpu_devices` sets `device_count["CPU"]`, which splits the
CPU into that many devices named `/job:worker/replica:0/task:T/device:CPU:k`; GPUs are all
served, one device each.

TensorFlow 2.21 listens on every interface whatever the host in the address (see
`tf_spectrain.cluster.sockets`). The server is created unstarted, its socket read from
`/proc`, and a wildcard bind is refused unless `bind_all=True`, before it serves anything.
"""

import dataclasses
import os

import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.cluster import addresses, sockets, spec
from tf_spectrain.cluster import record as record_lib


class WildcardBindError(RuntimeError):
    """The server would listen on every interface and `bind_all` was not given."""


@dataclasses.dataclass
class WorkerServer:
    """A started worker server and what it serves.

    Attributes:
        server: the `tf.distribute.Server` (keep a reference: it serves while it lives).
        cluster: the `Cluster`.
        task: this worker's task index.
        devices: the server's device names, in TensorFlow's order.
        listening: the `(host, port)` sockets it listens on, or None when unknown.
        record: the record it publishes (`tf_spectrain.cluster.record`).
    """

    server: object
    cluster: spec.Cluster
    task: int
    devices: list
    listening: list
    record: dict

    @property
    def address(self):
        """The address this worker serves, as listed in the cluster."""
        return self.cluster.workers[self.task]

    def describe(self):
        """The one line a worker prints when it is ready."""
        if self.listening is None:
            bound = "the bound address could not be read"
        else:
            shown = sockets.show_addresses(self.listening)
            every = any(sockets.is_wildcard(h) for h, _ in self.listening)
            bound = f"listening on {shown}" + (": every interface" if every else "")
        return (
            f"tf_spectrain worker: task {self.task} of {self.cluster.num_workers} serves "
            f"{self.address} ({bound}); devices: {', '.join(self.devices)}; TensorFlow "
            f"{self.record['tensorflow']}, tf_spectrain {self.record['tf_spectrain']}"
        )


def server_config(cpu_devices=None):
    """The `ConfigProto` of a worker server.

    Args:
        cpu_devices: split the CPU into this many devices (an int >= 1), or None for
            TensorFlow's one CPU device. The inter-op thread pool then gets at least that
            many threads, as `tf_spectrain.setup_devices` does, so stages can overlap.

    Returns:
        A `tf.compat.v1.ConfigProto`.
    """
    config = tf.compat.v1.ConfigProto()
    if cpu_devices is not None:
        cpu_devices = checks.check_int("--cpu-devices", cpu_devices, 1,
                                       meaning="the number of CPU devices to serve")
        config.device_count["CPU"] = cpu_devices
        if cpu_devices > (os.cpu_count() or 1):
            config.inter_op_parallelism_threads = cpu_devices
    return config


def _wildcard_message(worker, listening):
    address = worker.cluster.workers[worker.task]
    host, port = addresses.split_address(address)
    if listening is None:
        seen = ("its socket could not be read from /proc, and TensorFlow 2.21 binds "
                f"0.0.0.0:{port}")
    else:
        seen = f"it listens on {sockets.show_addresses(listening)}"
    return (
        f"The TensorFlow server of task {worker.task} listens on every interface, not only "
        f"on {host}: {seen} (bound, not serving; the worker stops here). TensorFlow 2.21's "
        "gRPC server binds the port of its address on all interfaces (GrpcServer::Init, "
        "grpc_server_lib.cc) and has no option to bind one host. Anyone who can reach port "
        f"{port} can run any TensorFlow graph in this process. Pass --bind-all "
        "(`bind_all=True`) to accept this, on a trusted network or behind a firewall that "
        f"lets only the cluster's hosts reach port {port}."
    )


def start_worker(cluster, task, *, cpu_devices=None, bind_all=False, versions=None):
    """Creates, checks and starts the server of worker `task`.

    Args:
        cluster: a `Cluster` (or a `--cluster` string or list of addresses).
        task: this worker's index in it.
        cpu_devices: split the CPU into this many devices (None: one).
        bind_all: accept a server that listens on every interface (TensorFlow 2.21's
            servers always do).
        versions: overrides of the published versions (tests play an older worker).

    Returns:
        A started `WorkerServer`.

    Raises:
        WildcardBindError: if the server listens on a wildcard address (or it cannot be
            told) and `bind_all` is False. The socket stays bound, unserved, until the
            process exits: a worker process should exit on this error.
        tf.errors.OpError: if TensorFlow cannot create the server (port in use, say).
    """
    cluster = spec.parse_cluster(cluster)
    task = spec.check_task(cluster, task)
    config = server_config(cpu_devices)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster.jobs()), job_name=spec.WORKER,
                                  task_index=task, config=config, start=False)
    _, port = addresses.split_address(cluster.workers[task])
    listening = sockets.listening_addresses(port=int(port))
    worker = WorkerServer(server=server, cluster=cluster, task=task, devices=[],
                          listening=listening, record=record_lib.make_record(cluster, task,
                                                                             versions))
    wildcard = listening is None or any(sockets.is_wildcard(h) for h, _ in listening)
    if wildcard and not bind_all:
        raise WildcardBindError(_wildcard_message(worker, listening))
    worker.devices = record_lib.publish_record(server, cluster, task, worker.record)
    server.start()
    return worker
