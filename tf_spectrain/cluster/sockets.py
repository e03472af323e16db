"""Which TCP addresses a process listens on (Linux `/proc`), and whether an address accepts.

TensorFlow 2.21's gRPC server does not bind the host of its address: it listens on every
interface (`GrpcServer::Init` in tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc
passes `"0.0.0.0:<port>"` to gRPC, which opens a dual-stack `[::]` socket). The worker reads
what was actually bound from `/proc/<pid>/net/tcp{,6}` to report it and to refuse a wildcard
bind unless asked. Nothing here sends data: `wait_until_listening` only opens and closes a
TCP connection to see that something accepts on the port.
"""

import ipaddress
import os
import socket
import time

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
WILDCARDS = ("0.0.0.0", "::")


def parse_proc_net_tcp(text, ipv6):
    """Parses the lines of `/proc/net/tcp` or `/proc/net/tcp6` (pure).

    Args:
        text: the file's content, header line first.
        ipv6: True for `tcp6` (addresses of 32 hex digits).

    Returns:
        A list of `(host, port, state, inode)`: the local address as an `ipaddress` string,
        the port as an int, the two-hex-digit state (`"0A"` is LISTEN) and the socket inode.
    """
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        address, port = fields[1].split(":")
        rows.append((_decode_host(address, ipv6), int(port, 16), fields[3], int(fields[9])))
    return rows


def _decode_host(hex_text, ipv6):
    # The kernel prints each 32-bit word in host byte order (little-endian on x86 and ARM).
    raw = bytes.fromhex(hex_text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if ipv6:
        return str(ipaddress.IPv6Address(words))
    return str(ipaddress.IPv4Address(words))


def listening_addresses(pid="self", port=None):
    """Lists the TCP addresses a process listens on, from `/proc` (Linux only).

    Args:
        pid: a process id, or `"self"`.
        port: only sockets on this port (None: all).

    Returns:
        A sorted list of `(host, port)` with `host` such as `"::"`, `"0.0.0.0"` or
        `"127.0.0.1"`; None when `/proc` cannot be read (another OS, or no permission).
    """
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
        rows = []
        for name, ipv6 in (("tcp", False), ("tcp6", True)):
            path = f"/proc/{pid}/net/{name}"
            if os.path.exists(path):
                with open(path) as f:
                    rows += parse_proc_net_tcp(f.read(), ipv6)
    except OSError:
        return None
    return sorted({(host, p) for host, p, state, inode in rows
                   if state == _LISTEN and inode in inodes and (port is None or p == port)})


def is_wildcard(host):
    """Tells whether `host` is a wildcard address (every interface): `0.0.0.0` or `::`."""
    return host in WILDCARDS


def show_addresses(addresses):
    """Writes `[(host, port), ...]` as `"[::]:5000, 127.0.0.1:5000"` for messages."""
    return ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)


def wait_until_listening(host, port, timeout, interval=0.1):
    """Waits until a TCP connection to `host:port` is accepted, for at most `timeout` s.

    Connection refused, unreachable or timed out are retried every `interval` seconds (a
    worker just started may not listen yet); the connection is closed at once, nothing is
    sent.

    Args:
        host: the host name or address (brackets around an IPv6 address are removed).
        port: the port, an int.
        timeout: how long to keep trying, in seconds.
        interval: the pause between attempts, in seconds.

    Returns:
        None once a connection was accepted, else the reason of the last failure (a
        string such as `"connection refused"` or `"the host name cannot be resolved"`).
    """
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(1.0, remaining))):
                return None
        except socket.gaierror as error:
            return f"the host name cannot be resolved ({error})"
        except ConnectionRefusedError:
            reason = "connection refused"
        except TimeoutError:
            reason = "connection timed out"
        except OSError as error:
            reason = error.strerror or str(error)
        if time.monotonic() + interval > deadline:
            return reason
        time.sleep(interval)
