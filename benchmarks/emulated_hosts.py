"""Emulated hosts: network namespaces joined by shaped links, created, checked and removed.

    python -m benchmarks.emulated_hosts --hosts 3 --rate 100mbit    # create, measure, remove
    python -m benchmarks.emulated_hosts --remove-stale               # what killed runs left

Each host is a network namespace (`ip netns`) with loopback and one interface, `eth0`,
holding the address `10.<net>.0.<h+1>/24` (addresses exist only inside these namespaces).
Every host's `eth0` is one end of a veth pair whose other end is a port of a bridge in a
namespace of its own (the switch), so no interface or address is added to the machine's
own namespace. `--rate` shapes each host's link both ways with a token bucket (`tc qdisc
... tbf`: on `eth0` for what the host sends, on its switch port for what it receives);
`netem` is not available here, so links add no delay beyond the bucket's queue.

Processes run in a host with `EmulatedHosts.popen(h, argv)` (`ip netns exec`, optionally
pinned to a core with `taskset`). Leaving the `with` block kills every process left in
the namespaces and deletes them (their interfaces and queues go with them), also when the
block raises; the names carry the creating process's pid, so `remove_stale()` deletes what
a killed run left (every `python -m benchmarks.emulated_hosts` run calls it first).
Creating namespaces needs root (CAP_SYS_ADMIN) and the `ip` and `tc` tools:
`NamespacesUnavailable` says which is missing, and tests skip with that reason.
"""

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "tfsp"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(h\d+|sw)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
_BITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


class NamespacesUnavailable(RuntimeError):
    """This machine or user cannot create network namespaces (the reason is the message)."""


def rate_bits(rate):
    """Bits per second of a rate such as `"100mbit"`, or None for `None`/`"unshaped"`.

    Raises:
        ValueError: naming the rate and the valid forms.
    """
    if rate in (None, "unshaped"):
        return None
    found = _RATE.match(str(rate).strip().lower())
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"A link rate must be 'unshaped' or a positive number followed by "
                         f"kbit, mbit or gbit (as tc writes them). Received: {rate!r}")
    return float(found.group(1)) * _BITS[found.group(2)]


def _run(argv, check=True):
    """Runs a command; returns its CompletedProcess (RuntimeError with its stderr)."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({done.returncode}): "
                           f"{done.stderr.strip() or done.stdout.strip()}")
    return done


def _namespaces():
    """The names of the machine's network namespaces."""
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _kill_and_delete(name):
    """Kills every process in namespace `name`, then deletes it (no error if gone)."""
    pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
        time.sleep(0.05)
    _run(["ip", "netns", "del", name], check=False)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale():
    """Deletes namespaces of this harness whose creating process is gone; returns them."""
    stale = [n for n in _namespaces()
             if (m := _NAME.match(n)) and not _alive(int(m.group(1)))]
    for name in stale:
        _kill_and_delete(name)
    return stale


def check_available():
    """Raises NamespacesUnavailable, with the reason, unless namespaces can be made here."""
    missing = [tool for tool in ("ip", "tc", "taskset") if shutil.which(tool) is None]
    if missing:
        raise NamespacesUnavailable(f"the {' and '.join(missing)} tool(s) are not installed "
                                    "(Debian: apt-get install iproute2 util-linux)")
    if os.geteuid() != 0:
        raise NamespacesUnavailable("creating network namespaces needs root (CAP_SYS_ADMIN)")
    probe = f"{PREFIX}{os.getpid()}-h999"
    done = _run(["ip", "netns", "add", probe], check=False)
    _run(["ip", "netns", "del", probe], check=False)
    if done.returncode != 0:
        raise NamespacesUnavailable(f"`ip netns add` failed: {done.stderr.strip()}")


