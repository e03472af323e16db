"""What one candidate pipeline stage costs, in time and memory: the planner's terms (pure).

The planner (`planning.plan_partition`) compares many candidate stages: the layers
`first..last` of the profile, run as stage `k` of `N`. `StageTerms` prices one such stage,
and is the only place that knows what a stage pays for; a new schedule or precision
extends it here. Each mini-batch of `b` examples runs as `M = micro_batches` micro-batches
of `b / M` (in every mode), one update per mini-batch.

Time, seconds per mini-batch at the planned batch size (the profile's times scaled
linearly and divided by `relative_speed`; the same for both `sync` schedules):
- `forward` and `backward`: the layers' profiled times.
- `recompute`: the forward again, on stages that recompute it in their backward. With
  `recompute="auto"`, those whose backward runs at other weights than their forward
  (`vanilla` and paper `spectrain`; never the last stage, whose forward and backward run
  back to back on the same weights); with `"always"`, every stage in every mode.
- `send`: the hand-offs: activations to the next stage and gradients to the previous one,
  `M * latency + bytes / bandwidth` each (the bytes of every tensor crossing the cut, the
  latency once per micro-batch), over the link of that hop (`hop_links`: the one between
  hosts where the hop crosses them).
- `allreduce`: with `replicas` R > 1 copies of the pipeline, the ring all-reduce of the
  stage's gradients over its R copies before each update (`links.ring_seconds` over
  the stage's `ring_links`); each copy then runs `batch / R` examples.

Memory, bytes on the stage's device:
- `param_bytes`: trainable weights. `optimizer_bytes`: `optimizer_slots` copies of them
  (1 for momentum SGD, 2 for Adam). In `nesterov` each stage runs the Nesterov form of
  the optimizer (SPECTRAIN.md 6e), with the same slots: Nesterov SGD keeps SGD's momentum,
  and NAdam, for Adam and AdamW, keeps Adam's two (and one scalar, left out). Plain SGD
  (`optimizer_slots=0`) gets a momentum raised by the stage's delay, `s_k * 0.99 / N > 0`,
  so every stage but the last then pays one slot.
- `activation_bytes`: what the micro-batches in flight keep (`in_flight`). Stage `k` of an
  asynchronous pipeline holds up to `N - k` mini-batches between their forward and their
  backward (`schedule.max_stashed`), all `M` micro-batches of each; `sync` with
  `schedule="gpipe"` the `M` micro-batches of one mini-batch; `sync` with `"1f1b"` at most
  `min(N - k, M)` micro-batches. A stage that reuses its forward keeps every layer's
  outputs and its inputs for each; one that recomputes keeps only its inputs, plus one
  micro-batch's outputs while it recomputes.
- `stash_bytes`: weight versions the in-flight mini-batches hold besides the current
  weights (one per version, whatever `M` and `recompute`): `N - k - 1` in `stash` and
  `nesterov` (one update per mini-batch: each of the `N - k` in flight has its own
  version, the newest being the current weights), at most one in `2bw` (one update per
  `A >= N` mini-batches, so the `N - k` in flight span at most two versions: the current
  one and one older; none on the last stage, whose one mini-batch in flight runs at the
  current weights), `N - k` predicted ones in consistent `spectrain`, one predicted
  version at a time in paper `spectrain`, none in `sync` and `vanilla`, nor on a stage
  that predicts `s = 0` steps ahead (the last stage in consistent `spectrain`, and in
  paper `spectrain` with `N <= 2`): it runs at its current weights.
- `gradient_bytes`: in `2bw` with `A > 1` mini-batches per update, the sum of the group's
  gradients held between updates (`runtime.update`), one gradient-sized buffer (the
  weights' bytes); 0 in the other modes, whose gradient lives only from a backward to its
  update.

Sizes are the profile's, and `profile_model` reads them from the tensors themselves: under
a Keras mixed-precision policy (`mixed_float16`, `mixed_bfloat16`) activations and
hand-offs count 2 bytes per element, weights (so optimizer slots, stashes and 2bw's
gradient sum, of the float32 weights' gradients) 4.

It is a model: framework workspace, BatchNorm statistics and allocator slack are left out.
"""

import dataclasses
import math

from tf_spectrain import checks
from tf_spectrain import schedule as schedule_lib
from tf_spectrain.costmodel import term_checks
from tf_spectrain.costmodel.links import link_seconds, ring_seconds
from tf_spectrain.schedule import modes
from tf_spectrain.schedule.options import PipelineOptions

