"""Link arithmetic: the seconds of transfers and ring all-reduces over given links.

Pure Python. A link is a pair `(bandwidth, latency)`: bytes per second in one direction
and seconds a transfer costs on top of its bytes. `Hardware` says which link a pair of
devices has (`Hardware.link`, `Hardware.links`); the functions here turn links into
seconds, and share a host's network cards between the transfers that leave or enter it
at the same time.
"""

from tf_spectrain import checks


def link_seconds(links, num_bytes, latency_count=1):
    """Seconds to move `num_bytes` over the slowest of `links`: `latency + bytes / bandwidth`.

    Args:
        links: `(bandwidth, latency)` pairs of transfers that must all end (replicas
            handing the same tensor on at the same time), at least one.
        num_bytes: bytes each transfer moves, >= 0 (0 costs nothing, no latency either).
        latency_count: how many transfers the bytes are split into, each paying the
            latency (GPipe micro-batches).

    Returns:
        The time in seconds.
    """
    if num_bytes == 0:
        return 0.0
    return max(latency_count * latency + num_bytes / bandwidth for bandwidth, latency in links)


def ring_seconds(links, num_bytes):
    """Seconds of a ring all-reduce of `num_bytes` whose `n` hops have `links`.

    `2 (n - 1)` steps of a `num_bytes / n` chunk on every hop, each step as long as its
    slowest hop: `2 (n - 1) / n * num_bytes / bandwidth + 2 (n - 1) * latency` with the
    slowest hop's link; 0 when `n <= 1` or there are no bytes.
    """
    n = len(links)
    if n <= 1 or num_bytes == 0:
        return 0.0
    steps = 2 * (n - 1)
    bandwidth, latency = max(links, key=lambda link: link[1] + num_bytes / n / link[0])
    return steps / n * num_bytes / bandwidth + steps * latency


def ring_hops(devices):
    """The `(source, target)` hops of a ring over `devices`, the last back to the first."""
    n = len(devices)
    return [] if n < 2 else [(devices[i], devices[(i + 1) % n]) for i in range(n)]


def shared_links(host_hops, intra_link, inter_link, nics_per_host):
    """The link of each of several transfers that run at the same time (see `Hardware.links`).

    Args:
        host_hops: `(source host, target host)` of each transfer.
        intra_link: the `(bandwidth, latency)` of a transfer within a host.
        inter_link: the `(bandwidth, latency)` of a transfer between hosts, alone.
        nics_per_host: None, or the inter-host links per host: the `f` transfers leaving
            a source host (or entering a target host, whichever are more) then get
            `bandwidth * min(1, nics_per_host / f)` each.

    Returns:
        A list of `(bandwidth, latency)`, one per transfer.
    """
    leaving, entering = {}, {}
    for a, b in host_hops:
        if a != b:
            leaving[a] = leaving.get(a, 0) + 1
            entering[b] = entering.get(b, 0) + 1
    out = []
    for a, b in host_hops:
        if a == b:
            out.append(intra_link)
            continue
        bandwidth, latency = inter_link
        flows = max(leaving[a], entering[b])
        if nics_per_host is not None and flows > nics_per_host:
            bandwidth = bandwidth * nics_per_host / flows
        out.append((bandwidth, latency))
    return out


def check_devices(devices):
    """`devices` as a list of distinct int device indices (raises TypeError, ValueError)."""
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (list, tuple, range)):
        raise TypeError(
            f"`devices` must be a list of device indices. Received: devices={devices!r}"
        )
    devices = [checks.check_int("devices", d, 0, meaning="a device index") for d in devices]
    if not devices or len(set(devices)) != len(devices):
        raise ValueError(
            f"`devices` must be a non-empty list of distinct device indices. Received: {devices}"
        )
    return devices


def check_groups(groups, check_device):
    """`groups` of `Hardware.allreduce_times` as checked `(num_bytes, devices)` pairs.

    `check_device(d)` checks each device index (range), group after group.
    """
    checks.check_instance("groups", groups, (list, tuple), " of (num_bytes, devices)")
    rings = []
    for g, group in enumerate(groups):
        if not isinstance(group, (list, tuple)) or len(group) != 2:
            raise TypeError(
                f"`groups[{g}]` must be a pair (num_bytes, devices). Received: {group!r}"
            )
        num_bytes = checks.check_number(
            f"groups[{g}] num_bytes", group[0], 0.0, meaning="bytes"
        )
        devices = check_devices(group[1])
        for d in devices:
            check_device(d)
        rings.append((num_bytes, devices))
    return rings