class EmulatedHosts:
    """H emulated hosts on one switch, each link shaped to `rate` both ways.

    Args:
        count: the number of hosts (2 to 250).
        rate: `"100mbit"`, `"1gbit"`, ... or None/`"unshaped"`.
        net: the second byte of the hosts' addresses (`10.<net>.0.<h+1>`).
        sysctls: `{name: value}` set in every host's namespace (`sysctl -w`), e.g.
            `{"net.ipv4.tcp_slow_start_after_idle": "0"}`.

    Use as a context manager: entering creates and checks everything, leaving removes it.
    """

    def __init__(self, count, rate=None, net=213, sysctls=None):
        if not isinstance(count, int) or not 2 <= count <= 250:
            raise ValueError(f"`count` must be an int in [2, 250]. Received: count={count!r}")
        self.count, self.rate, self.net = count, rate, net
        self.sysctls = dict(sysctls or {})
        self.bits = rate_bits(rate)
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{h}" for h in range(count)]
        self._processes = []

    def address(self, h):
        """Host h's IPv4 address."""
        return f"10.{self.net}.0.{h + 1}"

    def __enter__(self):
        check_available()
        remove_stale()
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def _ns(self, name, *argv):
        return _run(["ip", "netns", "exec", name, *argv])

    def _create(self):
        _run(["ip", "netns", "add", self.switch])
        self._ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._ns(self.switch, "ip", "link", "set", "br0", "up")
        for h, name in enumerate(self.names):
            _run(["ip", "netns", "add", name])
            port = f"p{h}"
            _run(["ip", "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name",
                  port, "netns", self.switch])
            self._ns(self.switch, "ip", "link", "set", port, "master", "br0")
            self._ns(self.switch, "ip", "link", "set", port, "up")
            self._ns(name, "ip", "link", "set", "lo", "up")
            self._ns(name, "ip", "addr", "add", f"{self.address(h)}/24", "dev", "eth0")
            self._ns(name, "ip", "link", "set", "eth0", "up")
            for key, value in self.sysctls.items():
                self._ns(name, "sysctl", "-q", "-w", f"{key}={value}")
            if self.bits is not None:
                self._shape(name, "eth0")
                self._shape(self.switch, port)

    def _shape(self, name, device):
        # A bucket of 10 ms at the rate (at least 64 KiB, a TSO segment) and a queue of
        # 200 ms: TCP sees the rate, not drops from a short queue.
        burst = max(65536, int(self.bits / 8 / 100))
        self._ns(name, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate",
                 f"{int(self.bits)}bit", "burst", str(burst), "latency", "200ms")

    def qdiscs(self):
        """`{host: tc's line for eth0's root qdisc}`: what shapes each host's link."""
        return {h: self._ns(name, "tc", "qdisc", "show", "dev", "eth0").stdout.strip()
                for h, name in enumerate(self.names)}

    def popen(self, h, argv, core=None, **kwargs):
        """Starts `argv` in host h (pinned to CPU `core` if given); a `subprocess.Popen`."""
        prefix = ["ip", "netns", "exec", self.names[h]]
        if core is not None:
            prefix += ["taskset", "-c", str(core)]
        process = subprocess.Popen(prefix + list(argv), **kwargs)
        self._processes.append(process)
        return process

    def run(self, h, argv, timeout=60, **kwargs):
        """Runs `argv` in host h to its end; a `subprocess.CompletedProcess`."""
        return subprocess.run(["ip", "netns", "exec", self.names[h], *argv], timeout=timeout,
                              capture_output=True, text=True, **kwargs)

    def measure_rate(self, src, dst, megabytes=2.0, port=5201):
        """Sends `megabytes` over TCP from host src to host dst; returns bits per second."""
        sink = self.popen(dst, [sys.executable, "-c", _SINK, self.address(dst), str(port)],
                          stdout=subprocess.PIPE, text=True)
        try:
            sink.stdout.readline()  # "ready"
            sent = self.run(src, [sys.executable, "-c", _SOURCE, self.address(dst), str(port),
                                  str(int(megabytes * 1e6))])
            if sent.returncode != 0:
                raise RuntimeError(f"the sender failed: {sent.stderr.strip()}")
            return float(sent.stdout.strip())
        finally:
            sink.kill()
            sink.wait()

    def remove(self):
        """Kills what runs in the hosts and deletes every namespace (idempotent)."""
        for process in self._processes:
            if process.poll() is None:
                process.kill()
        for name in self.names + [self.switch]:
            if name in _namespaces():
                _kill_and_delete(name)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        self._processes.clear()

    def leftovers(self):
        """The namespaces of this instance that still exist (empty after `remove`)."""
        mine = set(self.names + [self.switch])
        return [n for n in _namespaces() if n in mine]


_SINK = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
c.sendall(b"k")
"""

_SOURCE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
n = int(sys.argv[3]); chunk = b"x" * 65536; t = time.perf_counter(); sent = 0
while sent < n:
    sent += c.send(chunk[: n - sent])
c.shutdown(socket.SHUT_WR)
c.recv(1)
print(sent * 8 / (time.perf_counter() - t))
"""


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.emulated_hosts",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--rate", default="100mbit", help="'unshaped', or e.g. 100mbit, 1gbit")
    p.add_argument("--megabytes", type=float, default=4.0)
    p.add_argument("--remove-stale", action="store_true",
                   help="only delete namespaces that killed runs left")
    args = p.parse_args(argv)
    if args.remove_stale:
        print("removed:", ", ".join(remove_stale()) or "nothing")
        return 0
    rate_bits(args.rate)
    with EmulatedHosts(args.hosts, args.rate) as hosts:
        for h in range(args.hosts):
            print(f"host {h}: {hosts.address(h)} in {hosts.names[h]}: {hosts.qdiscs()[h]}")
        got = hosts.measure_rate(0, 1, args.megabytes)
        print(f"TCP host 0 -> host 1: {got / 1e6:.1f} Mbit/s (link: {args.rate})")
    print("removed:", ", ".join(hosts.leftovers()) or "every namespace")
    return 0


if __name__ == "__main__":
    sys.exit(main())
