"""Connects the trainer to the workers and checks them: `tf_spectrain.connect_cluster`.

Three checks come before any training:

1. every worker address accepts TCP connections within `timeout` seconds. TensorFlow's
   own start-up waits without end for an address that refuses (its `GetStatus` call at
   cluster initialisation does not fail fast; measured over 200 s), so this is checked
   first, and TensorFlow then connects with `GRPC_FAIL_FAST=true` (its switch that makes
   an unreachable task an `UnavailableError` instead of a wait) unless the variable is set;
2. every worker shows its devices (the stage devices are worker 0's first);
3. every worker runs the trainer's TensorFlow and tf_spectrain versions and was started
   with the same cluster: each publishes a record in a TensorFlow variable that the
   trainer reads with a remote op (`tf_spectrain.cluster.record`).

`tf.config.experimental_connect_to_cluster` reconfigures the process's eager context:
connect at the start of the program, before building models.
"""

import contextlib
import os
import time

import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.cluster import addresses, device_names, health, reach, slots, sockets, spec
from tf_spectrain.cluster import record as record_lib

DEFAULT_TIMEOUT = 5.0
_joined = {"job": None, "address": None}  # the trainer's job and address once connected


def _as_cluster(cluster):
    if cluster is None:
        found = slots.trainer_cluster(None)
        if found is None:
            raise ValueError(
                "`connect_cluster` needs a cluster: pass `cluster='h0:p0,h1:p1'` (or a list "
                "of 'host:port' addresses), or set the TF_CONFIG environment variable. "
                "Received: cluster=None and no TF_CONFIG"
            )
        return found
    return spec.parse_cluster(cluster, name="cluster")


def check_listening(cluster, timeout=DEFAULT_TIMEOUT):
    """Checks that every worker address accepts TCP connections, within `timeout` seconds.

    Args:
        cluster: a `Cluster`.
        timeout: the time all addresses together may take, in seconds.

    Raises:
        ConnectionError: naming the first task and address that does not accept, and why.
    """
    deadline = time.monotonic() + timeout
    for task, address in enumerate(cluster.workers):
        host, port = addresses.split_address(address)
        reason = sockets.wait_until_listening(host, int(port),
                                              max(0.0, deadline - time.monotonic()))
        if reason is not None:
            raise ConnectionError(
                f"Worker {cluster.describe(task)} is not listening: "
                f"{reason} (waited up to {timeout:g} s for all workers). Start it on that "
                f"host with `python -m tf_spectrain.app.worker --cluster {cluster.as_flag()} "
                f"--task {task} --bind-all`, or correct the address."
            )


@contextlib.contextmanager
def _fail_fast():
    # Read by TensorFlow for every RPC it creates (grpc_state.h): set only while connecting.
    if "GRPC_FAIL_FAST" in os.environ:
        yield
        return
    os.environ["GRPC_FAIL_FAST"] = "true"
    try:
        yield
    finally:
        os.environ.pop("GRPC_FAIL_FAST", None)


def _jobs(cluster, trainer_address=None):
    """The jobs of the cluster TensorFlow builds and the trainer's job among them."""
    # The trainer takes the chief's slot when TF_CONFIG gives it that task. Otherwise it
    # joins as TensorFlow's "localhost" job while every worker is on this host's loopback,
    # and as the chief at an address the workers reach when one is elsewhere (`reach`).
    if cluster.task == (spec.CHIEF, 0):
        if trainer_address is not None:
            raise ValueError(
                "`trainer_address` cannot be given when TF_CONFIG makes this process the "
                f"chief: its address is TF_CONFIG's {cluster.chief!r}. Received: "
                f"trainer_address={trainer_address!r}")
        jobs, job = cluster.jobs(), spec.CHIEF
    else:
        jobs, job = {spec.WORKER: list(cluster.workers)}, "localhost"
        address = reach.trainer_address(cluster, trainer_address)
        if address is not None:
            jobs[spec.CHIEF], job = [address], spec.CHIEF
    return jobs, job


def trainer_job():
    """`(job, address)` the trainer joined its cluster as: `("chief", "10.0.0.3:40123")`,
    `("localhost", None)`, or `(None, None)` before `connect_cluster`."""
    return _joined["job"], _joined["address"]


def _connect(cluster, jobs, job):
    try:
        with _fail_fast():
            tf.config.experimental_connect_to_cluster(
                tf.train.ClusterSpec(jobs), job_name=job, task_index=0)
            _joined.update(job=job, address=jobs[job][0] if job in jobs else None)
            return [d.name for d in tf.config.list_logical_devices()]
    except tf.errors.OpError as error:
        first = str(error.message).strip().splitlines()[0] if error.message else ""
        raise ConnectionError(
            f"TensorFlow could not connect to the cluster {cluster.as_flag()} "
            f"({type(error).__name__}: {first}). Check that every worker runs "
            "`python -m tf_spectrain.app.worker` with this cluster."
        ) from error


