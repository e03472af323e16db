"""`PartitionPlan`: the cuts a planner chose and what it predicts for each stage (pure).

`PipelineModel(cuts="auto")` keeps its plan in `pipe.partition_plan`; `print(plan)` shows
a table with one row per stage.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
    """Where a model is cut, and each stage's predicted time and memory.

    Attributes:
        names: every layer name of the model, in the planner's order.
        stages: one `stage_terms.StageEstimate` per stage.
        batch_size: the mini-batch the predictions are for.
        mode, spectrain_target: the pipeline mode planned for.
        micro_batches, schedule, recompute: the micro-batches per mini-batch, the `sync`
            schedule and the recomputation planned for (see `stage_terms.StageTerms`).
        accumulate: mode "2bw"'s mini-batches per update (None: one per stage, N).
        devices: the stage devices, or None.
        memory_limits: per stage, the limit in bytes or None.
        profile_seconds: how long profiling (and calibrating) took, 0 for a given profile.
        model_name: the model's name.
        measured: per stage, its forward plus backward seconds timed alone, or None.
    """

    names: tuple
    stages: tuple
    batch_size: int
    mode: str
    spectrain_target: str = "paper"
    devices: tuple = None
    memory_limits: tuple = None
    profile_seconds: float = 0.0
    model_name: str = "model"
    measured: tuple = None
    micro_batches: int = 1
    schedule: str = "gpipe"
    recompute: str = "auto"
    accumulate: int = None

    def __post_init__(self):
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "stages", tuple(self.stages))
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))
        if self.memory_limits is not None:
            object.__setattr__(self, "memory_limits", tuple(self.memory_limits))
        if self.measured is not None:
            object.__setattr__(self, "measured", tuple(self.measured))

    @property
    def num_stages(self):
        """The number of stages."""
        return len(self.stages)

    @property
    def cuts(self):
        """The cut layer names (each ends a stage but the last), for `PipelineModel`."""
        return [self.names[s.last] for s in self.stages[:-1]]

    @property
    def updates_every(self):
        """Mini-batches per update: `accumulate` (or N) in mode "2bw", else 1."""
        if self.mode != "2bw":
            return 1
        return self.num_stages if self.accumulate is None else self.accumulate

    @property
    def bottleneck(self):
        """Index of the stage predicted slowest (the pipeline's pace)."""
        return max(range(len(self.stages)), key=lambda k: self.stages[k].seconds)

    @property
    def seconds_per_batch(self):
        """Predicted seconds per mini-batch in steady state: the slowest stage's time."""
        return self.stages[self.bottleneck].seconds

    @property
    def balance(self):
        """Predicted max over mean stage time (1.0: perfectly balanced)."""
        times = [s.seconds for s in self.stages]
        mean = sum(times) / len(times)
        return max(times) / mean if mean > 0 else 1.0

    def stage_layers(self, k):
        """The layer names of stage `k`, in order."""
        stage = self.stages[k]
        return list(self.names[stage.first : stage.last + 1])

    def to_dict(self):
        """The plan as a JSON-friendly dict (each stage's fields, its layers' range)."""
        rows = []
        for k, s in enumerate(self.stages):
            row = dataclasses.asdict(s)
            row.update(
                first_layer=self.names[s.first],
                last_layer=self.names[s.last],
                seconds=s.seconds,
                memory_bytes=s.memory_bytes,
                device=None if self.devices is None else self.devices[k],
                measured_seconds=None if self.measured is None else self.measured[k],
            )
            rows.append(row)
        return {
            "model": self.model_name,
            "cuts": self.cuts,
            "batch_size": self.batch_size,
            "mode": self.mode,
            "spectrain_target": self.spectrain_target,
            "micro_batches": self.micro_batches,
            "schedule": self.schedule,
            "recompute": self.recompute,
            "updates_every": self.updates_every,
            "bottleneck": self.bottleneck,
            "balance": self.balance,
            "profile_seconds": self.profile_seconds,
            "stages": rows,
        }

    def __str__(self):
        options = [f"{self.micro_batches} micro-batches"] if self.micro_batches > 1 else []
        if self.schedule != "gpipe":
            options.append(f"schedule '{self.schedule}'")
        if self.recompute != "auto":
            options.append(f"recompute '{self.recompute}'")
        if self.mode == "2bw":
            options.append(f"one update per {self.updates_every} mini-batches")
        mode = ", ".join([f"mode '{self.mode}'"] + options)
        header = (
            f"Partition plan of '{self.model_name}': {self.num_stages} stages, {mode}, batch "
            f"{self.batch_size}; predicted {self.seconds_per_batch * 1e3:.1f} ms per mini-batch "
            f"(stage {self.bottleneck} is the bottleneck), max/mean {self.balance:.2f}; "
            f"profiling took {self.profile_seconds:.1f} s"
        )
        columns = (
            "stage", "device", "layers", "first .. last", "ms", "F+B measured ms",
            "params MiB", "activ. MiB", "optim. MiB", "sends MiB",
        )
        summing = any(s.gradient_bytes for s in self.stages)  # 2bw's gradient sums
        if summing:
            columns += ("grad. sum MiB",)
        rows = []
        for k, s in enumerate(self.stages):
            mark = "*" if k == self.bottleneck else ""
            rows.append((
                f"{k}{mark}",
                "-" if self.devices is None else self.devices[k],
                str(s.last - s.first + 1),
                f"{self.names[s.first]} .. {self.names[s.last]}",
                f"{s.seconds * 1e3:.1f}",
                "-" if self.measured is None else f"{self.measured[k] * 1e3:.1f}",
                _mib(s.param_bytes),
                _mib(s.activation_bytes + s.stash_bytes),
                _mib(s.optimizer_bytes),
                _mib(s.sent_bytes),
            ) + ((_mib(s.gradient_bytes),) if summing else ()))
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        lines = [header, "  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        return "\n".join(line.rstrip() for line in lines)


def size(num_bytes):
    """Bytes in the largest binary unit that keeps the number >= 1, e.g. '10.0 MiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes:.0f} bytes"


def _mib(num_bytes):
    return f"{num_bytes / 2**20:.2f}"
