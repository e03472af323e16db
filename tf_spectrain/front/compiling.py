"""`PipelineModel.compile`: the loss, metrics and each stage's runner with its optimizer.

`Compiling` is a mixin of `PipelineModel`. `compile` resolves Keras' compile arguments
(`tf_spectrain.workflow.compile_utils`, `workflow.outputs` for several outputs), wraps the
optimizer in `SpecTrain` for `mode="spectrain"`, builds every replica's
`runtime.stage.StageRunner`s (each with its own copy of the optimizer), attaches the
replicas' gradient reducers and the loss scaling, then compiles the wrapped Keras model as
Keras would have (`front.model_api.compile_keras_model`). A Sequential without an `Input`
holds the call until its first data have built it (`workflow.deferred_build`).
"""

from tf_spectrain import checks, partition, prediction
from tf_spectrain.front.model_api import compile_keras_model
from tf_spectrain.prediction import SpecTrain
from tf_spectrain.runtime import loss_scale as loss_scale_lib
from tf_spectrain.runtime import replicas as replicas_lib
from tf_spectrain.runtime.stage import build_runners
from tf_spectrain.workflow import compile_utils
from tf_spectrain.workflow.output_metrics import OutputMetrics
from tf_spectrain.workflow.outputs import OutputLoss, is_multi_output

__all__ = ["Compiling"]

_AUTO = "auto"


def _loss_and_metrics(model, loss, metrics, loss_weights, weighted_metrics):
    """`compile`'s loss and metrics for `model`: `OutputLoss`/`OutputMetrics` for several
    outputs, else a Keras loss and a list of metrics (weighted ones included)."""
    if is_multi_output(model):
        loss = OutputLoss(model, loss, loss_weights)
        return loss, OutputMetrics(loss, metrics, weighted_metrics)
    if loss_weights is not None:
        raise ValueError(
            "`loss_weights` weights the losses of a model's several outputs, but "
            f"model '{model.name}' has one output; scale its loss instead. "
            f"Received: loss_weights={loss_weights!r}"
        )
    loss = compile_utils.resolve_loss(loss)
    resolved = compile_utils.resolve_metrics(metrics, loss)
    resolved += compile_utils.resolve_weighted_metrics(weighted_metrics, resolved, loss)
    return loss, resolved


class Compiling:
    """`compile`, and the runners it builds (`runners`, `all_runners`, `stage_optimizers`).

    Reads the pipeline's `model`, `options`, placed stages and devices; sets `loss`,
    `metrics`, `optimizer`, `steps_per_execution`, `run_eagerly`, `runners` and
    `replica_runners`.
    """

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
                1 (Keras' default) is a graph call per mini-batch, whose passes still
                overlap across the stages. `"auto"` (the default): 8, unless a callback
                of your own has per-batch hooks, the stages are on workers' CPUs
                (docs/RESULTS.md section 18) or the `fit` trains fewer than 64
                mini-batches in all (windows of one build three small graphs for any
                length of epoch): then 1. The telemetry's prediction errors are
                measured inside the windows.
            weighted_metrics: as in Keras, metrics updated with the sample weights of
                `fit(sample_weight=...)`, `class_weight` or a dataset's `(x, y,
                sample_weight)` batches (`metrics` ignore them); one named as a metric of
                `metrics` logs as `weighted_<name>`.
            run_eagerly: as Keras' debugging switch: True runs pass by pass, each pass
                its own graph call from its stage's thread with Python between passes
                (many times slower per mini-batch; a failing op's error names its stage,
                pass and mini-batch), whatever `steps_per_execution` says. The passes
                themselves still run as TensorFlow graph functions (a warning says so).
            jit_compile: as in Keras: True compiles every stage's passes (forwards,
                backwards, updates, inference) with XLA, each pass on its own; `"auto"`
                (the default) does so where Keras' own `fit` would use XLA (with a GPU,
                not on a CPU-only machine); False never. A layer that says XLA cannot
                compile it (`supports_jit = False`) turns XLA off for every stage, as
                Keras turns it off for the whole model (with a warning naming the
                layers).

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
            "steps_per_execution", steps_per_execution, 1, allow=(_AUTO,),
            valid="'auto' or an integer >= 1 (mini-batches per graph call)")
        compile_utils.warn_graph_options(run_eagerly)
        compile_utils.warn_layers_without_xla(self.model, jit_compile)
        given = compile_utils.resolve_optimizer(optimizer)
        optimizer, scaling = loss_scale_lib.resolve(given, self.model, auto_scale_loss)
        loss_scale_lib.check_replicas(scaling, self.mode, self.replicas)
        if self.mode == "spectrain" and not isinstance(optimizer, SpecTrain):
            optimizer = SpecTrain(optimizer)  # predicts from the optimizer's own update
        if self.mode == "nesterov":
            prediction.check_nesterov_optimizer(optimizer)
        _check_2bw_rate(optimizer, self.options.updates_every(self.num_stages))
        compile_utils.check_clipping(optimizer, self.mode)
        self.loss, self.metrics = _loss_and_metrics(self.model, loss, metrics, loss_weights,
                                                    weighted_metrics)
        self.optimizer = given
        self._compiled_with = (given, loss, metrics, loss_weights, auto_scale_loss,
                               steps_per_execution, weighted_metrics, run_eagerly, jit_compile)
        self.steps_per_execution = steps_per_execution
        self.run_eagerly = bool(run_eagerly)
        self._train_logs = None  # the TrainLogs of every fit, made at the first
        self._windows = None  # the traced window graphs, for those logs
        for stages in self.replica_stages:  # `trainable` set since, as Keras' compile takes it
            partition.copy_trainable(self._split, stages)
        self.replica_runners = [
            build_runners(stages, devices, self.plans, optimizer, self.loss,
                          nesterov=self.mode == "nesterov")
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
        # XLA per stage where Keras' own fit would use it (its resolution of "auto").
        for runner in self.all_runners:
            runner.passes.use_xla(bool(getattr(self.model, "jit_compile", False)))

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
    def all_runners(self):
        """Every replica's `StageRunner`s in one list, replica 0's first (after `compile`)."""
        return [r for runners in self._require_replica_runners() for r in runners]

    def _require_replica_runners(self):
        """Every replica's runners; raises ValueError before `compile`."""
        self._require_compiled()
        return self.replica_runners


def _check_2bw_rate(optimizer, every):
    """Refuses a `LearningRateSchedule` when 2bw holds gradients (`every` > 1): Keras steps
    it by the optimizer's update count, and 2bw's rule is the group's last mini-batch's."""
    rate = getattr(prediction.unwrapped(optimizer), "_learning_rate", None)
    if every > 1 and callable(rate):
        raise ValueError(
            "mode '2bw' with a learning-rate schedule is not supported: Keras steps the "
            f"schedule once per update, and 2bw updates once per {every} mini-batches, so "
            "the schedule would run that many times slower. Set the rate per mini-batch "
            "with a callback instead (keras.callbacks.LearningRateScheduler), or use a "
            f"constant rate. Received: learning_rate={rate!r}"
        )
