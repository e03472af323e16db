"""What callbacks may read of a pipeline while it trains: `Progress` and `PipelineState`.

The epoch loop (`runtime.loop`) writes a `Progress`; callbacks read it, and the stages'
optimizers, timelines and schedules, through the read-only `PipelineState` that
`PipelineModel.state` returns. The one thing a callback may ask of the runtime through it
is to measure the weight-prediction error (`attach_probes`, `detach_probes`).
"""

import dataclasses

from tf_spectrain.runtime import probe


@dataclasses.dataclass
class Progress:
    """Counters of the current (or last) `fit`, written by the epoch loop."""

    epoch_progress: tuple = None  # (epoch, mini-batches done in it, mini-batches per epoch)
    epoch_seconds: float = 0.0  # wall time of the last epoch's training part (no validation)
    images_seen: int = 0  # training examples reported so far in this `fit`
    batches_skipped: int = 0  # mini-batches left out by on_nan="skip" in this `fit`


class PipelineState:
    """A read-only view of a pipeline for callbacks (`PipelineModel.state`).

    No attribute can be set. The only request that changes the runtime is the measurement of
    weight-prediction errors: `attach_probes` gives the stages `runtime.probe.WeightProbe`s
    (read back from `probes`), `detach_probes` removes them.

    Attributes:
        num_stages, mode, spectrain_target, micro_batches, schedule, recompute, devices,
            cuts: the pipeline's configuration.
        plans: each stage's `modes.PassPlan` (the version gaps it uses).
        runners: each stage's `runtime.stage.StageRunner` (after `compile`; empty before).
        stage_optimizers: each stage's optimizer (after `compile`; empty before).
        epoch_progress: `(epoch, mini-batches done, mini-batches per epoch)` of the
            current or last epoch, or None before the first.
        epoch_seconds: wall time of the last epoch's training part.
        images_seen: training examples reported so far in this `fit`.
        batches_skipped: mini-batches left out by `on_nan="skip"` in this `fit`.
        timelines: per stage, the `(kind, key, start, end)` of every pass of the epoch.
        memory: per stage, the bytes it kept alive in the epoch (`MemoryEstimate`).
        probes: the attached `WeightProbe`s, in stage order (stages without one left out).
    """

    def __init__(self, pipeline, progress):
        self._pipeline = pipeline
        self._progress = progress

    def __getattr__(self, name):
        if name in _PIPELINE_FIELDS:
            return getattr(self._pipeline, name)
        if name in _PROGRESS_FIELDS:
            return getattr(self._progress, name)
        raise AttributeError(f"`PipelineState` has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"`PipelineState` is read-only: cannot set {name!r}")

    @property
    def devices(self):
        """The stages' devices, as a tuple."""
        return tuple(self._pipeline.devices)

    @property
    def cuts(self):
        """The names of the layers that end each stage but the last, as a tuple."""
        return tuple(self._pipeline.cuts)

    @property
    def plans(self):
        """Each stage's `modes.PassPlan`, as a tuple."""
        return tuple(self._pipeline.plans)

    @property
    def runners(self):
        """Each stage's `StageRunner`, as a tuple (empty before `compile`)."""
        return tuple(self._pipeline.runners or ())

    @property
    def stage_optimizers(self):
        """Each stage's optimizer, as a tuple (empty before `compile`)."""
        return tuple(r.optimizer for r in self.runners)

    @property
    def timelines(self):
        """Per stage, the `(kind, key, start, end)` of every pass of the epoch, as tuples."""
        return tuple(tuple(r.timeline) for r in self.runners)

    @property
    def memory(self):
        """Each stage's `runtime.memory.MemoryEstimate` of the current or last epoch."""
        return tuple(r.memory.estimate() for r in self.runners)

    @property
    def probes(self):
        """The stages' attached `runtime.probe.WeightProbe`s, as a tuple in stage order."""
        return tuple(r.probe for r in self.runners if r.probe is not None)

    def op_lists(self, num_batches):
        """Each stage's instruction list (`schedule.op_lists`) for `num_batches` batches."""
        p = self._pipeline
        return p.options.op_lists(p.num_stages, num_batches)

    def attach_probes(self, every):
        """Measures the weight-prediction error of the stages' passes until `detach_probes`.

        Every stage of a pipeline of two or more whose passes aim at later weights
        (`modes.probe_horizons`) gets a `runtime.probe.WeightProbe`; the measurements are
        read from `probes`. The `Telemetry` callback attaches them at the start of `fit`.

        Args:
            every: measure mini-batches `0, every, 2 * every, ...` of each epoch.

        Returns:
            The attached probes (`probes`).
        """
        p = self._pipeline
        probe.attach_probes(self.runners, p.options.mode, p.options.spectrain_target, every)
        return self.probes

    def detach_probes(self):
        """Removes the stages' probes (at the end of `fit`): their passes are not measured."""
        probe.detach_probes(self.runners)


_PIPELINE_FIELDS = frozenset(
    {"num_stages", "mode", "spectrain_target", "micro_batches", "schedule", "recompute"})
_PROGRESS_FIELDS = frozenset(f.name for f in dataclasses.fields(Progress))
