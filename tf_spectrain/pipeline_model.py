"""`PipelineModel`: train a Keras model as a pipeline of stages, with the Keras workflow.

    pipe = tf_spectrain.PipelineModel(model)  # cuts="auto": planned from measured time
    print(pipe.partition_plan)
    pipe.compile(optimizer=tf_spectrain.SpecTrainSGD(0.01, momentum=0.9), loss=..., metrics=[...])
    pipe.fit(x, y, batch_size=128, epochs=10, validation_data=(xv, yv), callbacks=[...])

This is the front only: cutting is `tf_spectrain.partition`, batching
`tf_spectrain.workflow.batching`, the epoch loop `tf_spectrain.runtime.loop`, inference
`tf_spectrain.runtime.inference`. The pipeline drains at the end of every epoch and the
trained weights are copied back into the model passed in, so callbacks, `model.save` and
`model.evaluate` see the settled weights.
"""

import contextlib
import random

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import checks, partition
from tf_spectrain import devices as devices_lib
from tf_spectrain.costmodel import autoplan
from tf_spectrain.front.model_api import ModelAPI, compile_keras_model
from tf_spectrain.partition import autocuts, user_models
from tf_spectrain.partition.model_memory import warn_if_model_on_stage_device
from tf_spectrain.partition.model_structure import output_structure
from tf_spectrain.prediction import SpecTrain
from tf_spectrain.runtime import inference
from tf_spectrain.runtime import loss_scale as loss_scale_lib
from tf_spectrain.runtime import replicas as replicas_lib
from tf_spectrain.runtime.bookkeeping import NonFiniteLossError, TrainLogs
from tf_spectrain.runtime.loop import FitLoop, has_test_batch_hooks, window_size
from tf_spectrain.runtime.stage import build_runners
from tf_spectrain.runtime.state import PipelineState, Progress
from tf_spectrain.runtime.window_epoch import WindowFunctions, WindowSetup
from tf_spectrain.schedule import modes
from tf_spectrain.workflow import (
    batching,
    compile_utils,
    deferred_build,
    input_checks,
    keras_data,
    keras_fit,
    sample_weights,
)
from tf_spectrain.workflow.outputs import OutputLoss, OutputMetrics, is_multi_output

ON_NAN = modes.ON_NAN
AUTO = autocuts.AUTO

__all__ = ["NonFiniteLossError", "PipelineModel"]


@contextlib.contextmanager
def _random_state_kept():
    """Restores Python's and NumPy's global random state on exit: placing stages creates
    layers whose initializers and seed generators draw from Python's `random` (Keras'
    default seeds), which would change what a user's script draws next (the next model's
    initial weights, a `PyDataset`'s shuffled order) against the same script in Keras."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _progress_field(name, doc):
    """A property that reads and writes the field `name` of the pipeline's `progress`."""
    return property(
        lambda self: getattr(self.progress, name),
        lambda self, value: setattr(self.progress, name, value),
        doc=f"{doc.capitalize()}.",
    )


