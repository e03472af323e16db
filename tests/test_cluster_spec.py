"""tf_spectrain.cluster.spec, addresses, tf_config, slots, device_names and sockets: tables of
good and bad cluster specs.

Pure Python: no TensorFlow op runs and no socket opens here (tests/test_worker.py starts
real workers).
"""

import json

import pytest

from tf_spectrain.cluster import device_names, slots, sockets, spec, tf_config

A, B, C = "127.0.0.1:5000", "127.0.0.1:5001", "10.0.0.2:5000"


@pytest.mark.parametrize("value, workers", [
    (f"{A},{B}", (A, B)),
    (f" {A} , {B} ", (A, B)),                      # spaces around commas
    ([A, B, C], (A, B, C)),
    ((A,), (A,)),
    ("Host-1.Example.COM:2222", ("host-1.example.com:2222",)),
    ("h:02222", ("h:2222",)),                      # the port is a number
    ("[::1]:5000,[fe80::1]:5000", ("[::1]:5000", "[fe80::1]:5000")),
    ("h:1,h:65535", ("h:1", "h:65535")),
])
def test_valid_clusters(value, workers):
    cluster = spec.parse_cluster(value)
    assert cluster.workers == workers
    assert (cluster.chief, cluster.task, cluster.source) == (None, None, "--cluster")
    assert cluster.jobs() == {"worker": list(workers)}
    assert spec.parse_cluster(cluster.as_flag()) == cluster


@pytest.mark.parametrize("value, fragments", [
    ("h0", ["task 0 is 'h0' has no port"]),
    (f"{A},h1", ["task 1 is 'h1' has no port"]),
    (":5000", ["task 0 is ':5000' has an empty host"]),
    ("h:", ["task 0 is 'h:' has a port '' that is not an integer"]),
    ("h:abc", ["port 'abc' that is not an integer"]),
    ("h:-1", ["port '-1' that is not an integer"]),
    ("h:1.5", ["port '1.5' that is not an integer"]),
    ("h:0", ["port 0 out of range"]),
    ("h:65536", ["port 65536 out of range"]),
    ("::1:5000", ["invalid host '::1'"]),          # IPv6 needs brackets
    ("[]:5000", ["invalid host '[]'"]),
    ("h h:5000", ["invalid host 'h h'"]),
    (f"{A},,{B}", ["task 1 is an empty address"]),
    (f"{A},", ["task 1 is an empty address"]),
    ("", ["lists no address"]),
    ("  ", ["lists no address"]),
    ([], ["lists no address"]),
    (f"{A},{B},{A}", ["tasks 0 and 2 are both '127.0.0.1:5000'"]),
    ("H:5000,h:05000", ["tasks 0 and 1 are both 'h:5000'"]),
])
def test_invalid_clusters_name_the_value_and_the_rule(value, fragments):
    with pytest.raises(ValueError) as info:
        spec.parse_cluster(value)
    message = str(info.value)
    assert message.startswith("--cluster must ")
    assert f"Received: --cluster {value}" in message or "Received: --cluster" in message
    for fragment in fragments:
        assert fragment in message, message
    if "both" not in message and "no address" not in message:
        assert "host:port, with a non-empty host" in message and "[1, 65535]" in message


def test_a_cluster_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"must be a string 'host:port,.*of type int"):
        spec.parse_cluster(5000, name="cluster")
    with pytest.raises(TypeError, match="task 1 is 5000 of type int"):
        spec.parse_cluster([A, 5000])


@pytest.mark.parametrize("task, ok", [(0, True), (2, True), (3, False), (-1, False)])
def test_task_index_range(task, ok):
    cluster = spec.parse_cluster([A, B, C])
    if ok:
        assert spec.check_task(cluster, task) == task
    else:
        with pytest.raises(ValueError) as info:
            spec.check_task(cluster, task)
        assert str(info.value).startswith("--task must be an integer in [0, 2]")
        assert f"lists 3 worker(s): {A},{B},{C}" in str(info.value)
        assert f"Received: --task {task}" in str(info.value)


def test_task_index_must_be_an_int():
    with pytest.raises(TypeError, match="--task must be an integer in"):
        spec.check_task(spec.parse_cluster(A), "0")


def config(cluster=None, task=None, **extra):
    body = {"cluster": {"worker": [A, B]} if cluster is None else cluster, **extra}
    if task is not None:
        body["task"] = task
    return json.dumps(body)


