"""The Keras model API on a `PipelineModel`: what a script calls on the model it replaced.

`ModelAPI` is a mixin of `PipelineModel`. Outside `fit` the wrapped Keras model
(`pipe.model`) holds the true weights (`fit`, `evaluate` and `predict` copy them to the
stages first, and `fit` copies the stages' back at every epoch end), so what reads or writes
weights, saves, loads or describes the model goes to it; `train_on_batch`, `test_on_batch`
and `predict_on_batch` run one batch through the pipeline. Any other public attribute of
`keras.Model` is read from the wrapped model (`__getattr__`), except those that would change
the model the pipeline was cut from (`add`, `pop`, `quantize`) or train it outside the
pipeline (`train_step`, ...): they raise an error that says what to do instead.

`compile_keras_model` (the last step of `PipelineModel.compile`) compiles the wrapped model
as `keras.Model.compile` would have been, with the same loss, metrics, loss weights and
weighted metrics, its optimizer a view of the stages' optimizer state
(`tf_spectrain.workflow.optimizer_view`). Files that `model.save`, `ModelCheckpoint` and
`BackupAndRestore` write then reload compiled with `keras.models.load_model` (or
`load_weights`), with the update count, learning rate and slots of the pipeline.

`isinstance(pipe, keras.Model)` is False, by design: a `keras.Model` subclass tracks every
attribute it is given (the stage copies and the wrapped model would become sub-layers, their
weights counted and saved twice), its `metrics`, `loss`, `optimizer` and `layers` have
other meanings than the pipeline's, and `keras.Model.save` of it would serialise the
pipeline object. Code that needs a `keras.Model` takes `pipe.model`.
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.prediction.slots import device_of
from tf_spectrain.workflow import keras_fit, optimizer_view
from tf_spectrain.workflow.output_metrics import OutputMetrics

__all__ = ["ModelAPI", "compile_keras_model", "share_optimizer_state"]

_CHANGES_THE_MODEL = ("add", "pop", "quantize", "compile_from_config", "build_from_config")
_TRAINS_OUTSIDE = ("train_step", "test_step", "predict_step", "make_train_function",
                   "make_test_function", "make_predict_function")


def compile_keras_model(pipe, optimizer, loss, metrics=None, loss_weights=None,
                        weighted_metrics=None, **options):
    """Compiles `pipe.model` as Keras would have, its optimizer sharing the stages' state.

    The model's optimizer is `optimizer_view.keras_optimizer(optimizer)` (the optimizer
    itself, or for a `SpecTrain` wrapper the Keras optimizer it trains with), built on the
    model's trainable weights, its variables then the stages' (`share_optimizer_state`).
    `pipe.optimizer` becomes `pipe.model.optimizer`.

    Args:
        pipe: the `PipelineModel`, its runners built.
        optimizer: the optimizer instance `PipelineModel.compile` was given.
        loss, metrics, loss_weights, weighted_metrics: `compile`'s arguments, as given.
        **options: other `keras.Model.compile` arguments (`auto_scale_loss`,
            `run_eagerly`, `jit_compile`, `steps_per_execution`); None (and a
            `steps_per_execution` of `"auto"`) is left out.
    """
    options = {k: v for k, v in options.items()
               if v is not None and not (k == "steps_per_execution" and v == "auto")}
    pipe.model.compile(optimizer=optimizer_view.keras_optimizer(optimizer), loss=loss,
                       metrics=metrics, loss_weights=loss_weights,
                       weighted_metrics=weighted_metrics, **options)
    pipe.optimizer = pipe.model.optimizer
    share_optimizer_state(pipe)


def share_optimizer_state(pipe):
    """Builds the wrapped model's optimizer and points its variables at the stages' (replica 0's).

    Does nothing before `compile` or while the wrapped model is not built (call it again
    once it is).

    Args:
        pipe: the `PipelineModel`.

    Returns:
        The number of the model optimizer's variables shared with the stages.
    """
    model, runners = pipe.model, pipe.runners
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or runners is None or not model.built:
        return 0
    weights = model.trainable_variables
    device = device_of(weights[0]) if weights else None
    with tf.device(device) if device else contextlib.nullcontext():
        optimizer.build(weights)
    pairs = [[(m, s) for m, s in zip(split.weights, stage.weights) if m.trainable]
             for split, stage in zip(pipe._split, pipe.stages)]  # noqa: SLF001 - its own
    return optimizer_view.share_state(optimizer, [r.optimizer for r in runners], pairs)


def _batch_size(x, method):
    """The number of examples in a batch of arrays (its first array's length)."""
    if isinstance(x, tf.data.Dataset) or x is None:
        raise TypeError(
            f"`{method}` takes one batch of arrays or tensors (a list or dict of them for "
            f"several inputs), as in Keras. Received: x={x!r}"
        )
    first = tf.nest.flatten(x)[0]
    shape = getattr(first, "shape", None) or np.shape(first)
    if not shape:
        raise ValueError(
            f"`{method}` needs arrays with a batch dimension. Received: an input of "
            f"shape {tuple(shape)}"
        )
    return int(shape[0])


def _as_numpy(data):
    """Tensors in `data` as NumPy arrays (the pipeline's batching takes arrays)."""
    return tf.nest.map_structure(lambda a: a.numpy() if tf.is_tensor(a) else a, data)


class ModelAPI:
    """The `keras.Model` methods and attributes a script uses, on a `PipelineModel`.

    Reads and writes of weights, saving, loading and descriptions go to the wrapped model
    (`pipe.model`, which holds the true weights outside `fit`); the `*_on_batch` methods run
    the pipeline. Other public `keras.Model` attributes are read from the wrapped model.
    """

    def __getattr__(self, name):
        model = self.__dict__.get("model")
        if name.startswith("_") or model is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        if name in _CHANGES_THE_MODEL:
            raise AttributeError(
                f"`{type(self).__name__}.{name}` is not available: it would change the Keras "
                f"model '{model.name}' after the pipeline was cut from it. Finish the model "
                "first, then wrap it: `tf_spectrain.PipelineModel(model)`."
            )
        if name in _TRAINS_OUTSIDE:
            raise AttributeError(
                f"`{type(self).__name__}.{name}` is not available: it would run the Keras "
                "model outside the pipeline. Use `fit`, `train_on_batch`, `test_on_batch` "
                f"or `predict_on_batch`, or `pipeline.model.{name}` for the unsplit model."
            )
        try:
            return getattr(model, name)
        except AttributeError:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}' (nor has its "
                f"Keras model '{model.name}')"
            ) from None

    def __dir__(self):
        model = self.__dict__.get("model")
        names = set(super().__dir__())
        if model is not None:
            names.update(n for n in dir(model) if not n.startswith("_")
                         and n not in _CHANGES_THE_MODEL + _TRAINS_OUTSIDE)
        return sorted(names)

    def __call__(self, *args, **kwargs):
        """Calls the wrapped Keras model itself (one device, not the pipeline), as `model(x)`."""
        return self.model(*args, **kwargs)

    # --- what the model is --------------------------------------------------------------

    @property
    def name(self):
        """The wrapped model's name."""
        return self.model.name

    @property
    def layers(self):
        """The wrapped model's layers (the pipeline's stages share them)."""
        return self.model.layers

    def get_layer(self, name=None, index=None):
        """The wrapped model's layer of that name or index, as `keras.Model.get_layer`."""
        return self.model.get_layer(name=name, index=index)

    @property
    def inputs(self):
        """The wrapped model's symbolic inputs."""
        return self.model.inputs

    @property
    def outputs(self):
        """The wrapped model's symbolic outputs."""
        return self.model.outputs

    def summary(self, *args, print_fn=None, **kwargs):
        """Prints the wrapped model's summary (`keras.Model.summary`), then one line on the
        pipeline: its mode, stages, devices and cuts."""
        self.model.summary(*args, print_fn=print_fn, **kwargs)
        if self.stages is None:  # a Sequential without an Input: cut at its first data
            (print_fn or print)(f"Pipeline ({self.mode}): cut at the first fit, evaluate or "
                                "predict, once the data have built the model")
            return
        (print_fn or print)(
            f"Pipeline: {self.num_stages} stages ({self.mode}) on {', '.join(self.devices)}, "
            f"cut after {', '.join(self.cuts) or 'nothing'}"
            + (f"; {self.replicas} replicas" if self.replicas > 1 else "")
        )

    def count_params(self):
        """The number of the wrapped model's weights (each stage holds a part of them)."""
        return self.model.count_params()

    def to_json(self, **kwargs):
        """The wrapped model's architecture as JSON, as `keras.Model.to_json`."""
        return self.model.to_json(**kwargs)

    @property
    def metrics_names(self):
        """The names of the results `evaluate` (and the `*_on_batch` methods) return, in their
        order; for several outputs known once labels were seen (`['loss']` before). Keras 3
        names its metric containers here instead: `['loss', 'compile_metrics']`."""
        metrics = self.__dict__.get("metrics")
        if metrics is None:
            return []
        if not isinstance(metrics, OutputMetrics):
            return ["loss"] + [m.name for m in metrics]
        if not metrics.built:
            return ["loss"]
        logs = metrics.logs(keras.metrics.Mean(name="loss"))
        names = metrics.evaluate_values({n: n for n in logs})  # the names, in that order
        return [names] if isinstance(names, str) else names

    # --- weights ------------------------------------------------------------------------

    @property
    def weights(self):
        """The wrapped model's weights: the true ones outside `fit` (at epoch ends in it)."""
        return self.model.weights

    @property
    def trainable_weights(self):
        """The wrapped model's trainable weights."""
        return self.model.trainable_weights

    @property
    def non_trainable_weights(self):
        """The wrapped model's non-trainable weights (BatchNorm statistics, ...)."""
        return self.model.non_trainable_weights

    @property
    def variables(self):
        """The wrapped model's variables."""
        return self.model.variables

    @property
    def trainable_variables(self):
        """The wrapped model's trainable variables."""
        return self.model.trainable_variables

    @property
    def non_trainable_variables(self):
        """The wrapped model's non-trainable variables."""
        return self.model.non_trainable_variables

    def get_weights(self):
        """The wrapped model's weights as NumPy arrays (the pipeline's, outside `fit`)."""
        return self.model.get_weights()

    def set_weights(self, weights):
        """Sets the wrapped model's weights; the next `fit`/`evaluate`/`predict` copies them
        to the stages."""
        self.model.set_weights(weights)

    # --- files --------------------------------------------------------------------------

    def save(self, filepath, *args, **kwargs):
        """Saves the wrapped model, compiled, with the pipeline's optimizer state, as
        `keras.Model.save` (`keras.models.load_model` reloads it without tf_spectrain,
        unless its layers or optimizer are tf_spectrain's)."""
        self.model.save(filepath, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        """Saves the wrapped model's weights and the pipeline's optimizer state, as
        `keras.Model.save_weights`."""
        self.model.save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        """Loads weights (and optimizer state, when the file has it and the pipeline is
        compiled) into the wrapped model and every stage's optimizer, as
        `keras.Model.load_weights`; the next `fit`/`evaluate`/`predict` copies the weights
        to the stages."""
        self.model.load_weights(filepath, *args, **kwargs)
        keras_fit.after_load(self)

    # --- training state -----------------------------------------------------------------

    @property
    def stop_training(self):
        """The wrapped model's `stop_training`, which callbacks set to end `fit` early."""
        return self.model.stop_training

    @stop_training.setter
    def stop_training(self, value):
        self.model.stop_training = value

    @property
    def history(self):
        """The `keras.callbacks.History` of the last `fit`, as `keras.Model.history`."""
        return self.model.history

    # --- one batch ----------------------------------------------------------------------

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None,
                       return_dict=False):
        """Trains on one batch through the pipeline, as `keras.Model.train_on_batch`.

        A one-epoch `fit` of this batch alone, without callbacks or output: every stage
        updates once, the pipeline drains and the wrapped model gets the new weights. It
        does not count as an epoch (`epochs_trained`, which orders shuffled data, and
        `model.history` stay as they were).

        Args:
            x: the inputs (an array, or a list or dict of them), one batch.
            y: the targets.
            sample_weight, class_weight: as in `fit` (at most one of them).
            return_dict: return a dict of the logs instead of a list.

        Returns:
            The batch's loss and metrics: the loss alone without metrics, else a list in
            `evaluate`'s order (`metrics_names`), or a dict.

        Raises:
            TypeError: `x` that is not arrays, or a non-bool `return_dict`.
            ValueError: as `fit` (not compiled, data that does not fit the model).
        """
        checks.check_bool("return_dict", return_dict)
        size = _batch_size(x, "train_on_batch")
        x, y, sample_weight = _as_numpy((x, y, sample_weight))
        weights = {"sample_weight": sample_weight, "class_weight": class_weight}
        model = self.model
        kept = (self.epochs_trained, model.__dict__.get("history"),
                getattr(model, "_initial_epoch", None))
        # Keras keeps BackupAndRestore's epoch here; fit would start there, not at this batch.
        model._initial_epoch = None  # noqa: SLF001
        try:
            history = self.fit(x, y, batch_size=size, epochs=1, verbose=0, shuffle=False,
                               **{k: v for k, v in weights.items() if v is not None})
        finally:
            self.epochs_trained, model._initial_epoch = kept[0], kept[2]  # noqa: SLF001
            if kept[1] is not None:
                model.history = kept[1]
        logs = {k: v[-1] for k, v in history.history.items()}
        return logs if return_dict else self._logs_in_order(logs)

    def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
        """Loss and metrics of one batch through the pipeline, as `keras.Model.test_on_batch`
        (an `evaluate` of the batch alone, nothing printed).

        Args:
            x, y: one batch of inputs and targets.
            sample_weight: as in `evaluate`.
            return_dict: return a dict instead of a list.

        Returns:
            As `train_on_batch`.

        Raises:
            TypeError, ValueError: as `evaluate`.
        """
        weights = {} if sample_weight is None else {"sample_weight": sample_weight}
        return self.evaluate(x, y, batch_size=_batch_size(x, "test_on_batch"), verbose=0,
                             return_dict=return_dict, **weights)

    def predict_on_batch(self, x):
        """Outputs of one batch `x` through the pipeline, as `keras.Model.predict_on_batch`."""
        return self.predict(x, batch_size=_batch_size(x, "predict_on_batch"), verbose=0)

    def _logs_in_order(self, logs):
        """Logs as Keras' `*_on_batch` and `evaluate` return them: a list, or the one value."""
        if isinstance(self.__dict__.get("metrics"), OutputMetrics):
            return self.metrics.evaluate_values(logs)
        names = self.metrics_names  # then any other log, sorted, as Keras orders them
        values = [logs[n] for n in names if n in logs]
        values += [logs[k] for k in sorted(logs) if k not in names]
        return values[0] if len(values) == 1 else values
