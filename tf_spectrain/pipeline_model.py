"""`PipelineModel`: train a Keras model as a pipeline of stages, with the Keras workflow.

    pipe = tf_spectrain.PipelineModel(model)  # cuts="auto": planned from measured time
    print(pipe.partition_plan)
    pipe.compile(optimizer=tf_spectrain.SpecTrainSGD(0.01, momentum=0.9), loss=..., metrics=[...])
    pipe.fit(x, y, batch_size=128, epochs=10, validation_data=(xv, yv), callbacks=[...])

This is the face only: its options are one `schedule.options.PipelineOptions`, and its
methods are `tf_spectrain.front`'s mixins: `placement` (devices, cuts, stages), `compiling`,
`fitting`, `inference` (evaluate, predict) and `model_api` (the rest of `keras.Model`).
Cutting is `tf_spectrain.partition`, batching `tf_spectrain.workflow.batching`, the epoch
loop `tf_spectrain.runtime.loop`, inference `tf_spectrain.runtime.inference`. The pipeline
drains at the end of every epoch and the trained weights are copied back into the model
passed in, so callbacks, `model.save` and `model.evaluate` see the settled weights.
"""

import numpy as np

from tf_spectrain.front.compiling import Compiling
from tf_spectrain.front.fitting import Fitting
from tf_spectrain.front.inference import Inference
from tf_spectrain.front.model_api import ModelAPI
from tf_spectrain.front.placement import StagePlacement
from tf_spectrain.partition import autocuts, user_models
from tf_spectrain.partition.cuts import AUTO
from tf_spectrain.runtime import stall
from tf_spectrain.runtime.bookkeeping import NonFiniteLossError
from tf_spectrain.runtime.stall import PipelineStalledError
from tf_spectrain.runtime.state import PipelineState, Progress
from tf_spectrain.schedule.options import PipelineOptions
from tf_spectrain.workflow import deferred_build

__all__ = ["NonFiniteLossError", "PipelineModel", "PipelineStalledError"]


def _progress_field(name, doc):
    """A property that reads and writes the field `name` of the pipeline's `progress`."""
    return property(
        lambda self: getattr(self.progress, name),
        lambda self, value: setattr(self.progress, name, value),
        doc=f"{doc.capitalize()}.",
    )


def _option(name):
    """A read-only property: the field `name` of the pipeline's `options`."""
    return property(lambda self: getattr(self.options, name),
                    doc=f"`options.{name}` (see `PipelineOptions`).")


