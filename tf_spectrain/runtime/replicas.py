"""Data x pipeline hybrids: R copies of one pipeline that train as one.

`PipelineModel(..., replicas=R)` places R copies of its N-stage pipeline on R x N devices,
replica r's stage k on device r * N + k (`replica_devices`). Every mini-batch is split
evenly across the replicas; before each update, stage k's R copies sum their gradients with
TensorFlow's collective all-reduce (`GradientReducer`), each stage in its own collective
group (copies on a cluster's workers add up each other's gradients instead, see
`attach_reducers`), so the copies apply the same update and hold the same weights and
optimizer state.
Each replica's loss is scaled by its share of the mini-batch, so the sum is the gradient of
the whole mini-batch, as one pipeline with the same batch computes it.

BatchNorm statistics stay per replica while an epoch runs (each normalises its own slice,
as under `tf.distribute.MirroredStrategy`); `average_non_trainable` sets every copy to
their mean at the end of each epoch.
"""

import itertools
import re
import threading

import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain import devices as devices_lib

# Collective group keys of this process: far above the small keys tf.distribute strategies
# count up from 1, so that a strategy in the same process never meets ours.
_FIRST_GROUP_KEY = 0x5EC70000
_keys = itertools.count(_FIRST_GROUP_KEY)
_keys_lock = threading.Lock()
INSTANCE_KEY = 1  # each group runs one reduction, again at every update


def new_group_keys(count):
    """Reserves `count` distinct collective group keys (one per stage) no other group uses."""
    with _keys_lock:
        return [next(_keys) for _ in range(count)]


def replica_devices(devices, replicas, num_stages=None):
    """Splits the devices of a replicated pipeline into one list per replica.

    Args:
        devices: a list of `replicas * N` device names (replica r's stage k is entry
            `r * N + k`), or None for the first `replicas * num_stages` distinct devices
            (GPUs first, see `tf_spectrain.setup_devices`).
        replicas: R, an int >= 1.
        num_stages: N, the stages of each replica; None means `len(devices) // replicas`.

    Returns:
        A list of R lists of N device names.

    Raises:
        TypeError: if `devices` is not a list of names.
        ValueError: if the number of devices is not R * N, or too few devices exist.
    """
    if devices is None:
        if num_stages is None:
            raise ValueError(
                "A pipeline with `replicas` and devices=None needs its number of stages "
                "(`num_stages`, or a list of cuts)."
            )
        devices = devices_lib.default_devices(replicas * num_stages)
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            "`devices` must be a list of device names, `replicas` x stages of them (replica "
            f"r's stage k at r * stages + k). Received: devices={devices!r}"
        )
    devices = list(devices)
    stages = num_stages if num_stages is not None else len(devices) // replicas
    if stages < 1 or len(devices) != replicas * stages:
        want = (f"{replicas} x {num_stages} = {replicas * num_stages}" if num_stages
                else f"a multiple of {replicas}")
        raise ValueError(
            f"`devices` must name one device per stage of every replica: {want} devices "
            f"(replica r's stage k at r * stages + k). Received: replicas={replicas}, "
            f"{len(devices)} devices {devices}"
        )
    return [devices[r * stages:(r + 1) * stages] for r in range(replicas)]


def check_replicas(replicas):
    """Checks `replicas`, an int >= 1; returns it."""
    return checks.check_int("replicas", replicas, 1, meaning="copies of the pipeline")


