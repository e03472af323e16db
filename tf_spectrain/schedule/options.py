"""`PipelineOptions`: how a pipeline runs, checked once, shared by the planner and the runtime.

`PipelineModel` takes these options as keywords, checks them here into one frozen object
and hands that object on: the cost model (`costmodel.StageTerms`,
`costmodel.auto_partition`) prices the stages the options describe, and the front builds
the stages' runners from them. Each option is checked in this one place. Pure Python: it
stands on the schedule floor, below both the cost model and the runtime.

    options = PipelineOptions(mode="sync", micro_batches=4, schedule="1f1b")
    options.pass_plans(3)  # one `modes.PassPlan` per stage
"""

import dataclasses

from tf_spectrain import checks
from tf_spectrain.schedule import modes
from tf_spectrain.schedule.instructions import op_lists

__all__ = ["PipelineOptions"]


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """The options of a pipeline, checked when made (see `PipelineModel` for each).

    Attributes:
        mode: one of `modes.PIPELINE_MODES`: "sync", "vanilla", "stash", "spectrain",
            "nesterov" or "2bw".
        spectrain_target: "paper" or "consistent" (used by `mode="spectrain"`).
        micro_batches: `M`, micro-batches per mini-batch (any mode), an int >= 1.
        schedule: one of `modes.SCHEDULES`: "gpipe" (every mode) or "1f1b" (sync only).
        recompute: one of `modes.RECOMPUTE`: "auto" (stages whose backward runs at other
            weights than their forward) or "always" (every stage).
        replicas: `R`, copies of the pipeline, an int >= 1.
        accumulate: mode "2bw"'s mini-batches per update, an int >= N, or None for N
            (`modes.check_accumulate`; `updates_every` gives it once N is known).

    Raises:
        TypeError, ValueError: for an invalid option (the message names it).
    """

    mode: str = "spectrain"
    spectrain_target: str = "paper"
    micro_batches: int = 1
    schedule: str = "gpipe"
    recompute: str = "auto"
    replicas: int = 1
    accumulate: int | None = None

    def __post_init__(self):
        """Checks every option, in the order `PipelineModel` lists them."""
        modes.check_mode(self.mode, self.spectrain_target)
        micro_batches = checks.check_int(
            "micro_batches", self.micro_batches, 1, meaning="micro-batches per mini-batch")
        modes.check_schedule(self.schedule, self.mode)
        checks.check_one_of("recompute", self.recompute, modes.RECOMPUTE)
        replicas = checks.check_int("replicas", self.replicas, 1,
                                    meaning="copies of the pipeline")
        accumulate = modes.check_accumulate(self.accumulate, self.mode)
        if self.accumulate is not None:
            object.__setattr__(self, "accumulate", accumulate)
        object.__setattr__(self, "micro_batches", micro_batches)  # NumPy ints as ints
        object.__setattr__(self, "replicas", replicas)

    @classmethod
    def given(cls, options=None, **keywords):
        """`options` if given (then `keywords` must be the defaults), else one of `keywords`.

        For functions that take either a `PipelineOptions` or the options as keywords.

        Raises:
            TypeError: if `options` is neither None nor a `PipelineOptions`.
            ValueError: if both `options` and non-default keywords are given.
        """
        from_keywords = cls(**keywords)
        if options is None:
            return from_keywords
        checks.check_instance("options", options, cls)
        if from_keywords != cls():
            raise ValueError(
                "Pass the pipeline's options either as `options` or as keywords, not both. "
                f"Received: options={options!r} and {from_keywords!r}"
            )
        return options

    def pass_plans(self, num_stages):
        """Each stage's `modes.PassPlan` in a pipeline of `num_stages` stages."""
        return [modes.pass_plan(self.mode, k, num_stages, self.spectrain_target)
                for k in range(num_stages)]

    def updates_every(self, num_stages):
        """Mini-batches per update with `num_stages` stages: `accumulate` (or N) in mode
        "2bw", else 1. Raises ValueError when `accumulate` is below N."""
        return modes.check_accumulate(self.accumulate, self.mode, num_stages)

    def op_lists(self, num_stages, num_batches):
        """Each stage's instruction list (`schedule.op_lists`) for an epoch of `num_batches`."""
        return op_lists(self.mode, num_stages, num_batches, self.micro_batches, self.schedule)

    def planned(self):
        """The options a plan is priced with, as keywords (all but `replicas`)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "replicas"}
