"""Put stage models on devices, and copy weights between stage copies.

Keras 3 creates a variable on the device in scope when the layer builds, so a stage
cloned under `tf.device(d)` keeps all its variables on `d`. Each layer is re-created from
its config where that works, and otherwise copied as an object (`layer_copy.copy_layer`:
custom layers need not be serialisable), its variables again created under `tf.device(d)`.
(A stage whose clone from configs comes out with other weight shapes, from a config that
leaves out an argument, is copied layer by layer instead.) The clones are independent of
the original model: after training them, `copy_weights` writes their weights back into
the shared-layer stages of `split_model`, and thereby into the original model.
"""

import keras
import tensorflow as tf

from tf_spectrain.devices import existing_devices, logical_device_names
from tf_spectrain.partition.layer_copy import copy_layer


def place_stages(stages, devices):
    """Copies each stage onto its own device.

    Stage `k` is cloned with `keras.models.clone_model` under `tf.device(devices[k])`,
    so its variables (trainable and not) live on that device, and its current weights
    are copied in. Layers are re-created from their configs where those round-trip, and
    otherwise copied as objects (`layer_copy.copy_layer`), so the model need not be
    serialisable.

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
    check_stage_devices(devices, len(stages))
    placed = []
    for stage, device in zip(stages, devices):
        with tf.device(device):
            clone = keras.models.clone_model(stage, clone_function=_clone_layer)
            if _weight_shapes(clone) != _weight_shapes(stage):  # a config missing arguments
                clone = keras.models.clone_model(stage, clone_function=_copy_layer)
        _copy_model_weights(stage, clone, index=len(placed))
        _copy_adapted_state(stage, clone)
        placed.append(clone)
    return placed


def copy_trainable(src_models, dst_models):
    """Makes every layer of each destination model trainable as its source's layer is.

    Keras applies `layer.trainable = ...` at the next `compile` (transfer learning
    unfreezes a base model, then compiles again); `PipelineModel.compile` passes the
    wrapped model's flags to the stage copies with this.

    Args:
        src_models: the models whose flags count (`split_model`'s, sharing the layers of
            the wrapped model).
        dst_models: their copies (`place_stages`'), of the same architectures.
    """
    for src, dst in zip(src_models, dst_models):
        for source, target in _layer_pairs(src, dst):  # containers first, then what they hold
            if target.trainable != source.trainable:
                target.trainable = source.trainable


def _layer_pairs(src, dst):
    """Each layer of `src` (itself and its sublayers at any depth) with its copy in `dst`."""
    pairs = zip(src._flatten_layers(), dst._flatten_layers())  # noqa: SLF001
    return [(source, target) for source, target in pairs if source is not target]


def _copy_adapted_state(src, dst):
    """Gives preprocessing layers of `dst` the state `adapt` left in `src`'s, which their
    variables alone do not carry: a lookup's vocabulary (as Keras' saving restores it), and
    what `finalize_state` derives from the variables (`Normalization`'s mean and variance)."""
    for source, target in _layer_pairs(src, dst):
        if hasattr(source, "get_vocabulary") and hasattr(target, "set_vocabulary"):
            target.set_vocabulary(source.get_vocabulary())
        elif hasattr(target, "finalize_state") and target.built:
            target.finalize_state()


def check_stage_devices(devices, num_stages):
    """Checks that `devices` is a list of `num_stages` names of existing devices.

    Args:
        devices: what was given as the stages' devices.
        num_stages: the number of stages.

    Raises:
        TypeError: if `devices` is not a list of strings.
        ValueError: if it does not have one entry per stage, or a name cannot be parsed
            or names no existing device.
    """
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            "`devices` must be a list of device names, one per stage. "
            f"Received: devices={devices!r}"
        )
    if len(devices) != num_stages:
        raise ValueError(
            f"`devices` must name one device per stage: there are {num_stages} stages "
            f"but {len(devices)} devices. Received: devices={list(devices)}"
        )
    for device in devices:
        _check_device(device, devices)


def check_devices(devices):
    """Checks every name in `devices` parses and names one existing device.

    Raises TypeError for a name that is not a string, ValueError for a bad or missing one."""
    for device in devices:
        _check_device(device, devices)


def _weight_shapes(model):
    """The shapes of `model`'s weights, in order."""
    return [tuple(w.shape) for w in model.weights]


def _copy_layer(layer):
    """A copy of `layer` as an object (`layer_copy`), never from its config."""
    if isinstance(layer, keras.layers.Lambda):
        return _clone_layer(layer)
    return copy_layer(layer)


def _clone_layer(layer):
    """A fresh copy of `layer`: from its config (Keras' default) where that works, else
    a copy of the layer object (`layer_copy`); a Lambda layer reuses its Python function."""
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
    try:
        return layer.__class__.from_config(layer.get_config())
    except Exception as config_error:  # no config, or one its __init__ does not take
        # Custom layers often cannot round-trip their config (an __init__ without
        # **kwargs, a layer or an array as an argument, no get_config): placing a stage
        # must not need the model to be serialisable.
        return _copy_or_explain(layer, config_error)


def _copy_or_explain(layer, config_error):
    """`copy_layer(layer)`, or a ValueError saying why neither way of copying worked."""
    try:
        return copy_layer(layer)
    except Exception as copy_error:
        raise ValueError(
            f"Layer '{layer.name}' (class {type(layer).__name__}) cannot be copied onto "
            f"its stage's device: rebuilding it from its config failed ({config_error!r}), "
            f"and so did copying the layer object ({copy_error!r}). Give the layer a "
            "get_config() whose entries its __init__ takes (pass **kwargs on to "
            "super().__init__), or keep objects that cannot be copied out of it."
        ) from copy_error


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