@pytest.mark.parametrize("text, workers, chief, task", [
    (config(task={"type": "worker", "index": 1}), (A, B), None, ("worker", 1)),
    (config(), (A, B), None, None),
    (config(task={}), (A, B), None, None),
    (config({"worker": [A], "chief": [C]}, {"type": "chief", "index": 0}), (A,), C,
     ("chief", 0)),
    (config({"worker": [A, B], "chief": [C]}, {"type": "worker", "index": 0}), (A, B), C,
     ("worker", 0)),
    (config(task={"type": "worker", "index": 0}, environment="cloud", rpc_layer="grpc"),
     (A, B), None, ("worker", 0)),
])
def test_valid_tf_configs(text, workers, chief, task):
    cluster = tf_config.parse_tf_config(text)
    assert (cluster.workers, cluster.chief, cluster.task) == (workers, chief, task)
    assert cluster.source == "TF_CONFIG"
    assert cluster.jobs() == ({"worker": list(workers), "chief": [chief]} if chief
                              else {"worker": list(workers)})


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "must be JSON text; it cannot be parsed"),
    ("", "must be JSON text"),
    ('["h:1"]', "must be a JSON object such as"),
    (json.dumps({"clusters": {"worker": [A]}}), "it has 'clusters'; did you mean 'cluster'?"),
    (json.dumps({"task": {"type": "worker"}}), 'must have a "cluster" object'),
    (config({"worker": [A], "ps": [B]}), "only hold the jobs 'worker' and 'chief'"),
    (config({"workers": [A]}), "it has 'workers'; did you mean 'worker'?"),
    (config({"worker": []}), "cluster.worker must be a non-empty list"),
    (config({"worker": {"0": A}}), "cluster.worker must be a non-empty list"),
    (config({"worker": A}), "cluster.worker must be a non-empty list"),
    (config({"worker": [A], "chief": [B, C]}), "cluster.chief must be a list of exactly one"),
    (config({"worker": [A], "chief": B}), "cluster.chief must be a list of exactly one"),
    (config({"worker": [A, "h"]}), "task 1 is 'h' has no port"),
    (config({"worker": [A, "h:99999"]}), "port 99999 out of range"),
    (config({"worker": [A, B], "chief": [A]}), "tasks 0 and 2 are both"),
    (config(task={"type": "ps", "index": 0}), "task.type must be 'worker' or 'chief'"),
    (config(task={"type": "workr", "index": 0}), "did you mean 'worker'?"),
    (config(task={"type": "chief", "index": 0}), "task.type is 'chief' but cluster has no"),
    (config(task={"type": "worker", "index": 2}), "task.index must be an integer in [0, 1]"),
    (config(task={"type": "worker", "index": -1}), "task.index must be an integer in [0, 1]"),
    (config(task={"type": "worker", "index": "1"}), "it is '1'"),
    (config(task={"type": "worker", "index": True}), "it is True"),
    (config(task={"type": "worker", "idx": 0}), "task must be an object"),
    (config(task=["worker", 0]), "task must be an object"),
    (config(rpc_layer="grpc+verbs"), "rpc_layer must be 'grpc'"),
])
def test_invalid_tf_configs(text, fragment):
    with pytest.raises(ValueError) as info:
        tf_config.parse_tf_config(text)
    message = str(info.value)
    assert message.startswith("TF_CONFIG ")
    assert fragment in message, message
    assert f"Received: TF_CONFIG={text!r}"[:60] in message


@pytest.mark.parametrize("flags, environ, expected", [
    ((f"{A},{B}", 1), {}, ((A, B), 1)),
    ((f"{A},{B}", 0), {"TF_CONFIG": config(task={"type": "worker", "index": 1})},
     ((A, B), 0)),                                  # the flags win
    ((None, None), {"TF_CONFIG": config(task={"type": "worker", "index": 1})}, ((A, B), 1)),
])
def test_worker_slot(flags, environ, expected):
    cluster, task = slots.worker_slot(*flags, environ=environ)
    assert (cluster.workers, task) == expected


@pytest.mark.parametrize("flags, environ, fragment", [
    ((A, None), {}, "--task is required with --cluster"),
    ((None, 0), {}, "--task needs --cluster"),
    ((None, None), {}, "needs --cluster h0:p0,h1:p1,... and --task T, or the TF_CONFIG"),
    ((None, None), {"TF_CONFIG": config()}, "must name a worker task"),
    ((None, None), {"TF_CONFIG": config({"worker": [A], "chief": [B]},
                                        {"type": "chief", "index": 0})},
     "it names the chief, which is the trainer"),
    ((f"{A},{B}", 2), {}, "--task must be an integer in [0, 1]"),
])
def test_worker_slot_errors(flags, environ, fragment):
    with pytest.raises(ValueError) as info:
        slots.worker_slot(*flags, environ=environ)
    assert fragment in str(info.value)