def check_versions(cluster):
    """Checks every worker's record against the trainer's versions and cluster.

    The trainer must be connected. Every worker is read before raising, so the message
    lists all the workers that differ.

    Args:
        cluster: the `Cluster` the trainer connected to.

    Returns:
        The records, one dict per worker.

    Raises:
        RuntimeError: if a worker is not a tf_spectrain worker, runs other versions, or
            was started with another cluster or task.
    """
    mine = record_lib.local_versions()
    records, problems = [], []
    for task in range(cluster.num_workers):
        try:
            found = record_lib.read_record(task)
        except tf.errors.FailedPreconditionError:
            problems.append(
                f"{cluster.describe(task)} is a TensorFlow server but not a tf_spectrain "
                "worker: it holds no tf_spectrain record (start it with `python -m "
                f"tf_spectrain.app.worker --cluster {cluster.as_flag()} --task {task}`)")
            records.append(None)
            continue
        records.append(found)
        differ = [f"{key} {found.get(key, '?')}" for key in record_lib.VERSION_KEYS
                  if found.get(key) != mine[key]]
        if differ:
            problems.append(f"{cluster.describe(task)} runs {', '.join(differ)}")
        if found.get("task") != str(task) or found.get("cluster") != cluster.as_flag():
            problems.append(
                f"{cluster.describe(task)} was started as task {found.get('task')} of "
                f"--cluster {found.get('cluster')} (restart it with --cluster "
                f"{cluster.as_flag()} --task {task})")
    if problems:
        theirs = ", ".join(f"{key} {mine[key]}" for key in record_lib.VERSION_KEYS)
        raise RuntimeError(
            f"The workers do not match the trainer, which runs {theirs}: "
            + "; ".join(problems)
            + ". Every worker must run the trainer's TensorFlow and tf_spectrain versions "
            "and the trainer's cluster."
        )
    return records


def connect_cluster(cluster=None, *, devices_per_worker=None, timeout=DEFAULT_TIMEOUT,
                    versions=True, trainer_address=None):
    """Connects this process, as the trainer, to the workers of a cluster.

    Every address must run `python -m tf_spectrain.app.worker`. The trainer holds no slot in
    the list: it joins as TensorFlow's `localhost` job while every worker is on this
    host's loopback, else as the `chief` job at an address of this host the workers reach
    (found from the route to them, or `trainer_address`); with a `TF_CONFIG` whose task
    is the chief, it takes the chief's slot. Call this at the start of the program, before models
    are built: it reconfigures TensorFlow's eager context.

    Args:
        cluster: `"h0:p0,h1:p1,..."`, a list of `"host:port"` strings, a
            `tf_spectrain.cluster.Cluster`, or None to read the `TF_CONFIG` variable.
        devices_per_worker: how many devices of each worker to return (GPUs on a worker
            with GPUs, else its CPU devices); None returns all of them.
        timeout: how long to wait for every worker address to accept connections, in
            seconds (a worker just started may need a moment).
        versions: check that every worker runs this process's TensorFlow and tf_spectrain
            versions and was started with this cluster (True unless you know better).
        trainer_address: `"host"` or `"host:port"`, the address of this host the workers
            reach the trainer at (a free port is taken when none is given); None finds it
            from this host's route to the workers.

    Returns:
        The workers' device names in stage order, worker 0's first, such as
        `["/job:worker/replica:0/task:0/device:CPU:0", ...]`: pass them to
        `PipelineModel(model, devices=...)`.

    Raises:
        ValueError, TypeError: if the cluster spec or another argument is invalid, a
            worker has fewer devices than `devices_per_worker`, or the trainer's address
            cannot be chosen (routes to the workers from different addresses: pass
            `trainer_address`).
        ConnectionError: if a worker is not listening, or TensorFlow cannot connect.
        RuntimeError: if a worker runs other versions or was started with another cluster.
    """
    cluster = _as_cluster(cluster)
    if devices_per_worker is not None:
        devices_per_worker = checks.check_int("devices_per_worker", devices_per_worker, 1,
                                              none_ok=True)
    timeout = checks.check_number("timeout", timeout, 0, meaning="seconds")
    jobs, job = _jobs(cluster, trainer_address)
    check_listening(cluster, timeout)
    names = _connect(cluster, jobs, job)
    devices = device_names.stage_devices(names, cluster, devices_per_worker)
    if versions:
        check_versions(cluster)
    health.remember(cluster)
    return devices
