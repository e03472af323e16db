"""`PipelineModel.evaluate` and `predict`: Keras' inference, through the pipeline's stages.

`Inference` is a mixin of `PipelineModel`. Both copy the wrapped model's weights to the
stages first, run Keras' callbacks' `on_test_*` / `on_predict_*` hooks and pass the data
through the stages in inference mode (`tf_spectrain.runtime.inference`). `predict` works
before `compile`, with runners whose optimizer is never used.
"""

import keras
import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.partition.model_structure import output_structure
from tf_spectrain.prediction import SpecTrain
from tf_spectrain.runtime import inference as runtime_inference
from tf_spectrain.runtime.loop import has_test_batch_hooks
from tf_spectrain.runtime.stage import build_runners
from tf_spectrain.workflow import input_checks, keras_data
from tf_spectrain.workflow.output_metrics import OutputMetrics
from tf_spectrain.workflow.outputs import is_multi_output

__all__ = ["Inference"]


class Inference:
    """`evaluate` and `predict` (and `fit`'s validation, `_evaluate_logs`).

    Reads the pipeline's `model`, `stages`, `devices`, `plans`, `stall_timeout`, and after
    `compile` its `runners`, `loss` and `metrics`.
    """

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
            self._evaluator = runtime_inference.Evaluator(self.runners, self.model, self.loss,
                                                  self.metrics)
        return self._evaluator(data, batch_size, names, steps=steps, callbacks=callbacks,
                               stall_timeout=self.stall_timeout)

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
        checks.check_bool("return_dict", return_dict)
        checks.check_int("steps", steps, 1, none_ok=True)
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
        checks.check_int("steps", steps, 1, none_ok=True)
        x, _, _ = keras_data.standardize(x, batch_size=batch_size, steps=steps)
        ds, is_dataset = runtime_inference.predict_dataset(self.model, x, batch_size)
        if steps is not None:
            ds = ds.take(steps)
        self.copy_weights_to_stages()
        hooks = keras.callbacks.CallbackList(callbacks, model=self.model)
        hooks.on_predict_begin()
        outputs = runtime_inference.collect_outputs(runners, ds, is_dataset,
                                            structure=output_structure(self.model),
                                            callbacks=hooks,
                                            stall_timeout=self.stall_timeout)
        hooks.on_predict_end()
        return outputs