SCHEDULES = modes.SCHEDULES  # sync mode's orders: "gpipe", "1f1b"
RECOMPUTE = modes.RECOMPUTE  # "auto", "always"
STASHING = ("stash", "nesterov")
"""The modes that stash one weight version per mini-batch in flight (`N - k - 1` on stage
k). `2bw` keeps at most one, plus a gradient-sized sum: less than these from 4 stages on."""


@dataclasses.dataclass(frozen=True)
class StageEstimate:
    """The predicted cost of one stage (see the module docstring for each term).

    Attributes:
        index: the stage index `k`.
        first, last: positions of its first and last layer in the profile.
        forward, backward, recompute, send: seconds per mini-batch.
        param_bytes, optimizer_bytes, activation_bytes, stash_bytes: bytes on its device.
        sent_bytes: bytes per mini-batch it hands to the next stage (0 for the last).
        allreduce: seconds per mini-batch of its gradients' all-reduce over the replicas
            (0 for one pipeline).
        gradient_bytes: bytes of the gradient sum held between updates (mode `2bw`), else 0.
    """

    index: int
    first: int
    last: int
    forward: float
    backward: float
    recompute: float
    send: float
    param_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    stash_bytes: float
    sent_bytes: float
    allreduce: float = 0.0
    gradient_bytes: float = 0.0

    @property
    def seconds(self):
        """Seconds per mini-batch: compute, recompute, hand-offs and all-reduce."""
        return self.forward + self.backward + self.recompute + self.send + self.allreduce

    @property
    def memory_bytes(self):
        """Bytes the stage needs on its device."""
        return (self.param_bytes + self.optimizer_bytes + self.activation_bytes
                + self.stash_bytes + self.gradient_bytes)

    @property
    def weight_versions(self):
        """Weight versions the stage holds at most: its current weights and those stashed
        (`1 + stash_bytes / param_bytes`; 1 for a stage without weights)."""
        if not self.param_bytes:
            return 1
        return 1 + self.stash_bytes / self.param_bytes


