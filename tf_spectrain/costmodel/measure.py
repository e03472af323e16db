"""Measurements on this machine for the cost model (needs TensorFlow).

- `profile_model`: per-layer forward and backward times of a Keras model, with its
  activation and weight sizes, as a `ModelProfile`.
- `measure_link`: bandwidth and latency of a copy between two devices.
- `measure_concurrency`: how many devices can compute at full speed at once.

The times are what this machine measures. On a CPU-only machine they stand in for GPU
times: `Hardware.relative_speed` scales them, uniformly, which ignores that a GPU speeds up
some layers (large convolutions and matrix products) more than others (small or
memory-bound ones such as BatchNorm and activations).
"""

import contextlib
import dataclasses
import statistics
import threading
import time

import numpy as np
import tensorflow as tf

from tf_spectrain import checks, partition
from tf_spectrain.costmodel.profile import LayerProfile, ModelProfile
from tf_spectrain.partition import model_memory
from tf_spectrain.partition.graph import read_graph
from tf_spectrain.partition.keras_nodes import one_or_list
from tf_spectrain.runtime.graphs import as_list, differentiable


def _sync():
    """Waits for queued device work (GPU kernels run asynchronously; CPU ops do not)."""
    if tf.config.list_logical_devices("GPU"):
        tf.test.experimental.sync_devices()


def _median_seconds(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


OPEN_DIM_SIZE = 32
"""The size a dimension the model leaves open (`keras.Input(shape=(None,))`) is timed at."""


def _example_inputs(model, batch_size, seed):
    """A random batch for each model input: normal floats, zeros for integer inputs (an
    open dimension, such as a sequence length, of size `OPEN_DIM_SIZE`)."""
    rng = np.random.default_rng(seed)
    values = []
    for t in model.inputs:
        shape = (batch_size,) + _example_shape(t.shape[1:])
        dtype = tf.as_dtype(t.dtype)
        if dtype.is_floating:
            values.append(tf.constant(rng.normal(size=shape), dtype=dtype))
        else:  # token ids: 0 is valid for any vocabulary
            values.append(tf.zeros(shape, dtype=dtype))
    return values


def _bytes_per_example(tensors):
    """Bytes per example of tensors (eager or symbolic) shaped `(batch, ...)`."""
    return sum(int(np.prod(_example_shape(t.shape[1:]))) * tf.as_dtype(t.dtype).size
               for t in tensors)


def _example_shape(shape):
    """`shape` with every open (None) dimension of size `OPEN_DIM_SIZE`."""
    return tuple(OPEN_DIM_SIZE if d is None else d for d in shape)


def _check_timing(batch_size, repeats, warmup):
    """Checks the timing arguments of `profile_model` and `measure_stages`."""
    return (
        checks.check_int("batch_size", batch_size, 1, meaning="examples per timed batch"),
        checks.check_int("repeats", repeats, 1, meaning="timed calls per function"),
        checks.check_int("warmup", warmup, 0, meaning="untimed calls first"),
    )


def _layer_functions(stage):
    """A forward and a forward-plus-backward `tf.function` for one one-layer stage."""

    @tf.function
    def forward(inputs):
        return stage(one_or_list(inputs), training=True)

    @tf.function
    def forward_backward(inputs, upstream):
        watched = differentiable(inputs)
        with tf.GradientTape() as tape:
            tape.watch(watched)
            outputs = as_list(stage(one_or_list(inputs), training=True))
        sources = list(stage.trainable_variables) + watched
        if not sources:
            return outputs
        return tape.gradient(outputs, sources, output_gradients=upstream)

    return forward, forward_backward


def profile_model(model, batch_size, repeats=5, warmup=2, seed=0, device=None):
    """Measures each layer's forward and backward time and its tensor sizes.

    The model is split after every layer (`tf_spectrain.partition.split_model`), so layer
    `p`'s stage receives exactly what crosses a cut before it and sends what crosses a
    cut after it (in a residual block, also the tensors that skip the layer). The layers
    run in order on one random batch (`training=True`, so BatchNorm uses batch statistics
    and updates its moving ones, as in training). For each layer a `tf.function` of its
    forward and one of its forward plus backward (gradients of its trainable weights and
    of its floating-point inputs, for a random upstream gradient) are timed `repeats` times
    after `warmup` calls; the backward time is the difference of the medians (at least 0).

    Times of separate per-layer calls add the per-call overhead of TensorFlow (tens of
    microseconds per call) and miss fusion across layers, so their sum can differ from a
    whole-model step; `benchmarks/speedup.py` reports the difference.

    Args:
        model: a functional `keras.Model` or built `keras.Sequential` (every layer called
            once).
        batch_size: examples per timed batch, an int >= 1.
        repeats: timed calls per function, an int >= 1; the median counts.
        warmup: untimed calls first (tracing, allocation), an int >= 0.
        seed: seed of the random batch and upstream gradients.
        device: optional device name to run on, e.g. `"/CPU:0"` or `"/GPU:0"`. When the
            model's variables live on another device (not merely another CPU), each layer
            is timed as a copy placed on `device`, so no time is spent reading weights
            from elsewhere.

    Returns:
        A `ModelProfile` named after the model, one `LayerProfile` per layer in
        topological order, at `batch_size`.

    Raises:
        TypeError, ValueError: for invalid arguments, or a model that
            `tf_spectrain.partition` cannot split (e.g. shared layers).
    """
    batch_size, repeats, warmup = _check_timing(batch_size, repeats, warmup)
    graph = read_graph(model)
    names = graph.names
    # Every layer alone, even where a cut would lose a Keras mask: only its time counts.
    stages = partition.split_model(model, names[:-1], keep_masks=False)
    if device and not model_memory.reads_locally(model_memory.variable_devices(model), device):
        # The model lives elsewhere (train.py builds it on the CPU when its stages are on
        # GPUs): time copies placed on `device`, not the layers reading remote variables.
        stages = partition.place_stages(stages, [device] * len(stages))
    rng = np.random.default_rng(seed + 1)
    layers = []
    with tf.device(device) if device else contextlib.nullcontext():
        inputs = _example_inputs(model, batch_size, seed)
        input_bytes = _bytes_per_example(inputs)
        for call, stage in zip(graph.calls, stages):
            layer, inputs = _profile_layer(call.name, stage, inputs, rng, repeats, warmup)
            own = _bytes_per_example(call.outputs)
            layers.append(dataclasses.replace(layer, activation_bytes=float(own)))
    return ModelProfile(layers, batch_size, name=model.name, input_bytes=float(input_bytes))


def _profile_layer(name, stage, inputs, rng, repeats, warmup):
    """Times one one-layer stage on `inputs`; returns its `LayerProfile` and its outputs."""
    forward, forward_backward = _layer_functions(stage)
    outputs = as_list(forward(inputs))
    upstream = [
        tf.constant(rng.normal(size=o.shape), dtype=o.dtype) if o.dtype.is_floating else None
        for o in outputs
    ]
    for _ in range(warmup):
        forward(inputs)
        forward_backward(inputs, upstream)
    _sync()
    fwd = _median_seconds(lambda: forward(inputs), repeats)
    both = _median_seconds(lambda: forward_backward(inputs, upstream), repeats)
    weight_bytes = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in stage.trainable_variables
    )
    layer = LayerProfile(
        name=name,
        forward_time=fwd,
        backward_time=max(0.0, both - fwd),
        output_bytes=float(_bytes_per_example(outputs)),
        weight_bytes=float(weight_bytes),
    )
    return layer, outputs