class PipelineModel(Fitting, Inference, Compiling, StagePlacement, ModelAPI):
    """A Keras model trained as a pipeline of stages on several devices.

    Args:
        model: a functional or Sequential `keras.Model` (every layer called once; nested
            functional models are cut as one graph of their layers; custom layers need
            not be serialisable). After `fit` it holds the trained weights. A Sequential
            without an `Input` is built from the first data `fit`, `evaluate` or
            `predict` sees, as Keras builds it; cutting, placing and `compile` wait until
            then (`stages` is None before). A subclassed model (one that overrides
            `call`) cannot be cut automatically: split it by hand and pass a list of
            stages, `[stage0, stage1, ...]`, each a Keras model or layer (subclassed
            ones too) that takes what the previous stage returns; each is one stage (so
            `cuts` is left out), and the pipeline's `model` is a Keras model chaining
            them (see `tf_spectrain.partition.stage_list`).
        cuts: `"auto"` (the default) to plan the cuts from measured time, or a list of
            layer names; each ends a stage, so there are `len(cuts) + 1` stages. With
            `"auto"` every layer's forward and backward is timed on the stage devices at
            `profile_batch_size` (on random inputs; BatchNorm statistics are restored),
            the cuts that make the slowest stage fastest are chosen (its hand-offs and,
            in `vanilla` and paper `spectrain` or with `recompute="always"`, the recomputed
            forward included), checked by timing the planned stages and re-planned with
            those timings (see
            `tf_spectrain.costmodel.auto_partition`). `partition_plan` then shows the
            plan; `fit` never re-cuts.
        devices: one device name per stage (names may repeat), or None for the first
            `N` distinct devices, GPUs first (see `tf_spectrain.setup_devices`).
        num_stages: with `cuts="auto"`, the number of stages; None means `len(devices)`,
            else every GPU if there are any, else every logical CPU device. With a list of
            cuts it must be `len(cuts) + 1` or None.
        mode: `"sync"` (sequential SGD, no staleness), `"vanilla"` (naive pipelining),
            `"stash"` (PipeDream weight stashing), `"spectrain"` (weight prediction),
            `"nesterov"` (stashing, and each stage's optimizer in its Nesterov form with
            the momentum raised by the stage's delay: Ajanthan et al. 2025; for SGD,
            Adam, AdamW and Nadam) or `"2bw"` (PipeDream-2BW: stashing with one update per
            `accumulate` mini-batches, so at most two weight versions per stage).
            SPECTRAIN.md sections 4 and 6e give each mode's exact rule.
        spectrain_target: `"paper"` (the paper's version gaps, backward recomputed at its
            own predicted weights) or `"consistent"` (one prediction per mini-batch,
            reused by the backward). Only used by `mode="spectrain"`.
        micro_batches: M, split every mini-batch into this many micro-batches (in every
            mode): each stage runs a mini-batch's M micro-batches back to back, handing
            each on as it is done, sums their gradients and updates once per mini-batch
            (SPECTRAIN.md section 5a). They save activation memory only with 1F1B-flush
            in sync mode, or with `recompute="always"`.
        schedule: the order of a mini-batch's micro-batches in sync mode: `"gpipe"` (the
            default: all M forwards, then all M backwards, so every stage keeps M
            micro-batches' activations) or `"1f1b"` (1F1B-flush, as PipeDream-Flush and
            DAPPLE: stage k keeps at most `min(N - k, M)`). Both give the same result.
            Only `"gpipe"` outside sync mode (whose schedule is fixed by its staleness).
        recompute: `"auto"` (the default: a stage recomputes its forward in the backward
            only where the backward's weights differ from the forward's) or `"always"`:
            every stage keeps only its inputs (and, where the backward reuses the
            forward's weights across updates, a copy of those weights) and recomputes
            the forward in every backward, with the forward's dropout masks and
            BatchNorm state: the same result for less activation memory, at the cost of
            one more forward per backward.
        replicas: R, the copies of the pipeline (a data x pipeline hybrid, see
            `tf_spectrain.runtime.replicas`): `devices` then names R x N devices, replica
            r's stage k at `r * N + k` (None: the first R x N devices). Each mini-batch is
            split evenly across the replicas, and stage k's R copies sum their gradients
            with TensorFlow's collective all-reduce before every update, so they keep the
            same weights and optimizer state and take the steps one pipeline takes with
            the same batch (BatchNorm normalises each replica's share of the batch, and its
            statistics are averaged over the replicas at every epoch end). `evaluate` and
            `predict` run on replica 0.
        profile_batch_size: with `cuts="auto"`, the batch size to profile and plan at
            (use the training batch size, over `replicas`; `train.py` passes
            `--batch-size` / `--replicas`).
        memory_limit: with `cuts="auto"`, None or the bytes each device may hold (a
            number, or a list of one per stage): plans whose stage needs more (weights,
            optimizer slots, the activations and weight versions of its micro-batches in
            flight, as `schedule`, `micro_batches` and `recompute` keep them, in the
            layers' compute dtype) are left out; a `costmodel.MemoryLimitError` says what
            the plan needing least memory needs when none fits.
        link_bandwidth: with `cuts="auto"`, bytes/s between neighbouring devices; None
            measures it between GPUs and takes CPU devices' hand-offs as free.
        stall_timeout: seconds (default 60) in which some stage must finish a pass during
            `fit`, `evaluate` and `predict` (the clock stops while callbacks run and while
            a pass is traced); otherwise the call stops with a `PipelineStalledError`
            listing each stage's device, the instruction it is on and what it waits for
            (which mini-batch from which neighbour, or the data). None never stops. A
            thread stuck inside an op cannot be stopped (TensorFlow cannot cancel a running
            op): it is left behind, and these stages refuse to run until it returns.
        accumulate: mode `"2bw"`'s mini-batches per update: their mean gradient is
            applied once per `accumulate` mini-batches (and at the epoch's end), with the
            learning rate of the group's last. None (the default) means N, the least that
            keeps two weight versions. 2bw runs each pass as its own graph call (not in
            `steps_per_execution` windows).

    Attributes:
        options: the `schedule.options.PipelineOptions` of `mode`, `spectrain_target`,
            `micro_batches`, `schedule`, `recompute`, `replicas` and `accumulate` (each also an
            attribute of the pipeline), checked once, shared with the planner.
        cuts: the cut layer names (chosen or given). `partition_plan`: the
            `costmodel.PartitionPlan` of `cuts="auto"` (`print(pipe.partition_plan)`
            shows a table), else None (given cuts, a one-stage pipeline, or after
            `use_cuts`). `planned_cuts`: whether
            the cuts were planned, so that `use_cuts` (and a checkpoint's cuts) may
            replace them.
        stages: the per-stage Keras models, each on its device. `runners`: each stage's
            `runtime.stage.StageRunner` (after `compile`). `plans`: each stage's
            `modes.PassPlan`. `progress`: the `runtime.state.Progress` of `fit`.
        shuffle_seed, epochs_trained: shuffled arrays are ordered in epoch `e` by a
            function of both (a checkpoint holds them, so resumed runs see the same data),
            or, under a global seed (`keras.utils.set_random_seed`), in the one order
            Keras' `fit` takes them in every epoch (`keras_data.keras_order`).

    Raises:
        TypeError: if `model` is not a Keras model or a list of Keras layers, or
            `cuts`/`devices` have wrong types.
        ValueError: for an unknown mode or target, bad `micro_batches`, cuts that are not
            layers of the model (or out of order, repeated, leaving a stage empty), a
            subclassed model (the message says how to pipeline it) or one with shared
            layers, a list of stages with `cuts`, devices that do not exist or do not
            match the number of stages, or too few devices for None.
    """

    def __init__(
        self,
        model,
        cuts="auto",
        devices=None,
        num_stages=None,
        mode="spectrain",
        spectrain_target="paper",
        micro_batches=1,
        schedule="gpipe",
        recompute="auto",
        replicas=1,
        profile_batch_size=32,
        memory_limit=None,
        link_bandwidth=None,
        stall_timeout=stall.DEFAULT_TIMEOUT,
        accumulate=None,
    ):
        model, cuts = user_models.accept(model, cuts, num_stages)  # a list: stages by hand
        self.options = PipelineOptions(mode, spectrain_target, micro_batches, schedule,
                                       recompute, replicas, accumulate)
        self.stall_timeout = stall_timeout
        self.model = model
        self.partition_plan = None
        self.planned_cuts = isinstance(cuts, str) and cuts == AUTO
        if not self.planned_cuts:
            autocuts.check_given_cuts(cuts, num_stages)
        devices, profile_batch_size = self._stage_devices(cuts, devices, num_stages,
                                                          profile_batch_size)
        self._compiled_with = None
        self.cuts = self.num_stages = self.stages = self.runners = None  # set by _place
        # A Sequential without an `Input` is cut and placed at its first data (deferred_build).
        self._unbuilt = deferred_build.BuildOnData(model, lambda: self._place(
            cuts, devices, profile_batch_size, memory_limit, link_bandwidth))
        if not self._unbuilt.waiting:
            self._unbuilt.place()
        self.progress = Progress()
        self._loop = None  # the FitLoop of a `fit` in progress
        # From the state of NumPy's global generator, so keras.utils.set_random_seed fixes
        # it, without drawing from it: a script's later np.random data stay Keras'.
        keys, position = np.random.get_state()[1:3]
        self.shuffle_seed = int(np.random.default_rng([*keys[:8].tolist(), position])
                                .integers(0, 2**31 - 1))
        self.epochs_trained = 0  # epochs run by fit so far (the order of the next shuffle)

    mode = _option("mode")
    spectrain_target = _option("spectrain_target")
    micro_batches = _option("micro_batches")
    schedule = _option("schedule")
    recompute = _option("recompute")
    replicas = _option("replicas")
    accumulate = _option("accumulate")

    @property
    def stall_timeout(self):
        """Seconds in which some stage must finish a pass, or None (see the constructor)."""
        return self._stall_timeout

    @stall_timeout.setter
    def stall_timeout(self, value):
        self._stall_timeout = stall.check_timeout(value)

    # --- state ----------------------------------------------------------------------------

    @property
    def state(self):
        """The read-only `runtime.state.PipelineState` that callbacks read."""
        return PipelineState(self, self.progress)

    epoch_progress = _progress_field("epoch_progress", "(epoch, mini-batches done, per epoch)")
    epoch_seconds = _progress_field("epoch_seconds", "wall time of the last epoch's training")
    images_seen = _progress_field("images_seen", "training examples seen in this `fit`")
    batches_skipped = _progress_field("batches_skipped", "mini-batches skipped (on_nan='skip')")
