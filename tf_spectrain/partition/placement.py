"""Put stage models on devices, and copy weights between stage copies.

Keras 3 creates a variable on the device in scope when the layer builds, so a stage
cloned under `tf.device(d)` keeps all its variables on `d`. The clones are independent
of the original model: after training them, `copy_weights` writes their weights back
into the shared-layer stages of `split_model`, and thereby into the original model.
"""

import keras
import tensorflow as tf

from tf_spectrain.devices import existing_devices, logical_device_names


def place_stages(stages, devices):
    """Copies each stage onto its own device.

    Stage `k` is cloned with `keras.models.clone_model` under `tf.device(devices[k])`,
    so its variables (trainable and not) live on that device, and its current weights
    are copied in.

    Args:
        stages: list of `keras.Model`s, for example from `split_model`.
        devices: list of device names (such as `"/GPU:0"` or `"/CPU:3"`), one per stage.

    Returns:
        A list of new `keras.Model`s, stage `k`'s copy on `devices[k]`.

    Raises:
        TypeError: if `stages` is not a list of Keras models or `devices` is not a list
            of strings.
        ValueError: if `devices` does not have one entry per stage, or a device name
            cannot be parsed.
    """
    _check_models(stages, "stages")
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            "`devices` must be a list of device names, one per stage. "
            f"Received: devices={devices!r}"
        )
    if len(devices) != len(stages):
        raise ValueError(
            f"`devices` must name one device per stage: there are {len(stages)} stages "
            f"but {len(devices)} devices. Received: devices={list(devices)}"
        )
    for device in devices:
        _check_device(device, devices)
    placed = []
    for stage, device in zip(stages, devices):
        with tf.device(device):
            clone = keras.models.clone_model(stage, clone_function=_clone_layer)
        _copy_model_weights(stage, clone, index=len(placed))
        placed.append(clone)
    return placed


def check_devices(devices):
    """Checks that every name in `devices` parses, names one device and exists.

    Args:
        devices: a list of device names.

    Raises:
        TypeError: if a name is not a string.
        ValueError: if a name cannot be parsed or names no existing device.
    """
    for device in devices:
        _check_device(device, devices)


def _clone_layer(layer):
    """A fresh copy of `layer` (Keras' default), reusing a Lambda layer's Python function."""
    # Re-creating a Lambda from its config would deserialise Python bytecode, which Keras
    # refuses in safe mode; the copy lives in the same process, so the function is reused.
    if isinstance(layer, keras.layers.Lambda):
        return keras.layers.Lambda(
            layer.function,
            # Keras keeps the output_shape argument only in this private attribute.
            output_shape=getattr(layer, "_output_shape", None),
            mask=layer.mask,
            arguments=layer.arguments,
            name=layer.name,
            dtype=layer.dtype_policy,
        )
    return layer.__class__.from_config(layer.get_config())


def copy_weights(src_models, dst_models):
    """Copies the weights of each source model into the matching destination model.

    Every weight is copied, trainable or not (BatchNorm statistics too), in the models'
    `weights` order, which `keras.models.clone_model` preserves. Typical use: after
    training the placed copies, `copy_weights(placed, stages)` updates the stages of
    `split_model` and so the original model.

    Args:
        src_models: list of `keras.Model`s to copy from.
        dst_models: list of `keras.Model`s to copy into, of the same architectures.

    Raises:
        TypeError: if either argument is not a list of Keras models.
        ValueError: if the lists differ in length, or a pair of models differs in its
            number of weights or in a weight's shape.
    """
    _check_models(src_models, "src_models")
    _check_models(dst_models, "dst_models")
    if len(src_models) != len(dst_models):
        raise ValueError(
            "`src_models` and `dst_models` must have the same length (one destination "
            f"per source). Received: {len(src_models)} sources and "
            f"{len(dst_models)} destinations"
        )
    for k, (src, dst) in enumerate(zip(src_models, dst_models)):
        _copy_model_weights(src, dst, index=k)


def _copy_model_weights(src, dst, index):
    src_weights, dst_weights = src.weights, dst.weights
    if len(src_weights) != len(dst_weights):
        raise ValueError(
            f"Model {index} ('{src.name}' -> '{dst.name}'): the source has "
            f"{len(src_weights)} weights but the destination has {len(dst_weights)}. "
            "The models must have the same architecture."
        )
    for s, d in zip(src_weights, dst_weights):
        if tuple(s.shape) != tuple(d.shape):
            raise ValueError(
                f"Model {index} ('{src.name}' -> '{dst.name}'): weight '{s.path}' has "
                f"shape {tuple(s.shape)} but its destination '{d.path}' has shape "
                f"{tuple(d.shape)}. The models must have the same architecture."
            )
    for s, d in zip(src_weights, dst_weights):
        d.assign(s.value)


def _check_models(models, arg_name):
    if not isinstance(models, (list, tuple)) or not all(
        isinstance(m, keras.Model) for m in models
    ):
        raise TypeError(
            f"`{arg_name}` must be a list of keras.Model. Received: {arg_name}={models!r}"
        )


def _check_device(device, devices):
    """Checks that `device` parses, names one device (type and index) and exists."""
    # TensorFlow silently puts variables on another device when the requested local one
    # does not exist, so a typo would go unnoticed without this check; a device of a job
    # that is not connected fails deep inside TensorFlow instead. Devices of other jobs
    # exist once `tf.config.experimental_connect_to_cluster` has connected them.
    if not isinstance(device, str):
        raise TypeError(
            "`devices` must contain device names (strings). "
            f"Received: {device!r} of type {type(device).__name__} in devices={list(devices)}"
        )
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError as e:
        raise ValueError(
            f"`devices` must contain valid device names such as '/CPU:0' or '/GPU:1'. "
            f"Received: {device!r} in devices={list(devices)}"
        ) from e
    if spec.device_type is None or spec.device_index is None:
        raise ValueError(
            "`devices` must name one device each, with its type and index, such as '/CPU:0' "
            f"or '/GPU:1'. Received: {device!r} in devices={list(devices)}"
        )
    known = _known_devices()
    if _device_key(spec) not in known:
        available = existing_devices() + [name for key, name in known.items() if key[0] != _LOCAL]
        raise ValueError(
            f"`devices` must name devices that exist. Received: {device!r} in "
            f"devices={list(devices)}; available: {available}. To split one device "
            "into several, call tf_spectrain.setup_devices(n) before any TensorFlow op."
        )


_LOCAL = "localhost"


def _device_key(spec):
    """(job, replica, task, type, index) of a `tf.DeviceSpec`, with the defaults filled in."""
    return (
        spec.job or _LOCAL,
        spec.replica or 0,
        spec.task or 0,
        (spec.device_type or "").upper(),
        spec.device_index,
    )


def _known_devices():
    """`{_device_key: name}` of every logical device, local or of a connected cluster."""
    return {_device_key(tf.DeviceSpec.from_string(name)): name for name in logical_device_names()}
