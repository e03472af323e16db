"""A description of the machine the cost model predicts for: devices, their speed, links.

Pure Python. Times in the cost model are seconds and sizes are bytes. The compute times
come from a profile measured on some machine (this one's CPU, or a GPU); `relative_speed`
says how much faster the target devices are than the profiled one, so a pass that took
`t` seconds in the profile takes `t / relative_speed` on the target.
"""

import dataclasses

from tf_spectrain import checks


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Devices and links of a multi-device machine.

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

    Raises:
        TypeError, ValueError: if an argument is of the wrong type or out of range.
    """

    num_gpus: int
    relative_speed: float = 1.0
    bandwidth: float = 12e9
    latency: float = 10e-6
    concurrency: float = None
    name: str = "custom"

    def __post_init__(self):
        def set_(field, value):  # the dataclass is frozen: fields are set once, here
            object.__setattr__(self, field, value)

        devices = checks.check_int("num_gpus", self.num_gpus, 1, meaning="the number of devices")
        set_("num_gpus", devices)
        set_(
            "relative_speed",
            checks.check_number(
                "relative_speed", self.relative_speed, 0.0, strict=True,
                meaning="how many times faster a device computes than the profiled one",
            ),
        )
        set_(
            "bandwidth",
            checks.check_number(
                "bandwidth", self.bandwidth, 0.0, strict=True, allow_inf=True,
                meaning="bytes per second per link and direction; PCIe 3.0 x16 is about 12e9",
            ),
        )
        latency = checks.check_number("latency", self.latency, 0.0, meaning="seconds per transfer")
        set_("latency", latency)
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

    def transfer_time(self, num_bytes):
        """Seconds to send `num_bytes` over one link: `latency + num_bytes / bandwidth`.

        Sending nothing costs nothing (no latency either).

        Args:
            num_bytes: a number >= 0.

        Returns:
            The time in seconds.

        Raises:
            TypeError, ValueError: if `num_bytes` is not a number >= 0.
        """
        num_bytes = checks.check_number("num_bytes", num_bytes, 0.0, meaning="bytes")
        if num_bytes == 0:
            return 0.0
        return self.latency + num_bytes / self.bandwidth

    def allreduce_time(self, num_bytes, num_devices=None):
        """Seconds for a ring all-reduce of `num_bytes` over `num_devices` devices.

        Each device sends `2 * (n - 1)` chunks of `num_bytes / n` (reduce-scatter, then
        all-gather), one per step, and every step pays the latency:
        `2 * (n - 1) / n * num_bytes / bandwidth + 2 * (n - 1) * latency`; 0 for n = 1.

        Args:
            num_bytes: bytes of gradients each device holds, a number >= 0.
            num_devices: `n`, an int >= 1; None means `num_gpus`.

        Returns:
            The time in seconds.

        Raises:
            TypeError, ValueError: if an argument is invalid.
        """
        num_bytes = checks.check_number("num_bytes", num_bytes, 0.0, meaning="bytes")
        n = self.num_gpus if num_devices is None else checks.check_int(
            "num_devices", num_devices, 1, meaning="devices taking part in the all-reduce"
        )
        if n == 1 or num_bytes == 0:
            return 0.0
        steps = 2 * (n - 1)
        return steps / n * num_bytes / self.bandwidth + steps * self.latency


PCIE3_X16 = Hardware(
    num_gpus=4, relative_speed=1.0, bandwidth=12e9, latency=10e-6, name="PCIe 3.0 x16"
)
"""4 GPUs on PCIe 3.0 x16 links: about 12 GB/s per direction (of 15.75 nominal)."""

NVLINK = Hardware(num_gpus=4, relative_speed=1.0, bandwidth=150e9, latency=5e-6, name="NVLink")
"""4 GPUs linked by NVLink: about 150 GB/s per direction between two GPUs (V100 class)."""

