"""Build a model that is not built yet from the first data, as Keras' first `fit` does.

A `keras.Sequential` without an `Input` (`Sequential([Dense(64), Dense(10)])`) has no
graph, no weights and no input shape until it is called: Keras builds it from the shapes
of the first batch that `fit`, `evaluate` or `predict` sees. A `PipelineModel` of such a
model likewise waits: cutting (planning included), placing the stages and `compile` are
held until the first data arrive, then the model is built as Keras builds it
(`model.build((None, *shape_of_one_example))`, the batch dimension left open) and
everything held runs, in order.

`BuildOnData` holds that state; `PipelineModel` asks it at the top of `compile`, `fit`,
`evaluate` and `predict` (for a built model it does nothing).
"""

import collections.abc
import inspect

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain.partition.model_structure import is_built


class BuildOnData:
    """What a pipeline of an unbuilt model holds until its first data.

    Args:
        model: the Keras model (built or not).
        place: a function of no arguments that cuts the built model and places its
            stages (`PipelineModel`'s own set-up, run once the model is built).

    Attributes:
        waiting: whether the model still waits for data to be built.
    """

    def __init__(self, model, place):
        self.model = model
        self.place = place
        self.waiting = not is_built(model)
        self._compile = None  # (compile function, its arguments), held until built

    def hold_compile(self, compile_fn, arguments):
        """Keeps a `compile` call to replay once the model is built.

        Args:
            compile_fn: the bound `compile` method.
            arguments: its arguments by name (`locals()` at its top; `self` is dropped).

        Returns:
            True if the call was held (the model waits for data), else False.
        """
        if not self.waiting:
            return False
        self._compile = (compile_fn, {k: v for k, v in arguments.items() if k != "self"})
        return True

    def build(self, x):
        """Builds the model from the inputs `x` if it waits for them, then places the
        pipeline and replays a held `compile`.

        Args:
            x: the `x` of `fit`, `evaluate` or `predict`: arrays, a `tf.data.Dataset`, a
                `keras.utils.PyDataset`, or a generator or iterator of batches.

        Returns:
            `x`, to use in its place: the same object, except that a generator or
            iterator whose first batch was read is returned with that batch put back.

        Raises:
            ValueError: if `x` is missing or empty, holds several inputs (a Sequential
                takes one), or Keras cannot build the model from its shape.
        """
        if not self.waiting:
            return x
        part, x = _first_inputs(x, self.model.name)
        _build(self.model, part)
        self.place()
        self.waiting = False
        if self._compile is not None:
            compile_fn, arguments = self._compile
            self._compile = None
            _call_with(compile_fn, arguments)
        return x


def _first_inputs(x, name):
    """The inputs of one batch (or their spec) and `x`, a peeked generator restored."""
    if x is None:
        raise ValueError(
            f"Model '{name}' is not built yet (a Sequential without an `Input`), so it is "
            "built from the shape of the first data, as Keras builds it; received x=None. "
            "Pass the data, or start the model with keras.Input(shape)."
        )
    if isinstance(x, tf.data.Dataset):
        return _x_part(x.element_spec), x
    if isinstance(x, keras.utils.PyDataset):
        return _x_part(x[0]), x
    if isinstance(x, collections.abc.Iterator):
        try:
            first = next(x)
        except StopIteration:
            raise ValueError(
                f"Model '{name}' is built from the shape of the first batch, but the "
                "generator `x` yielded no batch."
            ) from None
        return _x_part(first), _put_back(first, x)
    return x, x


def _put_back(first, rest):
    """A generator of `first`, then of `rest` (Keras' data adapters take generators)."""
    yield first
    yield from rest


def _x_part(batch):
    """The `x` of a batch that may be `(x,)`, `(x, y)` or `(x, y, sample_weight)`."""
    if isinstance(batch, tuple) and 1 <= len(batch) <= 3:
        return batch[0]
    return batch


def _build(model, inputs):
    """Builds `model` (a Sequential) for inputs shaped like `inputs`, batch size left open."""
    if isinstance(inputs, (dict, list, tuple)):
        raise ValueError(
            f"Model '{model.name}' is not built yet (a Sequential without an `Input`) and "
            f"the data holds several inputs ({type(inputs).__name__} of "
            f"{len(inputs)}); a Sequential takes one. Start it with keras.Input(shape), or "
            "build a functional model for several inputs."
        )
    shape = tuple(inputs.shape) if hasattr(inputs, "shape") else np.shape(inputs)
    if len(shape) < 1:
        raise ValueError(
            f"Model '{model.name}' is built from the shape of the data, but the inputs "
            f"have no batch dimension (shape {shape})."
        )
    input_shape = (None, *shape[1:])
    model.build(input_shape)
    if not is_built(model):  # Keras' Sequential.build gives up silently
        raise ValueError(
            f"Keras could not build model '{model.name}' for inputs of shape "
            f"{input_shape} (a layer's output shape could not be inferred). Build it "
            "yourself first: model.build(input_shape), or start it with "
            "keras.Input(shape)."
        )


def _call_with(fn, arguments):
    """Calls `fn` with `arguments` by parameter name (a `**kwargs` entry expanded)."""
    args, kwargs = [], {}
    for name, param in inspect.signature(fn).parameters.items():
        if name not in arguments:
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(arguments[name])
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(arguments[name])
        else:
            kwargs[name] = arguments[name]
    return fn(*args, **kwargs)