class PipelineModel(ModelAPI):
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
            `"stash"` (PipeDream weight stashing) or `"spectrain"` (weight prediction).
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

    Attributes:
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
    ):
        model, cuts = user_models.accept(model, cuts, num_stages)  # a list: stages by hand
        modes.check_mode(mode, spectrain_target)
        input_checks.check_int("micro_batches", micro_batches, 1)
        modes.check_schedule(schedule, mode)
        checks.check_one_of("recompute", recompute, modes.RECOMPUTE)
        self.model = model
        self.mode = mode
        self.spectrain_target = spectrain_target
        self.micro_batches = int(micro_batches)
        self.schedule = schedule
        self.recompute = recompute
        self.replicas = int(replicas_lib.check_replicas(replicas))
        self.partition_plan = None
        self.planned_cuts = isinstance(cuts, str) and cuts == AUTO
        if not self.planned_cuts:
            autocuts.check_given_cuts(cuts, num_stages)
        self._grid_devices = None  # with replicas: R lists of N device names
        # One stage per device unless the model has too few places to cut (autocuts).
        self._any_stage_count = self.planned_cuts and devices is None and num_stages is None
        if self.replicas > 1:
            if devices is None and num_stages is None and self.planned_cuts:
                devices = autocuts.stage_devices(None, None)  # every GPU, else every CPU
            stages = num_stages if self.planned_cuts else len(cuts) + 1
            self._grid_devices = replicas_lib.replica_devices(devices, self.replicas, stages)
            devices, num_stages = self._grid_devices[0], None
        if self.planned_cuts:
            devices = autocuts.stage_devices(devices, num_stages)
            profile_batch_size = input_checks.check_int(
                "profile_batch_size", profile_batch_size, 1
            )
        elif devices is not None:
            partition.check_stage_devices(devices, len(cuts) + 1)
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

    def _place(self, cuts, devices, profile_batch_size, memory_limit, link_bandwidth):
        """Plans the cuts (for `"auto"`), splits the (built) model and places its stages,
        leaving Python's and NumPy's global random generators as they were."""
        with _random_state_kept():
            self._plan_and_build(cuts, devices, profile_batch_size, memory_limit,
                                 link_bandwidth)

    def _plan_and_build(self, cuts, devices, profile_batch_size, memory_limit,
                        link_bandwidth):
        """`_place`'s work."""
        if self.planned_cuts:
            if self._any_stage_count and self.replicas == 1:
                devices = autocuts.devices_for_model(self.model, devices)
            if len(devices) > 1:
                self.partition_plan = autoplan.auto_partition(
                    self.model,
                    devices,
                    batch_size=profile_batch_size,
                    mode=self.mode,
                    spectrain_target=self.spectrain_target,
                    micro_batches=self.micro_batches,
                    schedule=self.schedule,
                    recompute=self.recompute,
                    memory_limit=memory_limit,
                    link_bandwidth=link_bandwidth,
                )
            cuts = [] if self.partition_plan is None else self.partition_plan.cuts
        self._build(list(cuts), devices)
        # An extra copy on an accelerator:
        warn_if_model_on_stage_device(self.model, self.all_devices)

    def _build(self, cuts, devices):
        """Splits the model at `cuts` and places the stages on `devices` (None: defaults)."""
        self._split = partition.split_model(self.model, cuts)
        self.cuts = list(cuts)
        self.num_stages = len(self._split)
        if devices is None:
            devices = devices_lib.default_devices(self.num_stages)
        self.stages = partition.place_stages(self._split, devices)
        self.devices = list(devices)
        grid = self._grid_devices or [self.devices]
        self.replica_devices = [self.devices] + [list(d) for d in grid[1:]]
        self.replica_stages = [self.stages] + [
            partition.place_stages(self._split, d) for d in grid[1:]]
        self.replica_runners = None
        self.plans = [
            modes.pass_plan(self.mode, k, self.num_stages, self.spectrain_target)
            for k in range(self.num_stages)
        ]
        self.runners = None
        self._uncompiled_runners = None  # predict's, before compile
        self.optimizer = None
        self._evaluator = None

    def use_cuts(self, cuts):
        """Re-cuts a pipeline whose cuts were planned (`cuts="auto"`), before training.

        A restored checkpoint uses this to train at the cuts it was saved with (timings
        vary between runs, so a fresh plan may differ). The stages are rebuilt from the
        model's current weights on the same devices, and compiled again as before.

        Args:
            cuts: a list of `num_stages - 1` layer names.

        Raises:
            ValueError: if the cuts were given rather than planned and differ, the number
                of stages would change, or training has started.
            TypeError, ValueError: for cuts that are not layers of the model.
        """
        cuts = list(checks.check_instance("cuts", cuts, (list, tuple)))
        if cuts == self.cuts:
            return
        if not self.planned_cuts:
            raise ValueError(
                f"This pipeline was built with the cuts {self.cuts}; only planned cuts "
                f"(cuts='auto') can be replaced. Received: cuts={cuts}"
            )
        if len(cuts) != len(self.cuts):
            raise ValueError(
                f"`cuts` must keep the pipeline's {self.num_stages} stages "
                f"({self.num_stages - 1} cuts). Received: cuts={cuts}"
            )
        if self._loop is not None:
            raise ValueError("`use_cuts` cannot re-cut a pipeline while `fit` runs.")
        # The wrapped model holds the true weights outside `fit` (which copies them to the
        # stages first); the new stages are built from them, so nothing is copied back.
        compiled = self._compiled_with
        self._build(cuts, self.devices)
        self.partition_plan = None
        if compiled is not None:
            self.compile(*compiled)

    def compile(self, optimizer, loss, metrics=None, loss_weights=None, auto_scale_loss=True,
                steps_per_execution="auto", weighted_metrics=None, run_eagerly=False,
                jit_compile="auto"):
        """Configures training, as `keras.Model.compile`.

        Args:
            optimizer: a Keras optimizer (or its name). Each stage gets its own copy,
                built on its device. `mode="spectrain"` predicts with
                `tf_spectrain.SpecTrain(optimizer)` and wraps an optimizer that is not
                wrapped yet (`"adamw"`, `keras.optimizers.AdamW(3e-3)`); a
                `LossScaleOptimizer`'s inner optimizer is wrapped.
                `clipnorm` and `clipvalue` clip each variable's gradient, in every mode;
                `global_clipnorm` (sync mode only) clips by the norm over all stages, as
                Keras does over the whole model.
            loss: a Keras loss or its name. For a model with several outputs, as in Keras:
                one loss for every output, a list of one loss (or None) per output, or a
                dict by output name naming every output.
            metrics: list of Keras metrics or names; "accuracy" fits the loss. For several
                outputs, as in Keras: a list of one entry (a metric, a list of them, or
                None) per output, or a dict by output name; "accuracy" fits each output's
                labels and predictions.
            loss_weights: several outputs only: a list or dict (by output name) of each
                output's weight in the loss, or one number with a single loss; the loss
                trained on is the weighted sum of the outputs' losses.
            auto_scale_loss: as in Keras, a model whose dtype policy is `mixed_float16`
                scales its loss dynamically (Keras' `LossScaleOptimizer` defaults); a
                `keras.optimizers.LossScaleOptimizer` as `optimizer` always does, its inner
                optimizer copied to every stage. In sync mode the pipeline has one scale,
                in the other modes each stage its own (docs/SPECTRAIN.md, "Mixed
                precision and loss scaling"); `runners[k].loss_scale` holds stage k's.

            steps_per_execution: mini-batches per graph call, as in Keras: with K > 1 every
                stage's passes of K mini-batches (and the loss and metrics) run in one
                TensorFlow graph, whose ops run on their devices as their inputs arrive,
                with no Python between passes (`tf_spectrain.runtime.window_epoch`); the
                callbacks' per-batch hooks run once per K mini-batches, as Keras runs
                them, and a learning rate set at a batch's begin applies to the K. The
                training math is the same for every K (docs/SPECTRAIN.md section 3a).
                1 runs each pass from its stage's thread. `"auto"` (the default): 8,
                unless a callback of your own has per-batch hooks (then 1). A `fit`
                whose telemetry measures prediction errors pass by pass
                (`Telemetry(prediction_every=...)`) runs as with 1.
            weighted_metrics: as in Keras, metrics updated with the sample weights of
                `fit(sample_weight=...)`, `class_weight` or a dataset's `(x, y,
                sample_weight)` batches (`metrics` ignore them); one named as a metric of
                `metrics` logs as `weighted_<name>`.
            run_eagerly, jit_compile: accepted for Keras scripts; the stages always run
                as TensorFlow graph functions without XLA (a warning says so when set).

        Logs of a model with several outputs are Keras': `loss` (the weighted sum, layer
        losses included), `<output>_<metric>`, and `<output>_loss` (unweighted) when more
        than one output has a loss.

        Raises:
            TypeError: `metrics` not a list.
            ValueError: a `steps_per_execution` that is not "auto" or an int >= 1; a
                missing or unknown optimizer, loss or metric, a list of losses,
                weights or metrics that does not fit the outputs (or a dict naming
                something that is not an output), `loss_weights` for a model with one
                output, `global_clipnorm` outside sync mode, or loss scaling with
                replicas outside sync mode.
        """
        if self._unbuilt.hold_compile(self.compile, locals()):  # replayed once it is built
            return
        steps_per_execution = checks.check_int(
            "steps_per_execution", steps_per_execution, 1, allow=(AUTO,),
            valid="'auto' or an integer >= 1 (mini-batches per graph call)")
        compile_utils.warn_graph_options(run_eagerly, jit_compile)
        given = compile_utils.resolve_optimizer(optimizer)
        optimizer, scaling = loss_scale_lib.resolve(given, self.model, auto_scale_loss)
        loss_scale_lib.check_replicas(scaling, self.mode, self.replicas)
        if self.mode == "spectrain" and not isinstance(optimizer, SpecTrain):
            optimizer = SpecTrain(optimizer)  # predicts from the optimizer's own update
        compile_utils.check_clipping(optimizer, self.mode)
        if is_multi_output(self.model):
            self.loss = OutputLoss(self.model, loss, loss_weights)
            self.metrics = OutputMetrics(self.loss, metrics, weighted_metrics)
        else:
            if loss_weights is not None:
                raise ValueError(
                    "`loss_weights` weights the losses of a model's several outputs, but "
                    f"model '{self.model.name}' has one output; scale its loss instead. "
                    f"Received: loss_weights={loss_weights!r}"
                )
            self.loss = compile_utils.resolve_loss(loss)
            self.metrics = compile_utils.resolve_metrics(metrics, self.loss)
            self.metrics += compile_utils.resolve_weighted_metrics(
                weighted_metrics, self.metrics, self.loss)
        self.optimizer = given
        self._compiled_with = (given, loss, metrics, loss_weights, auto_scale_loss,
                               steps_per_execution, weighted_metrics)
        self.steps_per_execution = steps_per_execution
        self._train_logs = None  # the TrainLogs of every fit, made at the first
        self._windows = None  # the traced window graphs, for those logs
        for stages in self.replica_stages:  # `trainable` set since, as Keras' compile takes it
            partition.copy_trainable(self._split, stages)
        self.replica_runners = [
            build_runners(stages, devices, self.plans, optimizer, self.loss)
            for stages, devices in zip(self.replica_stages, self.replica_devices)
        ]
        self.runners = self.replica_runners[0]
        replicas_lib.attach_reducers(self.replica_runners)
        loss_scale_lib.attach(self.all_runners, scaling, shared=self.mode == "sync")
        self._evaluator = None  # made at the first evaluate, for these runners and metrics
        if optimizer.global_clipnorm:  # sync mode (check_clipping): one norm over all stages
            for runner in self.all_runners:
                runner.clip_globally(optimizer.global_clipnorm)
        # The wrapped model, compiled as Keras would be, its optimizer a view of the stages'.
        compile_keras_model(self, given, loss, metrics, loss_weights, weighted_metrics,
                            auto_scale_loss=auto_scale_loss, run_eagerly=run_eagerly,
                            jit_compile=jit_compile)


    # --- state ----------------------------------------------------------------------------

    @property
    def state(self):
        """The read-only `runtime.state.PipelineState` that callbacks read."""
        return PipelineState(self, self.progress)

    epoch_progress = _progress_field("epoch_progress", "(epoch, mini-batches done, per epoch)")
    epoch_seconds = _progress_field("epoch_seconds", "wall time of the last epoch's training")
    images_seen = _progress_field("images_seen", "training examples seen in this `fit`")
    batches_skipped = _progress_field("batches_skipped", "mini-batches skipped (on_nan='skip')")

    def window_functions(self, logs):
        """The traced window graphs of this pipeline (`runtime.window_epoch`), kept across
        `fit` calls; `logs` is the `runtime.bookkeeping.TrainLogs` they update."""
        if self._windows is None or self._windows.setup.logs is not logs.logs:
            report = 0 if self.mode == "sync" else self.num_stages - 1
            self._windows = WindowFunctions(
                WindowSetup(self._require_replica_runners(), logs.logs, self.micro_batches,
                            report))
        return self._windows

    @property
    def stage_optimizers(self):
        """Each stage's own optimizer (after `compile`)."""
        return [r.optimizer for r in self._require_compiled()]

    def _require_compiled(self):
        """The runners; raises ValueError before `compile`."""
        if self.runners is None:
            raise ValueError(
                "You must call `compile(optimizer, loss, metrics)` before using the pipeline."
            )
        return self.runners

    @property
    def all_devices(self):
        """Every stage's device, replica 0's stages first (`replicas` x `num_stages`)."""
        return [d for devices in self.replica_devices for d in devices]

    @property
    def all_runners(self):
        """Every replica's `StageRunner`s in one list, replica 0's first (after `compile`)."""
        return [r for runners in self._require_replica_runners() for r in runners]

    def _require_replica_runners(self):
        """Every replica's runners; raises ValueError before `compile`."""
        self._require_compiled()
        return self.replica_runners

    def copy_weights_to_stages(self):
        """Copies the wrapped model's weights (BatchNorm statistics included) to the stages
        (of every replica)."""
        for stages in self.replica_stages:
            partition.copy_weights(self._split, stages)

    def copy_weights_to_model(self):
        """Copies the stages' weights (BatchNorm statistics included) into `model`.

        With replicas, each non-trainable weight (BatchNorm's statistics) is first set to
        its mean over the replicas, in every replica.
        """
        replicas_lib.average_non_trainable(self.replica_stages)
        partition.copy_weights(self.stages, self._split)

    def sync_replicas(self):
        """Copies replica 0's weights and optimizer state into the other replicas.

        A restored checkpoint (which holds replica 0) calls it; nothing to do without
        replicas.
        """
        if self.replicas > 1:
            replicas_lib.broadcast_first(
                self.replica_stages,
                [[r.optimizer for r in runners] for runners in self._require_replica_runners()],
            )

    def request_stop(self):
        """Ends training soon and cleanly: no further mini-batch is fed, those in flight
        finish and update, callbacks see the end of the (shortened) epoch, then `fit`
        returns. Safe to call from any thread or a signal handler.
        """
        self.model.stop_training = True
        loop = self._loop
        if loop is not None:
            loop.request_stop()

    # --- fit / evaluate / predict -----------------------------------------------------------

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        verbose="auto",
        callbacks=None,
        validation_split=0.0,
        validation_data=None,
        shuffle=True,
        class_weight=None,
        sample_weight=None,
        initial_epoch=0,
        steps_per_epoch=None,
        validation_steps=None,
        validation_batch_size=None,
        validation_freq=1,
        on_nan="stop",
    ):
        """Trains the pipeline, as `keras.Model.fit`; returns a `keras.callbacks.History`.

        The arguments are Keras' (in Keras' order), with `on_nan` added.

        Args:
            x, y: arrays (`y` labels; for several outputs a list of one array per output,
                or a dict by output name; NumPy, tensors or pandas), or `x` a
                `tf.data.Dataset` of `(x, y)` or `(x, y, sample_weight)` batches, or
                anything else Keras' data adapters take (a `keras.utils.PyDataset`, a
                generator of batches: give `steps_per_epoch` where its length is unknown).
            batch_size: for arrays; default 32.
            epochs: train until this epoch index.
            verbose: 0 silent, 1 progress bar, 2 one line per epoch, "auto" = 1.
            callbacks: Keras callbacks; they see the wrapped model, holding the true
                weights at every epoch end. Those with a `set_pipeline(pipeline)` method
                are given this pipeline first (they may read `pipeline.state`).
            validation_split: a float in [0, 1): as in Keras, the last fraction of the
                arrays (before shuffling) is not trained on but validated on.
            validation_data: `(x_val, y_val)`, `(x_val, y_val, sample_weight_val)` or a
                dataset, evaluated at the end of the epochs `validation_freq` picks.
            shuffle: shuffle arrays every epoch (datasets are used as given).
            class_weight: a dict `{class index: weight}` (one output only): each
                example's loss (and the weighted metrics) weighted by its class's weight.
            sample_weight: an array of one weight per example (arrays only), weighting
                the loss and `compile`'s `weighted_metrics` as in Keras.
            initial_epoch: the epoch to start at (for resuming).
            steps_per_epoch: mini-batches per epoch (the data iterator then continues
                across epochs); needed for an infinite dataset or a generator. Without it
                a `tf.data.Dataset` of unknown length (after `filter`) is counted by one
                pass over it first, with a warning.
            validation_steps: None, or validate on only this many batches.
            validation_batch_size: the batch size of validation arrays (default
                `batch_size`).
            validation_freq: validate every this many epochs (an int), or after the
                epochs in a list (1-based), as in Keras.
            on_nan: what a non-finite loss does. `"stop"` raises `NonFiniteLossError`
                naming the step, the stage that first produced a non-finite value and its
                learning rate. `"skip"`: every stage leaves out an update whose gradient
                is not finite and the batch is left out of the metrics (the count is in
                `batches_skipped`).

        Returns:
            The `keras.callbacks.History` of the run.

        Raises:
            ValueError: before training, for bad arguments (`epochs`, `batch_size`, data
                of mismatched lengths, an infinite dataset without `steps_per_epoch`)
                or when `compile` was not called; during training,
                the first error of any stage or callback, re-raised with its traceback.

        A callback that sets `model.stop_training` (or a call of `request_stop`) ends
        training after the mini-batches already in the pipeline: the pipeline drains,
        `on_epoch_end` runs for the shortened epoch (without validation) and `fit` returns.
        `epoch_progress` then says how far the epoch got.
        """
        x = self._unbuilt.build(x)  # a Sequential without an `Input`: built from `x`
        self._require_compiled()
        several = is_multi_output(self.model)
        x, y, sample_weight, validation_data = keras_data.fit_data(
            x, y, sample_weight, batch_size, steps_per_epoch, shuffle, class_weight,
            validation_split, validation_data, several)
        input_checks.check_fit_args(
            self.model, self.loss, x=x, y=y, batch_size=batch_size, epochs=epochs,
            verbose=verbose, callbacks=callbacks, validation_data=validation_data,
            shuffle=shuffle, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
        )
        input_checks.check_validation_args(validation_steps, validation_batch_size,
                                           validation_freq)
        checks.check_one_of("on_nan", on_nan, ON_NAN)
        feed = batching.EpochFeed(
            self.model, self.loss, x, y, batch_size, shuffle, steps_per_epoch,
            self.micro_batches, sample_weight=sample_weight,
        )
        # As Keras' first step: callbacks monitoring a metric read its direction there.
        labels = sample_weights.unpack(feed.dataset.element_spec[1])[0]
        keras_fit.build_metrics(self.model, labels)
        for runner in self.all_runners:
            runner.skip_non_finite = on_nan == "skip"
        for callback in callbacks or ():
            if hasattr(callback, "set_pipeline"):
                callback.set_pipeline(self)
        self.progress.images_seen = self.progress.batches_skipped = 0
        verbose = 1 if verbose == "auto" else verbose
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, model=self.model,
            verbose=verbose, epochs=epochs, steps=feed.num_batches,
        )
        history = next(c for c in callback_list.callbacks if isinstance(c, keras.callbacks.History))
        self.copy_weights_to_stages()
        self.model.stop_training = False

        def next_batches(epoch):
            return feed.batches(self.shuffle_seed, self.epochs_trained)

        def validate(epoch):
            if not input_checks.validation_due(epoch, validation_freq):
                return {}
            callback_list.on_test_begin()  # as Keras' fit: evaluate(callbacks=callbacks)
            per_batch = callback_list if has_test_batch_hooks(callbacks) else None
            logs = self._evaluate_logs(validation_data, validation_batch_size or batch_size,
                                       steps=validation_steps, callbacks=per_batch)
            callback_list.on_test_end(logs)
            return logs

        if self._train_logs is None:
            self._train_logs = TrainLogs(self.all_runners, self.metrics, self.progress)
        window = window_size(self.steps_per_execution, callbacks)
        self._loop = FitLoop(self, callback_list, self._train_logs, feed.num_batches, on_nan,
                             window)
        try:
            self._loop.run(
                initial_epoch, epochs, next_batches, None if validation_data is None else validate
            )
        finally:
            self._loop = None
            feed.close()
        return history

    def _forward_runners(self):
        """The stages' runners for `predict` before `compile` (their optimizers unused)."""
        if self._uncompiled_runners is None:
            unused = keras.optimizers.SGD()
            if self.mode == "spectrain":
                unused = SpecTrain(unused)
            self._uncompiled_runners = build_runners(
                self.stages, self.devices, self.plans, unused, None)
        return self._uncompiled_runners

    def _evaluate_logs(self, data, batch_size, names=None, steps=None, callbacks=None):
        """Loss and metrics on `data` through the stages (see `runtime.inference`)."""
        if self._evaluator is None:
            self._evaluator = inference.Evaluator(self.runners, self.model, self.loss,
                                                  self.metrics)
        return self._evaluator(data, batch_size, names, steps=steps, callbacks=callbacks)

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict=False):
        """Loss and metrics on the data (inference mode), as `keras.Model.evaluate`.

        Uses the wrapped model's current weights (they are copied to the stages first).

        Args:
            x, y: arrays (`x` one per model input: a list, or a dict by input name; `y`
                likewise per output), or `x` a `tf.data.Dataset` of `(x, y)` batches.
            batch_size: for arrays; default 32.
            verbose: 0 prints nothing; otherwise one line with the results.
            sample_weight: an array of one weight per example (arrays only), weighting
                the loss and `compile`'s `weighted_metrics`, as in Keras.
            steps: None for all the data, else only the first `steps` batches.
            callbacks: Keras callbacks: their `on_test_*` hooks run, each batch's as its
                results arrive (with the running logs), as in Keras.
            return_dict: return `{"loss": ..., metric: ...}` instead of a list.

        Returns:
            The loss (no metrics), a list `[loss, *metrics]` (for several outputs in
            Keras' order: loss, per-output losses, then the other logs by name), or a
            dict.

        Raises:
            TypeError: for data that is not arrays or a dataset, or a non-bool
                `return_dict`.
            ValueError: if `compile` was not called, for bad `batch_size` or `verbose`,
                or data that does not fit the model (the message gives both shapes).
        """
        x = self._unbuilt.build(x)  # a Sequential without an `Input`: built from `x`
        self._require_compiled()
        input_checks.check_verbose(verbose)
        input_checks.check_bool("return_dict", return_dict)
        input_checks.check_int("steps", steps, 1, none_ok=True)
        x, y, sample_weight = keras_data.standardize(
            x, y, sample_weight, batch_size, steps, multi_output=is_multi_output(self.model))
        data = x if isinstance(x, tf.data.Dataset) else (x, y, sample_weight)
        self.copy_weights_to_stages()
        hooks = keras.callbacks.CallbackList(callbacks, model=self.model)
        hooks.on_test_begin()
        per_batch = hooks if has_test_batch_hooks(callbacks) else None  # else no host reads
        logs = self._evaluate_logs(data, batch_size, names=("x", "y"), steps=steps,
                                   callbacks=per_batch)
        hooks.on_test_end(logs)
        if verbose not in (0, "auto") and verbose:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in logs.items()))
        if return_dict:
            return logs
        if isinstance(self.metrics, OutputMetrics):
            return self.metrics.evaluate_values(logs)  # Keras' order
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """Model outputs for `x` (arrays or a dataset of inputs), as a NumPy array.

        Uses the wrapped model's current weights (they are copied to the stages first).

        Args:
            x: an array (for several inputs a list of arrays, or a dict by input name), or
                a `tf.data.Dataset` of input batches (`(x, y)` batches are accepted, as in
                Keras).
            batch_size: for arrays; default 32.
            verbose: accepted for Keras compatibility; nothing is printed.
            steps: None for all of `x`, else only the first `steps` batches.
            callbacks: Keras callbacks: their `on_predict_*` hooks run, each batch's as
                its outputs arrive, as in Keras.

        Returns:
            The model's outputs for all of `x`, concatenated along the batch axis: an
            array, or for several outputs one array each, in the model's output structure
            (a list, or a dict by output name), as Keras' `predict` returns them.

        Raises:
            TypeError: if `x` is not arrays or a dataset.
            ValueError: for bad `batch_size` or `verbose`, or inputs that do not fit the
                model (the message gives both shapes).

        As in Keras, `predict` works before `compile`.
        """
        x = self._unbuilt.build(x)  # a Sequential without an `Input`: built from `x`
        runners = self.runners or self._forward_runners()  # Keras predicts before compile
        input_checks.check_verbose(verbose)
        input_checks.check_int("steps", steps, 1, none_ok=True)
        x, _, _ = keras_data.standardize(x, batch_size=batch_size, steps=steps)
        ds, is_dataset = inference.predict_dataset(self.model, x, batch_size)
        if steps is not None:
            ds = ds.take(steps)
        self.copy_weights_to_stages()
        hooks = keras.callbacks.CallbackList(callbacks, model=self.model)
        hooks.on_predict_begin()
        outputs = inference.collect_outputs(runners, ds, is_dataset,
                                            structure=output_structure(self.model),
                                            callbacks=hooks)
        hooks.on_predict_end()
        return outputs
