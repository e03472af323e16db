"""Device set-up: the only module that asks TensorFlow which devices exist.

Stages of a pipeline each run on their own device. On a machine with enough GPUs these are
the physical GPUs; with fewer GPUs, or none, one physical device is split into several
*logical* devices so that the same multi-device code runs anywhere (on a CPU the stages then
share the cores: logical devices show overlap, not speed).

TensorFlow fixes its devices when its runtime initialises, at the first op. So
`setup_devices` must be called before anything else touches TensorFlow; called later it
returns the devices if they already exist and otherwise raises an error that says so.
"""

import os
import subprocess
import warnings

import tensorflow as tf

from tf_spectrain import checks


def _check_count(n):
    """`n` as an int >= 1 (the number of devices)."""
    return checks.check_int("n", n, 1, meaning="the number of devices to use")


def _names(kind, count):
    return [f"/{kind}:{k}" for k in range(count)]


def existing_devices(kind=None):
    """Lists the names of the logical devices TensorFlow has, GPUs first.

    This initialises the TensorFlow runtime if it is not yet initialised.

    Args:
        kind: `"GPU"`, `"CPU"` or None for both.

    Returns:
        A list of device names, e.g. `["/GPU:0", "/GPU:1", "/CPU:0"]`.
    """
    kinds = ["GPU", "CPU"] if kind is None else [kind]
    names = []
    for k in kinds:
        names += _names(k, len(tf.config.list_logical_devices(k)))
    return names


def default_devices(num_stages):
    """Picks the first `num_stages` distinct devices, GPUs first (`PipelineModel(devices=None)`).

    Only GPUs are used when there are any, else the CPUs.

    Args:
        num_stages: the number of pipeline stages (an int >= 1).

    Returns:
        A list of `num_stages` device names.

    Raises:
        ValueError: if fewer devices exist; the message says how to get more.
    """
    gpus = existing_devices("GPU")
    names = gpus if gpus else existing_devices("CPU")
    if len(names) < num_stages:
        raise ValueError(
            f"A pipeline of {num_stages} stages needs {num_stages} distinct devices, but only "
            f"{len(names)} exist ({names}). Call `tf_spectrain.setup_devices({num_stages})` at "
            "the start of the program (before any TensorFlow op) to split the available "
            "GPUs or the CPU into logical devices, or pass `devices=[...]` explicitly "
            "(names may repeat)."
        )
    return names[:num_stages]


def logical_device_names():
    """Full names of every logical device, local or of a connected cluster, in TF's order.

    E.g. `"/job:localhost/replica:0/task:0/device:CPU:0"`, unlike `existing_devices`;
    initialises the TensorFlow runtime if it is not yet initialised."""
    return [d.name for d in tf.config.list_logical_devices()]


def _runtime_initialized():
    # `tf.config` offers no public query; the context's handle exists once it has started.
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None  # noqa: SLF001 - no public query


