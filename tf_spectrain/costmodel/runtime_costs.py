"""The runtime's own fixed cost per mini-batch, which the cost model adds to compute (pure).

A pipeline's host does work for every mini-batch that no layer asks for: Python that
dispatches graph functions, hand-offs, losses and metrics, callbacks, and, with stages on
other hosts, remote calls. `benchmarks/floor.py` measures it with a model that computes
almost nothing (docs/RESULTS.md section 14). `RuntimeCosts` holds it as a plane in the
number of stages and of layers:

    floor(N, L, R) = batch_seconds + N * stage_seconds + L * layer_seconds
                     + R * remote_stage_seconds

seconds of host time per mini-batch for N stages holding L layers in all, R of the stages
on other hosts than the trainer's. The host's work runs beside the stages' compute (their
ops are dispatched ahead: graph calls return before their kernels end on GPUs, and the
stage threads or the graph's executor feed several devices at once), so it bounds a
mini-batch from below rather than adding to it: `predict_pipeline(..., runtime=...)` takes
`max(compute-bound time, floor)`.

`PASS_BY_PASS` and `WINDOWS` are the two runtimes as measured on this project's 2-core
machine (TensorFlow 2.21): stage threads that call a graph function per pass
(`compile(run_eagerly=True)`; `steps_per_execution=1` when they were measured), and
windows of 8 mini-batches per graph call (the default).
Their `remote_stage_seconds` is 0: what a remote call costs depends on the link, so a
caller that places stages on other hosts sets it (`dataclasses.replace`), as
`benchmarks/hosts_predict.py` does with the loopback link's measured latency per call. A
host with faster single-thread Python runs both planes proportionally faster.
"""

import dataclasses

from tf_spectrain import checks


@dataclasses.dataclass(frozen=True)
class RuntimeCosts:
    """A runtime's host time per mini-batch (see the module docstring).

    Args:
        batch_seconds: per mini-batch, whatever the number of stages, >= 0.
        stage_seconds: per stage and mini-batch, >= 0.
        layer_seconds: per layer of the model and mini-batch, >= 0.
        remote_stage_seconds: per stage on another host than the trainer's and mini-batch,
            on top of `stage_seconds`, >= 0.
        name: a label for tables.

    Raises:
        TypeError, ValueError: for a value that is not a number >= 0.
    """

    batch_seconds: float = 0.0
    stage_seconds: float = 0.0
    remote_stage_seconds: float = 0.0
    name: str = "none"
    layer_seconds: float = 0.0

    def __post_init__(self):
        for field in ("batch_seconds", "stage_seconds", "remote_stage_seconds",
                      "layer_seconds"):
            value = checks.check_number(field, getattr(self, field), 0.0,
                                        meaning="seconds per mini-batch")
            object.__setattr__(self, field, float(value))

    def floor(self, num_stages, remote_stages=0, layers=0):
        """Host seconds per mini-batch of a pipeline of `num_stages` holding `layers` layers,
        `remote_stages` of the stages on other hosts.

        Raises:
            TypeError, ValueError: for counts that are not ints in range.
        """
        n = checks.check_int("num_stages", num_stages, 1)
        r = checks.check_int("remote_stages", remote_stages, 0, n)
        layers = checks.check_int("layers", layers, 0)
        return (self.batch_seconds + n * self.stage_seconds + layers * self.layer_seconds
                + r * self.remote_stage_seconds)


NONE = RuntimeCosts()
"""No runtime cost: compute and transfers only (the cost model before issue 17)."""

# Measured with benchmarks/floor.py on 2026-12-04 (docs/data/issue17/floor.jsonl: the dense
# floor model with 8 hidden layers, vanilla, stash and both SpecTrain targets, and with 32,
# stash and paper SpecTrain; N = 1, 2, 4, 8; 3 rounds): least-squares planes through the
# medians of each (N, layers) point, 8 points each (PASS_BY_PASS's intercept, -0.11 ms,
# set to 0; RESULTS.md section 14).
PASS_BY_PASS = RuntimeCosts(batch_seconds=0.0, stage_seconds=3.72e-3, layer_seconds=0.196e-3,
                            name="pass by pass")
WINDOWS = RuntimeCosts(batch_seconds=0.20e-3, stage_seconds=0.170e-3, layer_seconds=0.044e-3,
                       name="windows of 8")


def runtime_floor(runtime, hardware, devices, layers=0):
    """The host seconds per mini-batch of stages on `devices` of `hardware` (a
    `costmodel.Hardware`; devices of hosts other than host 0 are remote) holding `layers`
    layers; 0 for None."""
    if runtime is None:
        return 0.0
    devices = list(devices)
    remote = sum(1 for d in devices if hardware.host_of(d) != 0)
    return runtime.floor(len(devices), remote, layers)


def fit_line(points):
    """Least squares `seconds = a + b * N` through `(N, seconds)` points; returns `(a, b)`,
    `a` and `b` at least 0.

    Raises:
        ValueError: for fewer than two distinct N.
    """
    points = [(float(n), float(s)) for n, s in points]
    ns = {n for n, _ in points}
    if len(ns) < 2:
        raise ValueError(f"`points` need at least two distinct N. Received: {points}")
    mean_n = sum(n for n, _ in points) / len(points)
    mean_s = sum(s for _, s in points) / len(points)
    b = (sum((n - mean_n) * (s - mean_s) for n, s in points)
         / sum((n - mean_n) ** 2 for n, _ in points))
    b = max(b, 0.0)
    return max(mean_s - b * mean_n, 0.0), b