def test_trainer_cluster():
    assert slots.trainer_cluster(None, environ={}) is None
    assert slots.trainer_cluster(f"{A},{B}", environ={}).workers == (A, B)
    chief = config({"worker": [A], "chief": [C]}, {"type": "chief", "index": 0})
    assert slots.trainer_cluster(None, environ={"TF_CONFIG": chief}).task == ("chief", 0)
    assert slots.trainer_cluster(None, environ={"TF_CONFIG": config()}).task is None
    with pytest.raises(ValueError, match="names worker task 1 for this process, but the "
                                         "trainer is the chief or holds no slot"):
        slots.trainer_cluster(None, environ={"TF_CONFIG": config(
            task={"type": "worker", "index": 1})})


def names(*specs):
    return [f"/job:worker/replica:0/task:{t}/device:{k}:{i}" for t, k, i in specs]


@pytest.mark.parametrize("found, per_worker, expected", [
    # CPU-only workers: their CPU devices, worker 0 first, in index order.
    (names((1, "CPU", 1), (1, "CPU", 0), (0, "CPU", 0), (0, "CPU", 1)), None,
     names((0, "CPU", 0), (0, "CPU", 1), (1, "CPU", 0), (1, "CPU", 1))),
    (names((0, "CPU", 0), (0, "CPU", 1), (1, "CPU", 0), (1, "CPU", 1)), 1,
     names((0, "CPU", 0), (1, "CPU", 0))),
    # A worker with GPUs offers its GPUs, not its CPU; CPU:10 sorts after CPU:2.
    (names((0, "CPU", 0), (0, "GPU", 0), (0, "GPU", 1), (1, "CPU", 10), (1, "CPU", 2)), None,
     names((0, "GPU", 0), (0, "GPU", 1), (1, "CPU", 2), (1, "CPU", 10))),
])
def test_stage_devices(found, per_worker, expected):
    local = ["/job:localhost/replica:0/task:0/device:CPU:0", "/device:CPU:0"]
    cluster = spec.parse_cluster([A, B])
    assert device_names.stage_devices(local + found, cluster, per_worker) == expected


@pytest.mark.parametrize("found, per_worker, fragment", [
    (names((0, "CPU", 0)), None, "task 1 (127.0.0.1:5001) shows no device"),
    (names((0, "CPU", 0), (1, "CPU", 0)), 2,
     "task 0 (127.0.0.1:5000) has 1 CPU device(s) (['/job:worker/replica:0/task:0/device:CPU:0"
     "']), fewer than the 2 per worker asked for: start it with --cpu-devices 2"),
    (names((0, "GPU", 0), (1, "GPU", 0)), 2, "it has only 1 GPU(s)"),
])
def test_stage_devices_errors(found, per_worker, fragment):
    with pytest.raises(ValueError) as info:
        device_names.stage_devices(found, spec.parse_cluster([A, B]), per_worker)
    assert fragment in str(info.value)


# Lines as Linux prints them: 127.0.0.1:5000 LISTEN, 0.0.0.0:22 LISTEN, an ESTABLISHED one;
# [::]:5001 LISTEN and [::1]:5002 LISTEN (each 32-bit word in little-endian order).
PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1388 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1
   2: 0100007F:1388 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 333 1
"""
ZERO6 = "0" * 32
PROC_TCP6 = "  sl  local_address remote_address st ...\n" + "".join(
    f"   {n}: {local} {ZERO6}:0000 0A 0:0 0:0 0 0 0 {inode} 1\n"
    for n, (local, inode) in enumerate([(f"{ZERO6}:1389", 444),
                                        ("0" * 24 + "01000000:138A", 555)]))


def test_proc_net_tcp_parsing():
    assert sockets.parse_proc_net_tcp(PROC_TCP, ipv6=False) == [
        ("127.0.0.1", 5000, "0A", 111), ("0.0.0.0", 22, "0A", 222),
        ("127.0.0.1", 5000, "01", 333)]
    assert sockets.parse_proc_net_tcp(PROC_TCP6, ipv6=True) == [
        ("::", 5001, "0A", 444), ("::1", 5002, "0A", 555)]
    assert [sockets.is_wildcard(h) for h in ("::", "0.0.0.0", "::1", "127.0.0.1")] == [
        True, True, False, False]
    assert sockets.show_addresses([("::", 5001), ("127.0.0.1", 5000)]) == (
        "[::]:5001, 127.0.0.1:5000")
