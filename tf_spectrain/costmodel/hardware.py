"""A description of the machines the cost model predicts for: devices, their speed, links.

Pure Python. Times in the cost model are seconds and sizes are bytes. The compute times
come from a profile measured on some machine (this one's CPU, or a GPU); `relative_speed`
says how much faster the target devices are than the profiled one, so a pass that took
`t` seconds in the profile takes `t / relative_speed` on the target.

Devices are numbered `0 .. num_gpus - 1`, host 0's first: with `num_hosts` hosts of
`G = num_gpus / num_hosts` devices, device `d` is on host `d // G`. A transfer between two
devices of one host uses the intra-host link (`bandwidth`, `latency`), one between hosts
the inter-host link (`inter_host_bandwidth`, `inter_host_latency`).
"""

import dataclasses

from tf_spectrain import checks
from tf_spectrain.costmodel.links import (
    check_devices,
    check_groups,
    link_seconds,
    ring_hops,
    ring_seconds,
    shared_links,
)

# The number fields: whether 0 is invalid (strict), whether math.inf is valid, meaning.
_NUMBER_FIELDS = {
    "relative_speed": (
        True, False, "how many times faster a device computes than the profiled one"
    ),
    "bandwidth": (
        True, True, "bytes per second per link and direction; PCIe 3.0 x16 is about 12e9"
    ),
    "latency": (False, False, "seconds per transfer"),
    "inter_host_bandwidth": (
        True, True, "bytes per second between hosts; 25 Gb/s is 3.125e9"
    ),
    "inter_host_latency": (False, False, "seconds per transfer between hosts"),
}


