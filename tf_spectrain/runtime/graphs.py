"""Small TensorFlow helpers of the runtime: lists of tensors and quiet graph functions."""

import contextlib
import functools

import tensorflow as tf
from tensorflow.python.eager import context as eager_context  # thread-local call options

from tf_spectrain.runtime import stall


def as_list(x):
    """A new list of `x`'s items (a list or tuple), else `[x]`."""
    return list(x) if isinstance(x, (list, tuple)) else [x]


def differentiable(tensors):
    """The floating and complex tensors of `tensors` (a tape can watch them; not masks, ids)."""
    return [t for t in tensors if t.dtype.is_floating or t.dtype.is_complex]


def all_finite(tensors):
    """A scalar boolean tensor: every element of every floating tensor of `tensors` is finite."""
    flags = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t.dtype.is_floating]
    return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


def graph_function(method, reduce_retracing=True, autograph=True, name=None, separate=False,
                   jit_compile=False):
    """Wraps a stage's bound method in `tf.function`, without the false retracing warning.

    Every stage of every pipeline traces its own copy once (twice with a smaller last
    batch), but TensorFlow's frequent-retracing detector lumps them together and warns
    falsely; tests check the real trace counts instead, so the warning is turned off.

    Args:
        method: the function to wrap (a bound method of a `StageRunner`).
        reduce_retracing: passed to `tf.function`.
        autograph: passed to `tf.function` (False for Python that only builds a graph).
        name: the name TensorFlow gives the traced function (and shows in errors from
            inside it), or None for the method's own.
        separate: never inline the function into a graph that calls it: the caller holds
            one call op, and TensorFlow optimises and instantiates the function once for
            all its callers (a window graph calling a stage's passes), not once for each.
        jit_compile: compile the function with XLA (passed to `tf.function`).

    Without autograph, a trace of the function stops the stall clock of the run whose
    thread traces it (`runtime.stall.tracing`): tracing a large stage is no hang; and each
    output stays on the device it is computed on (`outputs_stay_put`).

    Returns:
        The `tf.function`.
    """
    if name is not None or not autograph:
        original = method

        @functools.wraps(original)
        def named(*args, **kwargs):
            if autograph:  # autograph would convert the context manager too
                return original(*args, **kwargs)
            with stall.tracing():  # this Python runs only while tracing
                outputs = original(*args, **kwargs)
                outputs_stay_put()
                return outputs

        if name is not None:
            named.__name__ = named.__qualname__ = name
        method = named
    attributes = {"_noinline": True} if separate else None
    function = tf.function(method, reduce_retracing=reduce_retracing, autograph=autograph,
                           experimental_attributes=attributes, jit_compile=jit_compile or None)
    if hasattr(function, "_omit_frequent_tracing_warning"):
        # tf.function has no public switch for this per-function warning.
        function._omit_frequent_tracing_warning = True  # noqa: SLF001
    return function


class FlatCalls:
    """Calls graph functions of nested tensor arguments through their concrete functions.

    A `tf.function` call matches its arguments' structure against its traces on every call
    (a trace type of every nested value): milliseconds for a window graph's dicts of
    tensors, more than the graph itself takes for a small model. A concrete function traced
    for these arguments' dtypes and shapes, called with the flat tensors in `tf.nest`'s
    order, skips that. Arguments with a leaf that is not a tensor (or None) take the plain
    call.
    """

    def __init__(self):
        self._concrete = {}  # (function, structure, dtypes and shapes) -> concrete function

    def prepare(self, function, args):
        """`(concrete function, flat tensors)` for `function(*args)`, tracing it the first
        time; `(function, args)` itself where a leaf is not a tensor."""
        flat = [t for t in tf.nest.flatten(args) if t is not None]
        if not all(isinstance(t, tf.Tensor) for t in flat):
            return function, args
        # EagerTensor's `_shape_tuple` is its shape without building a TensorShape.
        key = (function, _structure(args),
               tuple((t.dtype, t._shape_tuple()) for t in flat))  # noqa: SLF001
        concrete = self._concrete.get(key)
        if concrete is None:
            concrete = self._concrete[key] = function.get_concrete_function(*args)
        return concrete, flat

    @staticmethod
    def call(prepared, inputs):
        """Calls what `prepare` returned."""
        if isinstance(prepared, tf.types.experimental.ConcreteFunction):
            return prepared._call_flat(inputs, prepared.captured_inputs)  # noqa: SLF001
        return prepared(*inputs)


def outputs_stay_put():
    """Called last in a traced function's body (`graph_function` does, without autograph):
    each output stays on the device it was computed on.

    `tf.function` passes every output through an Identity op that it makes after the body
    returns, outside any `tf.device` scope, with control inputs from the function's
    stateful ops (so TensorFlow's placer does not put it beside its input): such an op
    runs on the caller's device. Across hosts, what a window graph hands to the next (a
    stage's stashed weights, the activations in flight) and a stage pass called outside
    its device's scope (`runtime.stage`) returns would travel from its worker to the
    trainer and back. This puts, for the rest of the trace, an Identity op of no device
    on its input's device (a device function at the bottom of the graph's device stack:
    `tf.device` scopes still win).
    """
    graph = tf.compat.v1.get_default_graph()
    graph._add_device_to_stack(_beside_its_input)  # noqa: SLF001 (no public way)


def _beside_its_input(op):
    """Device function: an Identity op of no device goes where its input is."""
    if not op.device and op.type == "Identity" and op.inputs:
        return op.inputs[0].device
    return op.device


def _structure(x):
    """The nesting of `x` (dicts, lists, tuples) with each leaf a marker (None kept), as a
    hashable value; plain Python, many times faster than `tf.nest` here."""
    if isinstance(x, dict):
        return ("d",) + tuple((k, _structure(v)) for k, v in sorted(x.items()))
    if isinstance(x, (list, tuple)):
        return ("l" if isinstance(x, list) else "t",) + tuple(_structure(v) for v in x)
    return None if x is None else 0


_UNOPTIMIZED = {}  # (executor type, serialized config) -> the options without Grappler


@contextlib.contextmanager
def unoptimized_calls():
    """Graph functions called from this thread meanwhile skip Grappler's optimisation of
    their whole graph (and of every function it calls that is not `separate`).

    For window graphs, whose ops are calls of separately compiled stage functions: those
    keep the options they were traced with (trace them first), so each is optimised once,
    when it is first instantiated, and a new window shape costs no optimisation of every
    stage's math again. The call options are per thread; TensorFlow has no public switch
    for them (`tf.config.optimizer` sets the whole process').
    """
    ctx = eager_context.context()
    before = ctx.function_call_options
    key = (before.executor_type, before.config_proto_serialized)
    options = _UNOPTIMIZED.get(key)
    if options is None:
        options = eager_context.FunctionCallOptions(executor_type=before.executor_type)
        proto = type(ctx.config)()
        proto.ParseFromString(key[1])
        proto.graph_options.rewrite_options.disable_meta_optimizer = True
        options.config_proto_serialized = proto
        _UNOPTIMIZED[key] = options
    ctx.function_call_options = options
    try:
        yield
    finally:
        ctx.function_call_options = before


def add_gradients(a, b):
    """`a + b` for two gradients of one weight, dense or `tf.IndexedSlices` (an
    embedding's): two slices concatenate, a dense and a sliced one add densely."""
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def divided_gradient(g, count):
    """A gradient, dense or `tf.IndexedSlices`, divided by `count`."""
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values / count, g.indices, g.dense_shape)
    return g / count
