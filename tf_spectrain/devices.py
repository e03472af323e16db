"""Device set-up: the only module that asks TensorFlow which devices exist.

Stages of a pipeline each run on their own device. On a machine with enough GPUs these are
the physical GPUs; with fewer GPUs, or none, one physical device is split into several
*logical* devices so that the same multi-device code runs anywhere (on a CPU the stages then
share the cores: logical devices show overlap, not speed).

TensorFlow fixes its devices when its runtime initialises, at the first op. So
`setup_devices` must be called before anything else touches TensorFlow; called later it
returns the devices if they already exist and otherwise raises an error that says so.
"""

import warnings

import tensorflow as tf


def _check_count(n):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"`n` must be an integer >= 1 (the number of devices to use). Received: n={n!r}"
        )


def _names(kind, count):
    return [f"/{kind}:{k}" for k in range(count)]


def existing_devices(kind=None):
    """Returns the names of the logical devices TensorFlow has, GPUs first.

    Args:
        kind: `"GPU"`, `"CPU"` or None for both.

    This initialises the TensorFlow runtime if it is not yet initialised.
    """
    kinds = ["GPU", "CPU"] if kind is None else [kind]
    names = []
    for k in kinds:
        names += _names(k, len(tf.config.list_logical_devices(k)))
    return names


def _runtime_initialized():
    # `tf.config` offers no public query; the context's handle exists once it has started.
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None  # noqa: SLF001


def setup_devices(n):
    """Prepares `n` devices for pipeline stages and returns their names.

    Call this before any TensorFlow op runs.

    - At least `n` physical GPUs: the first `n` (`["/GPU:0", ..., f"/GPU:{n-1}"]`).
    - Between 1 and `n - 1` GPUs: the GPUs are split into `n` logical GPUs with the memory
      of each physical GPU split evenly; a warning says that stages share hardware.
    - No GPU: the CPU is split into `n` logical CPU devices, with a warning, and TensorFlow's
      inter-op thread pool gets at least `n` threads so that stages can run concurrently.

    If TensorFlow has already initialised, nothing can be changed any more: when `n`
    suitable devices already exist their names are returned, otherwise a `RuntimeError`
    explains that `setup_devices` must be called first.

    Args:
        n: number of devices (pipeline stages), an int >= 1.

    Returns:
        A list of `n` device names such as `"/GPU:0"` or `"/CPU:3"`.
    """
    _check_count(n)
    gpus = tf.config.list_physical_devices("GPU")
    if _runtime_initialized():
        return _existing_or_raise(n, gpus)
    if len(gpus) >= n:
        return _names("GPU", n)
    if gpus:
        _split_gpus(gpus, n)
        return _names("GPU", n)
    _split_cpu(n)
    return _names("CPU", n)


def _existing_or_raise(n, gpus):
    kind = "GPU" if gpus else "CPU"
    have = existing_devices(kind)
    if len(have) >= n:
        return have[:n]
    raise RuntimeError(
        f"`setup_devices({n})` was called after TensorFlow had initialised, and only "
        f"{len(have)} {kind} device(s) exist ({have}); devices cannot be added any more. "
        "Call `tf_spectrain.setup_devices(n)` at the start of your program, before any "
        "TensorFlow op, model or dataset is created."
    )


def split_counts(num_physical, n):
    """How many logical devices each of `num_physical` devices gets so that there are `n`.

    As even as possible, the first devices taking one more: `split_counts(3, 8) == [3, 3, 2]`.
    """
    return [n // num_physical + (1 if i < n % num_physical else 0) for i in range(num_physical)]


def _split_gpus(gpus, n):
    for gpu, count in zip(gpus, split_counts(len(gpus), n)):
        total_mb = _gpu_memory_mb(gpu)
        limit = max(256, int(total_mb * 0.9) // count) if total_mb else 1024
        tf.config.set_logical_device_configuration(
            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * count
        )
    warnings.warn(
        f"Only {len(gpus)} GPU(s) for {n} devices: split into {n} logical GPUs; "
        "stages on the same physical GPU share its compute and memory.",
        stacklevel=3,
    )


def _gpu_memory_mb(gpu):
    try:
        details = tf.config.experimental.get_device_details(gpu)
    except Exception:  # details are best effort; some drivers report nothing
        return None
    # Not every build reports memory; fall back to a conservative fixed split.
    return details.get("memory_limit_mb") or None


def _split_cpu(n):
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    )
    if tf.config.threading.get_inter_op_parallelism_threads() < n:
        tf.config.threading.set_inter_op_parallelism_threads(n)
    if n > 1:
        warnings.warn(
            f"No GPU found: split the CPU into {n} logical devices. They share the CPU "
            "cores, so a pipeline shows overlap of stages, not speed-up.",
            stacklevel=3,
        )
