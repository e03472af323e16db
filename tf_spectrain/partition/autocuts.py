"""`PipelineModel`'s `cuts`: check a given list, or pick the devices of `"auto"` cuts.

The planning itself is `tf_spectrain.costmodel.auto_partition` (profile, plan, calibrate).
"""

import warnings

from tf_spectrain import checks, messages, partition
from tf_spectrain import devices as devices_lib
from tf_spectrain.partition.cuts import check_cut_names


def stage_devices(devices, num_stages):
    """The stage devices of an `"auto"` pipeline.

    Args:
        devices: a list of device names, or None.
        num_stages: an int >= 1, or None.

    Returns:
        `devices` as a list; or, when None, `num_stages` default devices
        (`devices.default_devices`), else every GPU, else every logical CPU device.

    Raises:
        TypeError: if `devices` is not a list or `num_stages` not an int.
        ValueError: if both are given and disagree, or too few devices exist.
    """
    if num_stages is not None:
        num_stages = checks.check_int("num_stages", num_stages, 1, meaning="pipeline stages")
    if devices is None:
        if num_stages is None:
            gpus = devices_lib.existing_devices("GPU")
            return gpus or devices_lib.existing_devices("CPU")
        return devices_lib.default_devices(num_stages)
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            "`devices` must be a list of device names, one per stage. "
            f"Received: devices={devices!r}"
        )
    if num_stages is not None and num_stages != len(devices):
        raise ValueError(
            f"`num_stages` must match `devices` (one device per stage). Received: "
            f"num_stages={num_stages}, devices={list(devices)} ({len(devices)} devices)"
        )
    if not devices:
        raise ValueError("`devices` must name at least one device. Received: devices=[]")
    partition.check_devices(devices)
    return list(devices)


def devices_for_model(model, devices):
    """The first `devices`, one per stage the model can be cut into (with a warning when
    that is fewer than `len(devices)`): for `cuts="auto"` on every device by default.

    Args:
        model: the built Keras model.
        devices: the stage devices found (every GPU, else every logical CPU device).

    Returns:
        A list of at most `len(devices)` device names.
    """
    places = partition.cuts_keeping_masks(model)
    if len(places) + 1 >= len(devices):
        return list(devices)
    warnings.warn(
        f"Model '{model.name}' can be cut in only {len(places)} place(s) ({places}), so "
        f"the pipeline has {len(places) + 1} stage(s) rather than one per device "
        f"({len(devices)}). Pass `num_stages` or `devices` to be told instead.",
        stacklevel=messages.user_stacklevel())
    return list(devices[: len(places) + 1])


def check_given_cuts(cuts, num_stages):
    """Checks a list of cuts against `num_stages` (names are checked when splitting).

    Args:
        cuts: what `PipelineModel` received as `cuts` (not `"auto"`).
        num_stages: an int or None.

    Raises:
        TypeError: if `cuts` is a string other than `"auto"` (with a hint), not a list, or
            holds a non-string (`partition.cuts.check_cut_names`).
        ValueError: if `num_stages` is not `len(cuts) + 1`.
    """
    check_cut_names(cuts, allow_auto=True)
    if num_stages is not None:
        num_stages = checks.check_int("num_stages", num_stages, 1, meaning="pipeline stages")
        if num_stages != len(cuts) + 1:
            raise ValueError(
                f"`num_stages` must be len(cuts) + 1 = {len(cuts) + 1} with these cuts (or "
                f"None). Received: num_stages={num_stages}, cuts={list(cuts)}"
            )