class StageTerms:
    """Prices candidate stages of a pipeline (see the module docstring).

    Args:
        profiles: a `ModelProfile`, or a list of `num_stages` profiles of the same layers,
            one per stage's device (stages on different kinds of device).
        batch_size: examples per mini-batch, an int >= 1.
        num_stages: `N`, an int >= 1.
        mode: one of `modes.PIPELINE_MODES`.
        spectrain_target: "paper" or "consistent".
        micro_batches: `M`, micro-batches per mini-batch (any mode), an int >= 1; each
            hand-off pays the latency once per micro-batch.
        bandwidth: bytes/s of the link between neighbouring devices, > 0 (`math.inf`:
            free hand-offs).
        latency: seconds per transfer, >= 0.
        optimizer_slots: optimizer variables per weight, a number >= 0.
        relative_speed: how many times faster the devices compute than the profile
            measured, > 0.
        replicas: `R`, copies of the pipeline, an int >= 1; each runs `batch_size / R`
            examples per mini-batch.
        hop_links: None (every hop has the link `bandwidth`, `latency`) or, per hop
            `k -> k + 1`, a list of the `(bandwidth, latency)` of its R copies, which run
            at the same time: the slowest prices the hop (`Hardware.links`).
        ring_links: None (no all-reduce) or, per stage, the `(bandwidth, latency)` of the
            hops of the ring over its R copies (`Hardware.ring_links`).
        schedule: one of `SCHEDULES`: "gpipe" (every mode) or "1f1b" (`sync` only).
        recompute: one of `RECOMPUTE`: "auto" (where the backward's weights differ) or
            "always" (every stage).
        options: a `schedule.options.PipelineOptions` (as `PipelineModel.options`) in
            place of `mode`, `spectrain_target`, `micro_batches`, `replicas`, `schedule`,
            `recompute` and `accumulate`, which are then left at their defaults.
        accumulate: mode "2bw"'s mini-batches per update `A`, an int >= N, or None for N.

    Attributes:
        options: the `PipelineOptions` priced; `mode`, `spectrain_target`,
            `micro_batches`, `schedule`, `recompute` and `replicas` are its fields.
        updates_every: mini-batches per update: `A` in mode "2bw", else 1.

    Raises:
        TypeError, ValueError: for invalid arguments (in mode "2bw", `accumulate` below N).
    """

    def __init__(
        self,
        profiles,
        batch_size,
        num_stages,
        mode="spectrain",
        spectrain_target="paper",
        micro_batches=1,
        bandwidth=math.inf,
        latency=0.0,
        optimizer_slots=1,
        relative_speed=1.0,
        replicas=1,
        hop_links=None,
        ring_links=None,
        schedule="gpipe",
        recompute="auto",
        options=None,
        accumulate=None,
    ):
        self.num_stages = checks.check_int("num_stages", num_stages, 1, meaning="stages")
        self.profiles = term_checks.check_profiles(profiles, self.num_stages)
        self.batch_size = checks.check_int(
            "batch_size", batch_size, 1, meaning="examples per mini-batch"
        )
        self.options = PipelineOptions.given(
            options, mode=mode, spectrain_target=spectrain_target, micro_batches=micro_batches,
            schedule=schedule, recompute=recompute, replicas=replicas, accumulate=accumulate)
        self.updates_every = self.options.updates_every(self.num_stages)  # raises for A < N
        self.mode, self.spectrain_target = self.options.mode, self.options.spectrain_target
        self.schedule, self.recompute = self.options.schedule, self.options.recompute
        self.micro_batches, self.replicas = self.options.micro_batches, self.options.replicas
        self.bandwidth = checks.check_number(
            "bandwidth", bandwidth, 0.0, strict=True, allow_inf=True, meaning="bytes per second"
        )
        self.latency = checks.check_number("latency", latency, 0.0, meaning="seconds")
        self.optimizer_slots = checks.check_number(
            "optimizer_slots", optimizer_slots, 0.0, meaning="optimizer variables per weight"
        )
        speed = checks.check_number("relative_speed", relative_speed, 0.0, strict=True)
        self.hop_links = term_checks.check_links(
            "hop_links", hop_links, self.num_stages - 1, [(self.bandwidth, self.latency)]
        )
        self.ring_links = term_checks.check_links("ring_links", ring_links, self.num_stages, [])
        examples = self.batch_size / self.replicas
        self.last_layer = len(self.profiles[0]) - 1
        self._sums = {}
        for profile in self.profiles:
            if id(profile) not in self._sums:
                scale = examples / profile.batch_size / speed
                self._sums[id(profile)] = _PrefixSums(profile, scale, examples)
        ref = self.profiles[0]
        self._crossing = [layer.output_bytes * examples for layer in ref.layers]
        # transfer(bytes crossing after layer p, hop) for every p: stage k sends on hop k
        # and receives on hop k - 1 (the default link at the ends).
        tables = {None: [self.transfer(b) for b in self._crossing]}
        for hop in range(self.num_stages - 1):
            if self.hop_links[hop] != [(self.bandwidth, self.latency)]:
                tables[hop] = [self.transfer(b, hop) for b in self._crossing]
        self._sent_seconds = [tables.get(k, tables[None]) for k in range(self.num_stages)]
        self._received_seconds = [tables.get(k - 1, tables[None]) for k in range(self.num_stages)]
        self._plans = self.options.pass_plans(self.num_stages)

    def recomputes(self, k):
        """Whether stage `k` recomputes its forward in its backward."""
        if self.recompute == "always":
            return True
        return not self._plans[k].reuses_forward and k != self.num_stages - 1

    def in_flight(self, k):
        """Micro-batches (of `batch_size / M` examples) stage `k` holds from F to B, at most."""
        m = self.micro_batches
        if self.mode != "sync":
            return self.batches_in_flight(k) * m
        return m if self.schedule == "gpipe" else min(self.num_stages - k, m)

    def batches_in_flight(self, k):
        """Mini-batches stage `k` has between their forward and their backward, at most."""
        if self.mode == "sync":
            return 1
        return schedule_lib.max_stashed(k, self.num_stages, self.num_stages)

    def transfer(self, num_bytes, hop=None):
        """Seconds to hand `num_bytes` (one mini-batch's tensors) to a neighbour.

        Args:
            num_bytes: bytes per replica, >= 0.
            hop: the hop `k` (between stages k and k + 1) whose links to use; None (or a
                hop out of `0 .. N - 2`): the link `bandwidth`, `latency`.
        """
        if hop is None or not 0 <= hop < self.num_stages - 1:
            links = [(self.bandwidth, self.latency)]
        else:
            links = self.hop_links[hop]
        return link_seconds(links, num_bytes, self.micro_batches)

    def allreduce(self, num_bytes, k):
        """Seconds of stage `k`'s all-reduce of `num_bytes` of gradients over its replicas."""
        return ring_seconds(self.ring_links[k], num_bytes)

    def estimate(self, first, last, k):
        """Prices the layers `first..last` as stage `k`.

        Args:
            first, last: layer positions, `0 <= first <= last <= len(profile) - 1`.
            k: the stage index, `0 <= k < num_stages`.

        Returns:
            A `StageEstimate`.
        """
        sums = self._sums[id(self.profiles[k])]
        forward, backward = sums.times(first, last)
        params = sums.params_between(first, last)
        return StageEstimate(
            index=k,
            first=first,
            last=last,
            forward=forward,
            backward=backward,
            recompute=forward if self.recomputes(k) else 0.0,
            send=self._sends(first, last, k),
            param_bytes=params,
            optimizer_bytes=self.slots(k) * params,
            activation_bytes=self._activation_bytes(first, last, k),
            stash_bytes=self.stashed_versions(k) * params,
            sent_bytes=self._handed_bytes(first, last)[0],
            allreduce=self.allreduce(params, k),
            gradient_bytes=self.gradient_buffers() * params,
        )

    def seconds(self, first, last, k):
        """`estimate(first, last, k).seconds`, without building the estimate."""
        sums = self._sums[id(self.profiles[k])]
        forward, backward = sums.times(first, last)
        recompute = forward if self.recomputes(k) else 0.0
        seconds = forward + backward + recompute + self._sends(first, last, k)
        if self.replicas > 1:
            seconds += self.allreduce(sums.params_between(first, last), k)
        return seconds

    def _sends(self, first, last, k):
        """Seconds of stage `k`'s hand-offs: activations on (hop k), gradients back (k - 1)."""
        on = 0.0 if last == self.last_layer else self._sent_seconds[k][last]
        return on + (self._received_seconds[k][first - 1] if first > 0 else 0.0)

    def memory_bytes(self, first, last, k):
        """`estimate(first, last, k).memory_bytes`, without building the estimate."""
        params = self._sums[id(self.profiles[k])].params_between(first, last)
        copies = 1 + self.slots(k) + self.stashed_versions(k) + self.gradient_buffers()
        return params * copies + self._activation_bytes(first, last, k)

    def _handed_bytes(self, first, last):
        """Bytes per mini-batch sent on after `last` and received before `first`."""
        sent = 0.0 if last == self.last_layer else self._crossing[last]
        received = self._crossing[first - 1] if first > 0 else 0.0
        return sent, received

    def _activation_bytes(self, first, last, k):
        """What stage `k`'s mini-batches in flight keep (see the module docstring)."""
        sums = self._sums[id(self.profiles[k])]
        acts = sums.acts[last + 1] - sums.acts[first]
        inputs = self._crossing[first - 1] if first > 0 else sums.input_bytes
        n = self.in_flight(k)
        kept = n * inputs + acts if self.recomputes(k) else n * (inputs + acts)
        return kept / self.micro_batches  # a micro-batch's bytes: 1 / M of a mini-batch's

    def slots(self, k):
        """Optimizer variables per weight on stage `k` (module docstring): `optimizer_slots`,
        but at least 1 where mode "nesterov" gives plain SGD a momentum (delay > 0)."""
        if self.mode == "nesterov" and modes.stage_delay(k, self.num_stages) > 0:
            return max(self.optimizer_slots, 1)
        return self.optimizer_slots

    def stashed_versions(self, k):
        """Weight versions stage `k` keeps besides its current weights (module docstring)."""
        n = self.batches_in_flight(k)
        if self.mode in STASHING:
            return n - 1
        if self.mode == "2bw":
            # One update per A >= N mini-batches: the n <= N - k in flight span at most two
            # versions, and only the newest is the current weights (modes.check_accumulate).
            return min(n - 1, 1)
        plan = self._plans[k]
        if self.mode != "spectrain" or not (plan.forward_steps or plan.backward_steps):
            return 0  # no prediction (s = 0): the stage runs at its current weights
        return n if self.spectrain_target == "consistent" else 1

    def gradient_buffers(self):
        """Gradient-sized buffers a stage holds between updates: 1 in mode "2bw" with more
        than one mini-batch per update (the group's gradient sum), else 0."""
        return 1 if self.mode == "2bw" and self.updates_every > 1 else 0


class _PrefixSums:
    """Prefix sums of one profile's times (scaled) and sizes, for O(1) stage sums."""

    def __init__(self, profile, scale, batch_size):
        self.fwd, self.bwd, self.params, self.acts = [0.0], [0.0], [0.0], [0.0]
        for layer in profile.layers:
            self.fwd.append(self.fwd[-1] + layer.forward_time * scale)
            self.bwd.append(self.bwd[-1] + layer.backward_time * scale)
            self.params.append(self.params[-1] + layer.weight_bytes)
            self.acts.append(self.acts[-1] + layer.activation_bytes * batch_size)
        self.input_bytes = profile.input_bytes * batch_size

    def times(self, first, last):
        """Forward and backward seconds of layers `first..last`."""
        return self.fwd[last + 1] - self.fwd[first], self.bwd[last + 1] - self.bwd[first]

    def params_between(self, first, last):
        """Weight bytes of layers `first..last`."""
        return self.params[last + 1] - self.params[first]