def _check_number_field(field, value):
    """Checks one of the `_NUMBER_FIELDS` (>= 0 or > 0) and returns it as a number."""
    strict, allow_inf, meaning = _NUMBER_FIELDS[field]
    return checks.check_number(
        field, value, 0.0, strict=strict, allow_inf=allow_inf, meaning=meaning
    )


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Devices and links of a multi-device machine, or of several identical hosts.

    Args:
        num_gpus: how many devices (GPUs) there are, an int >= 1.
        relative_speed: how many times faster one device computes than the machine the
            profile was measured on, a number > 0: compute times are the profiled ones
            divided by it (so it is the inverse of the compute-time multiplier; 0.5 means
            twice as slow, 100 a hundred times as fast).
        bandwidth: bytes per second one link moves in one direction, > 0 (`math.inf`
            for a free link). Every pair of neighbouring devices, and every hop of a ring,
            has such a link of its own; links are full duplex.
        latency: seconds a transfer costs on top of its bytes / bandwidth, >= 0.
        concurrency: how many devices can compute at full speed at the same time, a
            number in `(0, num_gpus]`; None (default) means `num_gpus` (independent
            GPUs). Logical devices that share the cores one device already keeps busy have
            a concurrency near 1: their work runs one after another, whatever the schedule.
        name: a label for tables.
        num_hosts: `H`, the hosts the devices are on, an int >= 1 dividing `num_gpus`
            (`G = num_gpus / H` devices each; device `d` on host `d // G`). `bandwidth`
            and `latency` are then those of the links within a host.
        inter_host_bandwidth: bytes per second, per direction, of a transfer between
            devices of different hosts, > 0 (`math.inf` allowed); required when
            `num_hosts > 1`. 25 Gb/s Ethernet moves at most 25e9 / 8 = 3.125e9.
        inter_host_latency: seconds such a transfer costs on top of its bytes, >= 0;
            required when `num_hosts > 1`.
        nics_per_host: None (default) when every device has a link of its own to other
            hosts, as every pair of devices within a host has; or how many inter-host
            links (network cards) a host has, an int >= 1: transfers that leave (or
            enter) a host at the same time then share its links equally (see `links`).

    Raises:
        TypeError, ValueError: if an argument is of the wrong type or out of range.
    """

    num_gpus: int
    relative_speed: float = 1.0
    bandwidth: float = 12e9
    latency: float = 10e-6
    concurrency: float = None
    name: str = "custom"
    num_hosts: int = 1
    inter_host_bandwidth: float = None
    inter_host_latency: float = None
    nics_per_host: int = None

    def __post_init__(self):
        def set_(field, value):  # the dataclass is frozen: fields are set once, here
            object.__setattr__(self, field, value)

        devices = checks.check_int("num_gpus", self.num_gpus, 1, meaning="the number of devices")
        set_("num_gpus", devices)
        for field in ("relative_speed", "bandwidth", "latency"):
            set_(field, _check_number_field(field, getattr(self, field)))
        if self.concurrency is None:
            set_("concurrency", float(self.num_gpus))
        else:
            concurrency = checks.check_number(
                "concurrency", self.concurrency, 0.0, strict=True,
                meaning="how many devices compute at full speed at once",
            )
            if concurrency > self.num_gpus:
                raise ValueError(
                    "`concurrency` cannot exceed `num_gpus`: at most every device computes "
                    f"at once. Received: concurrency={self.concurrency!r}, "
                    f"num_gpus={self.num_gpus}"
                )
            set_("concurrency", concurrency)
        if not isinstance(self.name, str):
            raise TypeError(f"`name` must be a string. Received: name={self.name!r}")
        self._check_hosts(set_)

    def _check_hosts(self, set_):
        """Checks and sets the fields about hosts and the links between them."""
        hosts = checks.check_int("num_hosts", self.num_hosts, 1, meaning="hosts")
        if self.num_gpus % hosts:
            raise ValueError(
                "`num_hosts` must divide `num_gpus`: every host has the same number of "
                f"devices. Received: num_hosts={self.num_hosts!r}, num_gpus={self.num_gpus}"
            )
        set_("num_hosts", hosts)
        for field in ("inter_host_bandwidth", "inter_host_latency"):
            value = getattr(self, field)
            if value is None:
                if hosts > 1:
                    raise ValueError(
                        f"`{field}` is required when `num_hosts` > 1 "
                        f"({_NUMBER_FIELDS[field][2]}). Received: "
                        f"num_hosts={hosts}, {field}=None"
                    )
                continue
            set_(field, _check_number_field(field, value))
        set_(
            "nics_per_host",
            checks.check_int(
                "nics_per_host", self.nics_per_host, 1, none_ok=True,
                meaning="inter-host links per host; None: one per device",
            ),
        )

    def replace(self, **changes):
        """Returns a copy with some fields changed, e.g. `NVLINK.replace(num_gpus=8)`.

        A copy that changes `num_gpus` but not `concurrency` gets the default concurrency
        (all devices) again when this one had it.

        Args:
            **changes: new values of `Hardware` fields, by name.

        Returns:
            A new, checked `Hardware`.

        Raises:
            TypeError, ValueError: as the constructor, or (TypeError) for an unknown field.
        """
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise TypeError(
                f"Unknown Hardware field(s) {unknown}. Valid fields: {sorted(fields)}"
            )
        if "num_gpus" in changes and "concurrency" not in changes:
            if self.concurrency == self.num_gpus:
                changes["concurrency"] = None
        return dataclasses.replace(self, **changes)

    @property
    def gpus_per_host(self):
        """`G`: the devices on each host."""
        return self.num_gpus // self.num_hosts

    def host_of(self, device):
        """The host of device `device` (an int in `0 .. num_gpus - 1`): `device // G`."""
        device = checks.check_int(
            "device", device, 0, self.num_gpus - 1, meaning="a device index, host 0's first"
        )
        return device // self.gpus_per_host

    def crossing_hops(self, devices):
        """The positions `k` of a chain of `devices` whose hop `k -> k + 1` joins two hosts."""
        hosts = [self.host_of(d) for d in check_devices(devices)]
        return [k for k in range(len(hosts) - 1) if hosts[k] != hosts[k + 1]]

    def link(self, source, target):
        """`(bandwidth, latency)` of the link from device `source` to device `target`."""
        if self.host_of(source) == self.host_of(target):
            return self.bandwidth, self.latency
        return self.inter_host_bandwidth, self.inter_host_latency

    def links(self, hops):
        """`(bandwidth, latency)` of each of several transfers that run at the same time.

        Transfers within a host have the intra-host link each. A transfer between hosts
        has the inter-host link; with `nics_per_host` set, the `f` inter-host transfers
        leaving its source host (or entering its target host, whichever are more) share
        that host's links, so each gets `inter_host_bandwidth * min(1, nics_per_host / f)`.

        Args:
            hops: a list of `(source, target)` device pairs.

        Returns:
            A list of `(bandwidth, latency)`, one per hop.

        Raises:
            TypeError, ValueError: for a device index out of range.
        """
        return shared_links(
            [(self.host_of(a), self.host_of(b)) for a, b in hops],
            (self.bandwidth, self.latency),
            (self.inter_host_bandwidth, self.inter_host_latency),
            self.nics_per_host,
        )

    def transfer_time(self, num_bytes, source=None, target=None):
        """Seconds to send `num_bytes` over one link: `latency + num_bytes / bandwidth`.

        Sending nothing costs nothing (no latency either).

        Args:
            num_bytes: a number >= 0.
            source, target: device indices (both or neither): the link between them
                (`link`); neither means a link within a host.

        Returns:
            The time in seconds.

        Raises:
            TypeError, ValueError: if `num_bytes` is not a number >= 0, or a device index
                is out of range or given without the other.
        """
        num_bytes = checks.check_number("num_bytes", num_bytes, 0.0, meaning="bytes")
        if (source is None) != (target is None):
            raise ValueError(
                "`source` and `target` go together: give both device indices or neither. "
                f"Received: source={source!r}, target={target!r}"
            )
        if source is None:
            return link_seconds([(self.bandwidth, self.latency)], num_bytes)
        return link_seconds([self.link(source, target)], num_bytes)

    def allreduce_time(self, num_bytes, num_devices=None, devices=None):
        """Seconds for a ring all-reduce of `num_bytes` over `n` devices.

        Each device sends `2 * (n - 1)` chunks of `num_bytes / n` (reduce-scatter, then
        all-gather) to the next device of the ring, one per step, and every step waits
        for the slowest hop: `2 * (n - 1) / n * num_bytes / bandwidth + 2 * (n - 1) *
        latency` with that hop's link; 0 for n = 1. On one host every hop has the same
        link; a ring over several hosts is paced by an inter-host hop.

        Args:
            num_bytes: bytes of gradients each device holds, a number >= 0.
            num_devices: `n`, an int >= 1: the ring over devices `0 .. n - 1`; None means
                `num_gpus` (or `len(devices)`).
            devices: the ring's device indices in ring order (the last sends to the
                first), instead of `num_devices`.

        Returns:
            The time in seconds.

        Raises:
            TypeError, ValueError: if an argument is invalid.
        """
        num_bytes = checks.check_number("num_bytes", num_bytes, 0.0, meaning="bytes")
        if devices is None:
            n = self.num_gpus if num_devices is None else checks.check_int(
                "num_devices", num_devices, 1, meaning="devices taking part in the all-reduce"
            )
            devices = range(n)
        elif num_devices is not None:
            raise ValueError(
                "Give `num_devices` or `devices`, not both. Received: "
                f"num_devices={num_devices!r}, devices={devices!r}"
            )
        return self.allreduce_times([(num_bytes, devices)])[0]

    def allreduce_times(self, groups):
        """Seconds of several ring all-reduces that run at the same time.

        Each group is a ring as in `allreduce_time`; with `nics_per_host` set, the rings'
        hops between hosts share the hosts' links (`links`). A group with one device or
        no bytes takes no time and no link.

        Args:
            groups: a list of `(num_bytes, devices)`: the bytes each member holds and the
                ring's device indices, in ring order.

        Returns:
            A list of seconds, one per group.

        Raises:
            TypeError, ValueError: for invalid bytes or devices.
        """
        rings = check_groups(groups, self.host_of)
        active = [g for g, (b, d) in enumerate(rings) if b > 0 and len(d) > 1]
        links = self.ring_links([rings[g][1] for g in active])
        times = [0.0] * len(rings)
        for g, ring in zip(active, links):
            times[g] = ring_seconds(ring, rings[g][0])
        return times

    def ring_links(self, rings):
        """The links of the hops of rings that run at the same time (see `links`).

        Args:
            rings: a list of device-index lists, each in ring order.

        Returns:
            Per ring, the `(bandwidth, latency)` of its hops `devices[i] -> devices[i + 1]`
            (the last to the first); none for a one-device ring.
        """
        hops = [ring_hops(devices) for devices in rings]
        flat = self.links([hop for ring in hops for hop in ring])
        out, at = [], 0
        for ring in hops:
            out.append(flat[at : at + len(ring)])
            at += len(ring)
        return out


PCIE3_X16 = Hardware(
    num_gpus=4, relative_speed=1.0, bandwidth=12e9, latency=10e-6, name="PCIe 3.0 x16"
)
"""4 GPUs on PCIe 3.0 x16 links: about 12 GB/s per direction (of 15.75 nominal)."""

NVLINK = Hardware(num_gpus=4, relative_speed=1.0, bandwidth=150e9, latency=5e-6, name="NVLink")
"""4 GPUs linked by NVLink: about 150 GB/s per direction between two GPUs (V100 class)."""

