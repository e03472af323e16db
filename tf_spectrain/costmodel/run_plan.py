"""`RunPlan`: a pipeline's plan set against each device's memory, before any training (pure).

`plan_pipeline` (in `preflight`, which needs TensorFlow) profiles a model and returns a
`RunPlan`; this module holds what needs no TensorFlow: the plan's memory check, its table,
the hints for a stage that does not fit and `parse_memory_size` ("16GiB" -> bytes).

Each stage's memory is `StageEstimate.memory_bytes`: weights, optimizer slots, the
activations its micro-batches in flight keep, the weight versions it stashes and, in mode
`2bw`, the gradient sum it holds between updates, for the planned mode, schedule,
micro-batches, recomputation and precision (see `stage_terms`). It
is set against the smaller of the device's memory (where the device reports it) and the
`memory_limit` given.
"""

import dataclasses
import math
import re

from tf_spectrain.costmodel.plan import PartitionPlan, size
from tf_spectrain.costmodel.stage_terms import STASHING

UNITS = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
"""The units `parse_memory_size` reads (any case): bytes, decimal and binary multiples."""

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_memory_size(value, name="memory_limit"):
    """Reads a memory size: a number of bytes, or a string such as "16GiB" or "512MiB".

    Args:
        value: an int or float > 0 (bytes), or a string: a number > 0 and an optional
            unit among `UNITS` (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, in any case), e.g.
            "16GiB", "1.5 GB", "1073741824".
        name: what the value is, for the error message.

    Returns:
        The size in bytes, an int >= 1.

    Raises:
        ValueError: for anything else (the message says what is valid).
        TypeError: for a value neither a number nor a string.
    """
    valid = ('a size such as "16GiB", "512MiB", "1.5GB" or a number of bytes (units: '
             f"{', '.join(u if len(u) < 3 else u[0] + u[1].lower() + u[2] for u in UNITS)})")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"`{name}` must be {valid}. Received: {name}={value!r}")
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if match is None or match.group(2).upper() not in UNITS | {"": 1}:
            raise ValueError(f"`{name}` must be {valid}. Received: {name}={value!r}")
        number, unit = float(match.group(1)), match.group(2).upper() or "B"
        size = number * UNITS[unit]
    else:
        size = value
    if not math.isfinite(size) or size < 1:
        raise ValueError(f"`{name}` must be at least 1 byte: {valid}. Received: {name}={value!r}")
    return int(size)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A `PartitionPlan` and, per stage, the memory it may use; `print(run_plan)` shows both.

    Attributes:
        plan: the `PartitionPlan` (cuts, each stage's `StageEstimate`).
        device_memory: per stage, its device's memory in bytes, or None where the device
            does not report it (CPUs).
        memory_limit: per stage, the `memory_limit` given in bytes, or None.
        peaks: per stage, TensorFlow's measured peak bytes on its device after one
            forward and backward of the stage, or None where not measured.
        peak_note: what `peaks` are, or why there are none.
    """

    plan: PartitionPlan
    device_memory: tuple
    memory_limit: tuple
    peaks: tuple = None
    peak_note: str = ""

    def __post_init__(self):
        n = self.plan.num_stages
        for field in ("device_memory", "memory_limit", "peaks"):
            value = getattr(self, field)
            if value is None and field == "peaks":
                continue
            value = tuple([None] * n if value is None else value)
            if len(value) != n:
                raise ValueError(f"`{field}` must hold one entry per stage ({n}). "
                                 f"Received: {field}={value!r}")
            object.__setattr__(self, field, value)

    @property
    def cuts(self):
        """The plan's cut layer names."""
        return self.plan.cuts

    def limit(self, k):
        """The bytes stage `k` may use: the smaller of its device's memory and the limit
        given, or None when neither is known."""
        known = [m for m in (self.device_memory[k], self.memory_limit[k]) if m is not None]
        return min(known) if known else None

    @property
    def over(self):
        """The indices of the stages predicted to need more than `limit(k)`."""
        return [k for k, s in enumerate(self.plan.stages)
                if self.limit(k) is not None and s.memory_bytes > self.limit(k)]

    @property
    def fits(self):
        """Whether every stage fits its limit (True where no limit is known)."""
        return not self.over

    def problems(self, hints=None, limit_name="memory_limit"):
        """One message per stage that does not fit: its need, its limit, what to do.

        Args:
            hints: the remedies to suggest; None gives `memory_hints(self.plan)`.
            limit_name: what to call the limit given (e.g. "--memory-limit").
        """
        hints = memory_hints(self.plan) if hints is None else hints
        out = []
        for k in self.over:
            s, limit = self.plan.stages[k], self.limit(k)
            source = (f"the {limit_name}" if limit == self.memory_limit[k]
                      else "its device's memory")
            summed = (f", gradient sum {size(s.gradient_bytes)}" if s.gradient_bytes
                      else "")
            out.append(
                f"stage {k} ({self._device(k)}, layers {self.plan.names[s.first]} .. "
                f"{self.plan.names[s.last]}) would not fit: it needs {size(s.memory_bytes)} "
                f"(weights {size(s.param_bytes)}, optimizer slots {size(s.optimizer_bytes)}, "
                f"activations {size(s.activation_bytes)}, stashed weights "
                f"{size(s.stash_bytes)}{summed}) but {source} is {size(limit)}. "
                f"Try {', '.join(hints)}."
            )
        return out

    def _device(self, k):
        """Stage `k`'s device name, or "-"."""
        return "-" if self.plan.devices is None else self.plan.devices[k]

    def memory_table(self):
        """The per-stage memory table (MiB), one line per stage, as a string."""
        summing = any(s.gradient_bytes for s in self.plan.stages)  # 2bw's gradient sums
        columns = ("stage", "device", "weights", "optim.", "activ.", "stash",
                   *(("grad. sum",) if summing else ()), "total", "peak", "device mem.",
                   "limit", "fits")
        rows = []
        for k, s in enumerate(self.plan.stages):
            limit = self.limit(k)
            peak = None if self.peaks is None else self.peaks[k]
            rows.append((
                str(k), self._device(k), _mib(s.param_bytes), _mib(s.optimizer_bytes),
                _mib(s.activation_bytes), _mib(s.stash_bytes),
                *((_mib(s.gradient_bytes),) if summing else ()), _mib(s.memory_bytes),
                "-" if peak is None else _mib(peak),
                "unknown" if self.device_memory[k] is None else _mib(self.device_memory[k]),
                "-" if self.memory_limit[k] is None else _mib(self.memory_limit[k]),
                "?" if limit is None else ("yes" if s.memory_bytes <= limit else "NO"),
            ))
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        return "\n".join(line.rstrip() for line in lines)

    def report(self, hints=None, problems=True):
        """The plan's table, the memory table, notes and (with `problems`) `problems(hints)`,
        as a string."""
        lines = [str(self.plan), "",
                 "Predicted memory per stage (MiB; a model: framework workspace and "
                 "allocator slack are not counted):", self.memory_table()]
        if any(m is None for m in self.device_memory):
            lines.append("device mem. unknown: the device does not report its memory (CPU "
                         "devices share the host's); only memory_limit is checked there.")
        if self.peak_note:
            lines.append(self.peak_note)
        if problems:
            lines += self.problems(hints)
        return "\n".join(lines)

    def __str__(self):
        return self.report()


def memory_hints(plan, flags=False):
    """What would keep less in memory than `plan`'s options, as keywords or as flags.

    Args:
        plan: a `PartitionPlan`.
        flags: name `train.py`'s flags (`--gpus`) rather than `PipelineModel`'s keywords.
    """
    def name(keyword, flag_text):
        return flag_text if flags else keyword

    hints = [name("more stages (devices)", f"--gpus {plan.num_stages + 1} (more stages)"),
             name("a smaller batch_size", "a smaller --batch-size")]
    if plan.mode != "sync":
        hints.append(name("mode='sync' (one mini-batch in flight)",
                          "--mode sync (one mini-batch in flight)"))
    elif plan.schedule == "gpipe":
        m = max(plan.micro_batches, 2 * plan.num_stages)
        hints.append(name(f"schedule='1f1b' with micro_batches={m}",
                          f"--schedule 1f1b --micro-batches {m}"))
    if plan.mode in STASHING and plan.num_stages >= 4:
        hints.append(name("mode='2bw' (at most one stashed weight version per stage)",
                          "--mode 2bw (at most one stashed weight version per stage)"))
    if plan.recompute == "auto":
        hints.append(name("recompute='always' (keep only stage inputs)",
                          "--recompute always (keep only stage inputs)"))
    hints.append(name("cuts='auto' with memory_limit= (cuts that fit)",
                      "--cuts auto --memory-limit SIZE (cuts that fit)"))
    return hints


def _mib(num_bytes):
    """Bytes as MiB with two decimals."""
    return f"{num_bytes / 2**20:.2f}"
