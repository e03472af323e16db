"""Where the workers reach the trainer: the trainer's own address in the cluster.

The trainer is a TensorFlow server too: the workers send it what they compute for it (the
losses, the weights it reads) over gRPC, at the address its job has in the cluster spec
the trainer hands them. Joined as TensorFlow's `localhost` job, the trainer is served at
`localhost:<port>`, which a worker on another host resolves to itself ("failed to connect
to all addresses; ... ipv4:127.0.0.1:PORT: Connection refused"). So when a worker is on
another host, the trainer joins as the `chief` job at an address of this host that the
workers reach: the source address of this host's route to them (read from a UDP socket
connected to each worker, which sends nothing), at a free port. Or the user gives it
(`connect_cluster(trainer_address=...)`, `train.py --trainer-address`). No TensorFlow
import: the errors come before TensorFlow connects.
"""

import ipaddress
import socket

from tf_spectrain.cluster import addresses

_FLAG = "`trainer_address` (train.py --trainer-address)"


def _bare(host):
    """The host without IPv6 brackets."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _resolve(host):
    """The first IP address `host` resolves to; OSError (socket.gaierror) if none."""
    infos = socket.getaddrinfo(_bare(host), None, type=socket.SOCK_STREAM)
    return infos[0][4][0]


def _is_loopback(ip):
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def _with_port(ip, port):
    """`"ip:port"`, IPv6 in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _family(ip):
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def route_source(ip):
    """The address of this host that its route to `ip` leaves from (OSError: no route)."""
    with socket.socket(_family(ip), socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # a UDP connect only picks the route: nothing is sent
        return probe.getsockname()[0]


def free_port(ip, port=0):
    """`port` if it is free on `ip` now, or with 0 a free port (OSError if `ip` is not an
    address of this host or the port is taken)."""
    with socket.socket(_family(ip), socket.SOCK_STREAM) as probe:
        probe.bind((ip, port))
        return probe.getsockname()[1]


def _given(given):
    """The trainer address a user gave, checked: `"ip:port"`, a free port if none given."""
    rule = (f"{_FLAG} must be 'host' or 'host:port' (port in [1, {addresses.MAX_PORT}]), an "
            "address of this host, with a free port, that every worker reaches")
    if not isinstance(given, str) or not given.strip():
        raise ValueError(f"{rule}. Received: trainer_address={given!r}")
    text = given.strip()
    host, port = addresses.split_address(text)
    if port is None or (":" in host and not host.startswith("[")):  # no port, or bare IPv6
        host, port = text, None
    if port is not None and not (port.isdigit() and 1 <= int(port) <= addresses.MAX_PORT):
        raise ValueError(f"{rule}. Received: trainer_address={given!r}")
    try:
        ip = _resolve(host)
        return _with_port(ip, free_port(ip, 0 if port is None else int(port)))
    except OSError as error:
        raise ValueError(f"{rule}. Received: trainer_address={given!r} ({error})") from None


def trainer_address(cluster, given=None):
    """The address the trainer joins the cluster at, or None for TensorFlow's `localhost`.

    Args:
        cluster: a `Cluster` (its workers' hosts are looked up).
        given: `"host"` or `"host:port"` from the user, or None to find it.

    Returns:
        `"ip:port"` (the chief's address to give TensorFlow), or None when every worker
        is on this host's loopback and none was given (the `localhost` job serves then).

    Raises:
        ValueError: if `given` is not an address of this host (or its port is taken), or
            the routes to the workers leave from different addresses of this host (say
            which, and to pass one).
        ConnectionError: if a worker's host cannot be resolved or has no route.
    """
    chosen = None if given is None else _given(given)
    outside = {w: ip for w, ip in _sources(cluster).items() if not _is_loopback(ip)}
    if chosen is not None:
        if outside and _is_loopback(_bare(addresses.split_address(chosen)[0])):
            raise ValueError(
                f"{_FLAG} must be an address the workers reach, and {', '.join(outside)} "
                f"are on other hosts, so a loopback address is not. Received: "
                f"trainer_address={given!r}; this host reaches them from "
                f"{', '.join(sorted(set(outside.values())))}")
        return chosen
    if not outside:
        return None
    found = sorted(set(outside.values()))
    if len(found) > 1:
        routes = "; ".join(f"{w} from {ip}" for w, ip in outside.items())
        raise ValueError(
            f"This host reaches the workers from different addresses ({routes}), so the "
            f"trainer's own address cannot be chosen for them: pass {_FLAG}, an address "
            f"of this host that every worker reaches (one of {', '.join(found)}, say).")
    return _with_port(found[0], free_port(found[0]))


def _sources(cluster):
    """`{worker description: this host's source address toward it}`; ConnectionError."""
    sources = {}
    for task, address in enumerate(cluster.workers):
        host, _ = addresses.split_address(address)
        try:
            ip = _resolve(host)
            sources[cluster.describe(task)] = route_source(ip)
        except OSError as error:
            raise ConnectionError(
                f"Worker {cluster.describe(task)} cannot be reached from this host: {error}. "
                "Correct the address, or check the network."
            ) from None
    return sources
