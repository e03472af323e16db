"""Where the wrapped model's variables live, compared with the pipeline's stages.

`PipelineModel(model)` keeps `model`, which holds the true weights between epochs (callbacks
see it), and trains copies of its stages placed on their own devices. So `model`'s
variables are a whole extra copy of the model, wherever Keras created them: on the first
GPU when there is one, which is also where stage 0 lives. Built under
`with tf.device("/CPU:0"):` the copy costs host memory instead, and training is as fast
(the stages are the ones that train).

- `shared_accelerators`: the accelerators that hold both model variables and a stage;
- `warn_if_model_on_stage_device`: one `UserWarning` when there are any
  (`PipelineModel.__init__` calls it);
- `model_build_device`: where `trainers.build_trainer` builds a pipeline's model;
- `reads_locally`: whether a device reads the model's variables without copies
  (`costmodel.profile_model` times placed copies of the layers when it does not).
"""

import warnings

import tensorflow as tf

from tf_spectrain import messages

__all__ = [
    "is_cpu",
    "model_build_device",
    "reads_locally",
    "shared_accelerators",
    "variable_devices",
    "warn_if_model_on_stage_device",
]

CPU = "CPU"


def _parse(name):
    """`(job, replica, task, TYPE, index)` of a device name, or None if it names no type."""
    spec = tf.DeviceSpec.from_string(name or "")
    if spec.device_type is None:
        return None
    index = 0 if spec.device_index is None else spec.device_index  # "/GPU" means GPU:0
    return (spec.job, spec.replica, spec.task, spec.device_type.upper(), index)


def _same_device(a, b):
    """Whether two parsed names can be one device (an unnamed job, replica or task: any)."""
    return all(x is None or y is None or x == y for x, y in zip(a[:3], b[:3])) and a[3:] == b[3:]


def _short_name(parsed):
    """`"/GPU:0"` for a local device, else the full name with its job, replica and task."""
    job, replica, task, kind, index = parsed
    if job in (None, "localhost"):
        return f"/{kind}:{index}"
    return tf.DeviceSpec(
        job=job, replica=replica, task=task, device_type=kind, device_index=index
    ).to_string()


def is_cpu(device):
    """Whether the device name `device` names a CPU (`"/CPU:0"`, `"cpu:1"`, a full name)."""
    parsed = _parse(device)
    return parsed is not None and parsed[3] == CPU


def shared_accelerators(variable_device_names, stage_devices):
    """Gives the accelerators that hold both variables of the model and a pipeline stage.

    A pure function of the names. Names are compared by device type (any case) and index,
    so `"/GPU:0"`, `"gpu:0"`, `"/device:GPU:0"` and
    `"/job:localhost/replica:0/task:0/device:GPU:0"` are one device (a job, replica or task
    that one name leaves out matches any). CPU devices never count: every logical CPU
    device shares the host's memory, so a copy of the model there costs nothing that
    placing it elsewhere would save. Empty names (no device) are ignored.

    Args:
        variable_device_names: the device of each of the model's variables, e.g.
            `[v.value.device for v in model.variables]` (see `variable_devices`).
        stage_devices: the stages' device names, e.g. `["/GPU:0", "/device:GPU:1"]`.

    Returns:
        A list of short names (`"/GPU:0"`; a remote device keeps its job and task) of the
        non-CPU devices holding both, in the order of `stage_devices`, without repeats.
    """
    # Variables on CPUs never count (so stages on CPUs match nothing).
    held = [p for p in map(_parse, variable_device_names) if p is not None and p[3] != CPU]
    shared = []
    for stage in stage_devices:
        parsed = _parse(stage)
        if parsed is None:
            continue
        for variable in held:
            if _same_device(parsed, variable):
                name = _short_name(variable)
                if name not in shared:
                    shared.append(name)
    return shared


def reads_locally(variable_device_names, device):
    """Whether computing on `device` reads every variable without a copy between devices.

    True when each variable sits on `device` itself (compared as in `shared_accelerators`),
    or when `device` and the variable are both CPUs (logical CPU devices share the host's
    memory). Empty names (no device) count as local.

    Args:
        variable_device_names: the device of each of the model's variables.
        device: the device that computes, e.g. `"/GPU:0"`.

    Returns:
        A bool.
    """
    target = _parse(device)
    if target is None:
        return True
    for parsed in map(_parse, variable_device_names):
        if parsed is None or (parsed[3] == CPU and target[3] == CPU):
            continue
        if not _same_device(parsed, target):
            return False
    return True


def variable_devices(model):
    """The device name of each of `model.variables`, in order (e.g. `".../device:GPU:0"`)."""
    return [v.value.device for v in model.variables]


def model_build_device(devices):
    """Where to build a pipeline's model so it is no extra copy on `devices`: `"/CPU:0"`
    when a stage device is not a CPU (else its variables land beside stage 0), else None."""
    return None if all(is_cpu(d) for d in devices) else "/CPU:0"


def warn_if_model_on_stage_device(model, devices):
    """Warns once when `model`'s variables sit on an accelerator that also runs a stage.

    The stages are copies placed on their own devices, so the wrapped model's variables
    there are an extra copy that costs that device's memory. The `UserWarning` points at
    the caller of the caller (the `PipelineModel(...)` line) and says how to avoid it.

    Args:
        model: the wrapped Keras model.
        devices: the stages' device names.

    Returns:
        The list of shared devices (`shared_accelerators`); empty when nothing was warned.
    """
    names = variable_devices(model)
    shared = shared_accelerators(names, devices)
    if not shared:
        return shared
    nbytes = sum(
        v.value.shape.num_elements() * tf.as_dtype(v.dtype).size
        for v, name in zip(model.variables, names)
        if shared_accelerators([name], shared)  # this variable is on a shared device
    )
    where = ", ".join(shared)
    warnings.warn(
        f"The model passed to PipelineModel keeps its variables ({nbytes / 2**20:.1f} MiB) "
        f"on {where}, which also runs a pipeline stage. The stages train copies placed "
        "on their own devices, so the wrapped model is an extra copy of the model in that "
        "device's memory. To avoid it, build the model on the CPU before passing it to "
        'PipelineModel: `with tf.device("/CPU:0"): model = ...`. Training speed is '
        "unchanged (the stages train on their own devices).",
        UserWarning,
        stacklevel=messages.user_stacklevel(),
    )
    return shared
