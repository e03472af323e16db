"""A stage's forward in one window graph and its backward in a later one, without recompute.

Inside one graph, a `tf.GradientTape` around a nested function call differentiates it by
rewriting the call into TensorFlow's *forward function*, which also returns the
intermediates the *backward function* needs, and calling that backward function with them.
`split_forward` calls the forward function itself, so that those intermediates can leave
the window as tensors (`runtime.window_carried`); `split_backward`, in a later window,
calls the backward function with them: the gradients the tape would give, with the
forward computed once.

TensorFlow has no public API for the pair: this module alone uses the private
`ConcreteFunction._delayed_rewrite_functions` (the pair the tape itself uses, cached per
function), and `supports_split` says whether a function offers it.
"""

import dataclasses

import tensorflow as tf
from tensorflow.python.eager import backprop_util  # which outputs take gradients
from tensorflow.python.framework import ops
from tensorflow.python.ops import default_gradient

from tf_spectrain.runtime.graphs import add_gradients


@dataclasses.dataclass(frozen=True)
class _Pair:
    """One traced function's forward and backward functions and how they connect."""

    concrete: object  # the traced function
    forward: object  # AtomicFunction: the outputs, then the backward's intermediates
    backward: object  # ConcreteFunction: output gradients -> gradients of the inputs
    num_outputs: int  # the original function's flat outputs
    differentiated: tuple  # the placeholders of the outputs that take gradients
    sources: tuple  # per capture of `backward`: index into `forward`'s outputs, or None
    num_inputs: int  # the traced function's flat inputs (captures excluded)


_PAIRS = "_tf_spectrain_split_pairs"  # a traced function's attribute: {outputs: _Pair}


def supports_split(function):
    """Whether `function` (a stage's pass function) can be split: a `tf.function` without
    XLA (an XLA function runs as one program)."""
    return hasattr(function, "get_concrete_function") and not getattr(
        function, "_jit_compile", False)


def _pair(function, args, num_differentiated):
    """The `_Pair` of `function` traced for `args` (traced once, then cached)."""
    concrete = function.get_concrete_function(*args)
    pairs = getattr(concrete, _PAIRS, None)
    if pairs is None:  # kept on the traced function: they live and go with it
        pairs = {}
        setattr(concrete, _PAIRS, pairs)
    pair = pairs.get(num_differentiated)
    if pair is None:
        delayed = concrete._delayed_rewrite_functions  # noqa: SLF001 (no public API)
        forward, backward = delayed.forward_backward(num_differentiated)
        graph = concrete.graph
        index = {ops.tensor_id(t): n for n, t in enumerate(graph.outputs)}
        pair = pairs[num_differentiated] = _Pair(
            concrete, forward, backward, delayed._num_inference_outputs,  # noqa: SLF001
            tuple(graph.outputs[:num_differentiated]),
            tuple(index.get(ops.tensor_id(c)) for c in backward.captured_inputs),
            len(graph.inputs) - len(concrete.captured_inputs))
    return pair


def flat_tensors(args):
    """The tensors of the nest `args`, in the order a traced function takes them."""
    return [t for t in tf.nest.flatten(args) if isinstance(t, (tf.Tensor, tf.Variable))]


def _flat(args, pair):
    flat = flat_tensors(args)
    if len(flat) != pair.num_inputs:
        raise ValueError(f"{len(flat)} tensors for a function of {pair.num_inputs} inputs")
    return flat


def split_forward(function, args, num_differentiated):
    """Calls `function(*args)` in the graph being traced as its forward function.

    Args:
        function: a `tf.function` for which `supports_split` holds.
        args: its positional arguments (nests of tensors).
        num_differentiated: how many of its first flat outputs take gradients.

    Returns:
        `(outputs, side)`: `function`'s outputs, and the intermediates that
        `split_backward` takes (a list of tensors).
    """
    pair = _pair(function, args, num_differentiated)
    flat = pair.forward.call_flat(*(_flat(args, pair) + list(pair.concrete.captured_inputs)))
    outputs = pair.concrete.function_type.pack_output(flat[: pair.num_outputs])
    return outputs, [flat[n] for n in pair.sources if n is not None]


def split_backward(function, args, num_differentiated, side, output_gradients):
    """The gradients of the flat inputs of `function(*args)`, from `split_forward`'s `side`.

    Args:
        function, args, num_differentiated: as given to `split_forward` (`args` may be
            the same values carried into another graph: they select the same trace).
        side: the intermediates `split_forward` returned (they may have crossed windows).
        output_gradients: the gradients of the differentiated outputs (a list in flat
            order), or None for ones (a loss).

    Returns:
        A list with one entry per flat input of `args` (`tf.nest.flatten` order), None
        where the outputs do not depend on it.
    """
    pair = _pair(function, args, num_differentiated)
    if output_gradients is None:
        output_gradients = [tf.ones(p.shape, p.dtype) for p in pair.differentiated]
    cleaned = []
    for given, placeholder in zip(output_gradients, pair.differentiated, strict=True):
        if not backprop_util.IsTrainable(placeholder):
            continue
        if isinstance(given, tf.IndexedSlices):
            given = tf.convert_to_tensor(given)
        cleaned.append(given if given is not None
                       else default_gradient.zeros_like(placeholder))
    side = iter(side)
    captures = [next(side) if n is not None else c
                for n, c in zip(pair.sources, pair.backward.captured_inputs)]
    grads = pair.backward._call_flat(cleaned, captures)  # noqa: SLF001
    return list(grads)[: pair.num_inputs]


def gradients_of(targets, args, flat):
    """The gradients of `targets` (tensors among `args`) from the gradients `flat` of
    `args`' flat tensors, as `tf.GradientTape.gradient` gives them: zeros where
    unconnected, summed where a tensor is passed twice."""
    grads = []
    tensors = flat_tensors(args)
    for t in targets:
        found = [g for u, g in zip(tensors, flat, strict=True) if u is t and g is not None]
        if not found:
            grads.append(tf.zeros_like(t))
        else:
            total = found[0]
            for g in found[1:]:
                total = add_gradients(total, g)
            grads.append(total)
    return grads


def stage_forward(passes, args):
    """A stage's `passes.forward_at_fn(*args)` (`runtime.passes.StagePasses`) as a split
    forward: `(its outputs, the record that stage_backward takes)`; the gradients go to
    its outputs and its penalty."""
    outputs, side = split_forward(passes.forward_at_fn, args, _differentiated(passes, args))
    return outputs, {"side": side, "args": args}


def stage_backward(passes, record, output_gradients):
    """The backward of `stage_forward`'s pass from its `record` (which may have crossed
    windows): `(the weights it used, their gradients, the gradients of the inputs the
    previous stage needs)`, as a tape around the forward would give them."""
    args = record["args"]
    weights, inputs = list(args[0]), args[1]
    flat = split_backward(passes.forward_at_fn, args, _differentiated(passes, args),
                          record["side"], output_gradients)
    grads = gradients_of(weights + passes.input_targets(inputs), args, flat)
    return args[0], grads[: len(weights)], grads[len(weights):]


def _differentiated(passes, args):
    """How many flat outputs of `forward_at(*args)` take gradients: its outputs, penalty."""
    outputs = passes.forward_at_fn.get_concrete_function(*args).structured_outputs[0]
    return len(tf.nest.flatten(outputs)) + 1
