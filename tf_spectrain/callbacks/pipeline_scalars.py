"""The `pipeline/*` scalars of an epoch, read from a pipeline's `PipelineState`.

`PipelineScalars` turns the stages' timelines, memory estimates and version gaps, the
schedule's bubble and the skip and probe counters into `{tag: value}` for `Telemetry`.
"""

from tf_spectrain import schedule

__all__ = ["PipelineScalars"]


class PipelineScalars:
    """Computes the per-epoch `pipeline/*` scalars (and per-stage figures) of a pipeline.

    The tags are those of `Telemetry`'s table. Busy time, utilisation and the measured
    bubble exist only for epochs run pass by pass: windows (`steps_per_execution > 1`) run
    every pass inside one graph call, without per-pass times.

    Args:
        state: the pipeline's `runtime.state.PipelineState`.
    """

    def __init__(self, state):
        self.state = state
        self._schedule_bubbles = {}  # mini-batches -> the schedule's bubble fraction

    def of_epoch(self):
        """The scalars of the current (or last) epoch.

        Returns:
            `(stats, scalars)`: a list of per-stage dicts (`stage`, `busy_seconds`,
            `utilisation`, `memory_bytes`, `in_flight_bytes`, `in_flight_micro_batches`,
            `device_peak_bytes`; busy time and utilisation None with windows) and an
            ordered `{tag: value}`.
        """
        pipe = self.state
        wall = max(pipe.epoch_seconds, 1e-9)
        timed = any(pipe.timelines)
        stats, scalars = [], {}
        for runner, plan, timeline in zip(pipe.runners, pipe.plans, pipe.timelines):
            busy = sum(end - start for _, _, start, end in timeline) if timed else None
            memory = runner.memory.estimate()
            stats.append({"stage": runner.k, "busy_seconds": busy,
                          "utilisation": None if busy is None else busy / wall,
                          "memory_bytes": memory.peak, "in_flight_bytes": memory.peak_in_flight,
                          "in_flight_micro_batches": memory.peak_micro_batches,
                          "device_peak_bytes": memory.device_peak})
            prefix = f"pipeline/stage_{runner.k}"
            scalars[f"{prefix}/memory_bytes"] = memory.peak
            scalars[f"{prefix}/in_flight_bytes"] = memory.peak_in_flight
            scalars[f"{prefix}/in_flight_micro_batches"] = memory.peak_micro_batches
            if memory.device_peak is not None:
                scalars[f"{prefix}/device_peak_bytes"] = memory.device_peak
            if timed:
                scalars[f"{prefix}/busy_seconds"] = busy
                scalars[f"{prefix}/utilisation"] = busy / wall
            scalars[f"{prefix}/s_f"] = plan.forward_steps
            s_b = plan.forward_steps if plan.backward_steps is None else plan.backward_steps
            scalars[f"{prefix}/s_b"] = s_b
        if timed:
            mean_util = sum(s["utilisation"] for s in stats) / len(stats)
            scalars["pipeline/bubble_fraction"] = max(0.0, 1.0 - mean_util)
        done = pipe.epoch_progress[1] if pipe.epoch_progress else 0
        if done:
            scalars["pipeline/bubble_fraction_schedule"] = self._schedule_bubble(done)
        scalars["pipeline/skipped_batches"] = pipe.batches_skipped
        scalars["pipeline/probe_seconds"] = sum(p.seconds for p in pipe.probes)
        return stats, scalars

    def _schedule_bubble(self, done):
        """The idle share of the schedule of a `done`-mini-batch epoch (computed once)."""
        if done not in self._schedule_bubbles:
            table = schedule.clock_table(self.state.op_lists(done))
            self._schedule_bubbles[done] = schedule.bubble_fraction(table)
        return self._schedule_bubbles[done]