class GradientReducer:
    """Sums one stage's gradients over its R copies with one collective all-reduce.

    Every copy of the stage calls it (each from its own thread) with its gradients, once
    per update, in the same order; each gets the sum back. The gradients are flattened
    into one vector per dtype, so an update costs one collective per dtype.

    Args:
        group_size: R.
        group_key: the stage's collective group (see `new_group_keys`), shared by its R
            copies and by no other group.
        device: the device of this copy of the stage.
    """

    def __init__(self, group_size, group_key, device):
        self.group_size = group_size
        self.group_key = group_key
        self.device = device
        self._fn = tf.function(self._reduce)

    def __call__(self, grads):
        """The sum over the replicas of `grads` (a list of tensors), as a list."""
        grads = [tf.convert_to_tensor(g) for g in grads]  # IndexedSlices become dense
        with tf.device(self.device):
            return list(self._fn(grads))

    def _reduce(self, grads):
        out = list(grads)
        by_dtype = {}
        for n, g in enumerate(grads):
            by_dtype.setdefault(g.dtype, []).append(n)
        for offset, members in enumerate(by_dtype.values()):
            flat = tf.concat([tf.reshape(grads[n], [-1]) for n in members], axis=0)
            summed = tf.raw_ops.CollectiveReduceV2(
                input=flat, group_size=self.group_size, group_key=self.group_key,
                instance_key=INSTANCE_KEY + offset, ordering_token=[],
                merge_op="Add", final_op="Id",
            )
            sizes = [grads[n].shape.num_elements() for n in members]  # weights: static
            for n, part in zip(members, tf.split(summed, sizes)):
                out[n] = tf.reshape(part, grads[n].shape)
        return out


def sum_over_replicas(gradient, gathered, reducer, device):
    """One copy's pending gradient summed over the stage's R copies.

    With a `reducer` (copies in one process' devices) the copies sum with one collective
    all-reduce; without one (copies on different workers, where a collective launched from
    this one client process would wait for ever) each copy adds up `gathered` itself, in
    replica order, so every copy gets the same sum.

    Args:
        gradient: this copy's pending gradient (a list of tensors).
        gathered: every copy's pending gradient of this update, replica 0 first.
        reducer: the copy's `GradientReducer`, or None.
        device: the copy's device.

    Returns:
        The summed gradient, a list.
    """
    if reducer is not None:
        return reducer(gradient)
    with tf.device(device):
        return [tf.add_n([tf.convert_to_tensor(g[n]) for g in gathered])
                for n in range(len(gradient))]


def _is_local(device):
    """Whether a device name is one of this process' own (`/CPU:0`, `/job:localhost/...`)."""
    job = re.search(r"/job:([^/]+)", device)
    return job is None or job.group(1) == "localhost"


def attach_reducers(grid):
    """Gives the stage runners of every replica their `GradientReducer`s.

    A stage whose R copies are all on this process' own devices sums with a collective
    all-reduce. One with a copy on a worker of a cluster gets none: a collective launched
    on workers from this single client process waits for ever (measured with TF 2.21, for
    copies on one worker and on two), so its copies add up each other's gradients instead
    (see `sum_over_replicas`), TensorFlow's runtime moving the tensors.

    Args:
        grid: R lists of N `StageRunner`s, replica 0 first.
    """
    if len(grid) < 2:
        return
    for k, group_key in enumerate(new_group_keys(len(grid[0]))):
        if not all(_is_local(runners[k].device) for runners in grid):
            continue
        for runners in grid:
            device = runners[k].device
            runners[k].updater.reducer = GradientReducer(len(grid), group_key, device)


def average_non_trainable(grid_stages):
    """Sets each non-trainable variable of every replica to its mean over the replicas.

    BatchNorm's moving statistics are the usual ones; integer variables are set to
    replica 0's value.

    Args:
        grid_stages: R lists of N placed stage models, replica 0 first.
    """
    if len(grid_stages) < 2:
        return
    for copies in zip(*grid_stages):
        for variables in zip(*(stage.non_trainable_variables for stage in copies)):
            values = [v.value for v in variables]
            if values[0].dtype.is_floating:
                mean = tf.add_n([tf.identity(x) for x in values]) / len(values)
            else:
                mean = values[0]
            for v in variables:
                v.assign(mean)


def broadcast_first(grid_stages, grid_optimizers):
    """Copies replica 0's variables and optimizer variables into every other replica.

    Args:
        grid_stages: R lists of N placed stage models, replica 0 first.
        grid_optimizers: R lists of N stage optimizers, replica 0 first.
    """
    for r in range(1, len(grid_stages)):
        pairs = zip(grid_stages[0], grid_stages[r], grid_optimizers[0], grid_optimizers[r])
        for src, dst, src_opt, dst_opt in pairs:
            for a, b in zip(src.variables, dst.variables, strict=True):
                b.assign(a.value)
            for a, b in zip(src_opt.variables, dst_opt.variables, strict=True):
                b.assign(a.value)