def setup_devices(n):
    """Prepares `n` devices for pipeline stages and returns their names.

    Call this before any TensorFlow op runs.

    - At least `n` physical GPUs: the first `n` (`["/GPU:0", ..., f"/GPU:{n-1}"]`).
    - Between 1 and `n - 1` GPUs: the GPUs are split into `n` logical GPUs, each physical
      GPU's memory (read with nvidia-smi; 90% of it) split evenly among its logical GPUs
      (1024 MB each when it cannot be read); a warning says that stages share hardware
      and which limits were used.
    - No GPU: the CPU is split into `n` logical CPU devices, with a warning, and TensorFlow's
      inter-op thread pool gets at least `n` threads so that stages can run concurrently.

    If TensorFlow has already initialised, nothing can be changed any more: when `n`
    suitable devices already exist their names are returned, otherwise a `RuntimeError`
    explains that `setup_devices` must be called first.

    Args:
        n: number of devices (pipeline stages), an int >= 1.

    Returns:
        A list of `n` device names such as `"/GPU:0"` or `"/CPU:3"`.

    Raises:
        ValueError: if `n` is not an integer >= 1.
        RuntimeError: if TensorFlow has already initialised with fewer than `n` devices.
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
    """Shares `n` logical devices among `num_physical` devices, the first taking one more:
    `split_counts(3, 8) == [3, 3, 2]`."""
    return [n // num_physical + (1 if i < n % num_physical else 0) for i in range(num_physical)]


_FALLBACK_GPU_MB = 1024


def _split_gpus(gpus, n):
    totals = gpu_memory_mb(len(gpus))
    limits = []
    for gpu, count, total in zip(gpus, split_counts(len(gpus), n), totals):
        # Leave 10% of the memory to the CUDA context and TensorFlow's own allocations.
        limit = max(256, int(total * 0.9) // count) if total else _FALLBACK_GPU_MB
        limits.append(limit)
        tf.config.set_logical_device_configuration(
            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * count
        )
    unknown = "" if all(totals) else (
        f" The memory of some GPUs could not be read (nvidia-smi), so they got "
        f"{_FALLBACK_GPU_MB} MB per logical device."
    )
    warnings.warn(
        f"Only {len(gpus)} GPU(s) for {n} devices: split into {n} logical GPUs with memory "
        f"limits {limits} MB; stages on the same physical GPU share its compute and "
        f"memory.{unknown}",
        stacklevel=3,
    )


def gpu_memory_mb(num_gpus):
    """Reads the total memory in MB of each of the first `num_gpus` visible GPUs.

    Read with `nvidia-smi` (TensorFlow can only tell after it has initialised, too late to
    split the devices); `CUDA_VISIBLE_DEVICES` selects and orders the GPUs as for CUDA.

    Args:
        num_gpus: how many GPUs to report.

    Returns:
        A list of `num_gpus` ints, None for a GPU whose memory is unknown (all None when
        `nvidia-smi` cannot be run or fails).
    """
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [None] * num_gpus
    return parse_gpu_memory(out, os.environ.get("CUDA_VISIBLE_DEVICES"), num_gpus)


def parse_gpu_memory(text, visible, num_gpus):
    """Parses nvidia-smi's memory lines, filtered by CUDA_VISIBLE_DEVICES (pure).

    Args:
        text: the output of `nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits`,
            one number of MB per line.
        visible: the value of `CUDA_VISIBLE_DEVICES`, or None; GPU indices select and order the
            lines, anything else (UUIDs, MIG names) keeps nvidia-smi's order.
        num_gpus: how many GPUs to report.

    Returns:
        A list of `num_gpus` ints, None for a line that is not a number or a GPU not listed.
    """
    totals = []
    for line in text.strip().splitlines():
        try:
            totals.append(int(float(line.strip())))
        except ValueError:
            totals.append(None)
    if visible:
        try:
            order = [int(v) for v in visible.split(",") if v.strip()]
            totals = [totals[i] if 0 <= i < len(totals) else None for i in order]
        except ValueError:  # UUIDs or MIG names: keep nvidia-smi's order
            pass
    totals = (totals + [None] * num_gpus)[:num_gpus]
    return totals


def _split_cpu(n):
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    )
    # 0 means "TensorFlow picks", about one thread per core: only raise it, never lower it.
    current = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count() or 1
    if current < n:
        tf.config.threading.set_inter_op_parallelism_threads(n)
    if n > 1:
        warnings.warn(
            f"No GPU found: split the CPU into {n} logical devices. They share the CPU "
            "cores, so a pipeline shows overlap of stages, not speed-up.",
            stacklevel=3,
        )


def device_memory_bytes(name):
    """The memory of a local device in bytes, or None when it does not report one.

    A logical GPU has the `memory_limit` it was configured with (`setup_devices` splits a
    GPU so); a whole GPU has its total memory (`gpu_memory_mb`). A CPU device shares the
    host's memory: None.

    Args:
        name: a device name such as "/GPU:1" or "/CPU:0".

    Returns:
        An int of bytes, or None.
    """
    spec = tf.DeviceSpec.from_string(name)
    if (spec.device_type or "CPU").upper() != "GPU" or spec.job not in (None, "localhost"):
        return None
    physical = tf.config.list_physical_devices("GPU")
    configured = [
        [c.memory_limit for c in tf.config.get_logical_device_configuration(gpu) or []]
        for gpu in physical
    ]
    totals = gpu_memory_mb(len(physical)) if not all(configured) else [None] * len(physical)
    mb = logical_gpu_memory_mb(configured, totals)
    index = spec.device_index or 0
    return None if index >= len(mb) or mb[index] is None else mb[index] * 2**20


def logical_gpu_memory_mb(configured, totals):
    """Each logical GPU's memory in MB, in TensorFlow's order (pure).

    Args:
        configured: per physical GPU, the `memory_limit`s (MB, or None) of its logical
            devices; an empty list for a GPU that is not split.
        totals: per physical GPU, its total memory in MB, or None.

    Returns:
        A list with one entry per logical GPU: its limit, or for an unsplit GPU its total.
    """
    out = []
    for limits, total in zip(configured, totals):
        out += list(limits) if limits else [total]
    return out