def measure_link(source, target, small_bytes=4096, large_bytes=64 * 2**20, repeats=7):
    """Measures a copy from one device to another: `(bandwidth, latency)`.

    Times a `tf.function` that copies a float32 tensor living on `source` to `target`
    (and reduces it there to one number, so the copy cannot be skipped), for a small and a
    large tensor, and fits `time = latency + bytes / bandwidth` through the two medians.
    When the large copy is no slower than the small one (devices sharing memory may not
    copy at all), the bandwidth is `math.inf`.

    Args:
        source, target: device names, e.g. `"/CPU:0"`, `"/CPU:1"`.
        small_bytes, large_bytes: tensor sizes, ints with `4 <= small < large`.
        repeats: timed calls per size, an int >= 1.

    Returns:
        A tuple `(bandwidth, latency)` in bytes/s and seconds, for `Hardware`.

    Raises:
        TypeError, ValueError: for invalid arguments.
    """
    small = checks.check_int("small_bytes", small_bytes, 4, meaning="bytes")
    large = checks.check_int("large_bytes", large_bytes, small + 1, meaning="bytes")
    repeats = checks.check_int("repeats", repeats, 1, meaning="timed calls per size")
    for name, value in (("source", source), ("target", target)):
        if not isinstance(value, str):
            raise TypeError(f"`{name}` must be a device name string. Received: {name}={value!r}")

    @tf.function
    def copy(x):
        with tf.device(target):
            return tf.reduce_sum(x[:1])  # the whole tensor moves before the slice

    seconds = []
    for size in (small, large):
        with tf.device(source):
            x = tf.ones([size // 4], tf.float32) + 0.0
        copy(x)
        seconds.append(_median_seconds(lambda x=x: copy(x).numpy(), repeats))
    slope = (seconds[1] - seconds[0]) / (large - small)
    if slope <= 0:
        return float("inf"), max(0.0, min(seconds))
    return 1.0 / slope, max(0.0, seconds[0] - small * slope)


def measure_concurrency(devices, workload=None, repeats=5):
    """Measures how many of `devices` can compute at full speed at the same time.

    Runs the same work on `devices[0]` alone and on every device at once, from one Python
    thread per device (as the pipeline runtime does), `repeats` times in alternation (so
    that other load on the machine hits both alike), and returns the median over the pairs
    of `len(devices) * alone / together`: `len(devices)` for independent devices, about 1
    for logical devices that share the cores one of them already keeps busy, more than 1
    when one device alone leaves cores idle (operations that run on one thread).

    Args:
        devices: a list of at least 2 device names.
        workload: a function `workload(device)` that returns a zero-argument callable doing
            one unit of work on `device` and waiting for it (traced beforehand). None: 30
            chained 512 x 512 matrix products. Use the model's own training step to measure
            how much of *its* work overlaps.
        repeats: timed pairs, an int >= 1.

    Returns:
        The concurrency, a float in `(0, len(devices)]`.

    Raises:
        TypeError, ValueError: for invalid arguments.
    """
    checks.check_instance("devices", devices, (list, tuple), " of device names")
    if len(devices) < 2:
        raise ValueError(
            f"`devices` must be a list of at least 2 device names. Received: devices={devices!r}"
        )
    if workload is not None and not callable(workload):
        raise TypeError(
            "`workload` must be a function of a device name that returns a callable. "
            f"Received: workload={workload!r}"
        )
    repeats = checks.check_int("repeats", repeats, 1, meaning="timed pairs")
    work = [(workload or _matmul_workload)(device) for device in devices]
    for run in work:
        run()

    def together():
        threads = [threading.Thread(target=run) for run in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    ratios = []
    for _ in range(repeats):
        alone = _median_seconds(work[0], 1)
        both = _median_seconds(together, 1)
        ratios.append(len(devices) * alone / both)
    return min(float(len(devices)), statistics.median(ratios))


def _matmul_workload(device, size=512, iterations=30):
    """A traced function of `iterations` chained matrix products on `device`."""
    with tf.device(device):
        a = tf.random.normal([size, size], seed=1)

    @tf.function
    def run():
        with tf.device(device):
            x = a
            for _ in range(iterations):
                x = tf.tanh(tf.matmul(x, a) / size)
            return tf.reduce_sum(x)

    return lambda: run().numpy()


def measure_stages(model, cuts, batch_size, repeats=5, warmup=2, seed=0, device=None):
    """Times each stage's forward plus backward alone, as the planner predicts them.

    The model is split at `cuts` (`tf_spectrain.partition.split_model`) and every stage
    runs, in order, on one random batch (its input is the previous stage's output), each
    a `tf.function` of its forward and backward (as `profile_model` times one layer).

    Args:
        model: a functional `keras.Model` or built `keras.Sequential`.
        cuts: the cut layer names.
        batch_size: examples per timed batch, an int >= 1.
        repeats: timed calls per stage, an int >= 1; the median counts.
        warmup: untimed calls first, an int >= 0.
        seed: seed of the random batch and upstream gradients.
        device: optional device name to run on, or a list of one per stage (each stage
            then runs, one after the other, as a copy placed on its own device with
            `partition.place_stages`, as the pipeline runs it).

    Returns:
        A list of `len(cuts) + 1` `(forward_seconds, forward_backward_seconds)` pairs.

    Raises:
        TypeError, ValueError: for invalid arguments or cuts.
    """
    batch_size, repeats, warmup = _check_timing(batch_size, repeats, warmup)
    stages = partition.split_model(model, cuts)
    placement = list(device) if isinstance(device, (list, tuple)) else [device] * len(stages)
    if len(placement) != len(stages):
        raise ValueError(
            f"`device` must be one device name or a list of one per stage ({len(stages)}). "
            f"Received: device={device!r}"
        )
    if isinstance(device, (list, tuple)):
        # Copies whose variables live on their stage's device, as the pipeline runs them:
        # a layer whose call is a function of its own cannot read a variable of another
        # device (ConvNeXt's depthwise convolutions, measured).
        stages = partition.place_stages(stages, placement)
    rng = np.random.default_rng(seed + 1)
    times = []
    with tf.device(placement[0]) if placement[0] else contextlib.nullcontext():
        inputs = _example_inputs(model, batch_size, seed)
    for k, stage in enumerate(stages):
        with tf.device(placement[k]) if placement[k] else contextlib.nullcontext():
            inputs = [tf.identity(x) for x in inputs]  # on this stage's device
            layer, inputs = _profile_layer(f"stage{k}", stage, inputs, rng, repeats, warmup)
        times.append((layer.forward_time, layer.forward_time + layer.backward_time))
    return times
