"""What differs between a checkpoint and a run: the comparison that refuses a wrong resume.

`compare_metadata` lists the differences, one readable line per key; `check_compatible`
raises `CheckpointError` with all of them. Values are compared as JSON stores them.
Pure Python: neither TensorFlow nor Keras.
"""

import json
import math
from collections import abc

from tf_spectrain.checkpoint.format import CheckpointError
from tf_spectrain.checks import show


def compare_metadata(saved, current, keys):
    """Describes how two metadata dicts differ on the given keys.

    Values are compared as JSON stores them (tuples equal lists; `True` differs from `1`).

    Args:
        saved: the metadata recorded in a checkpoint (`info["metadata"]`).
        current: the metadata of this run.
        keys: the names to compare, e.g. `["model", "cuts", "mode"]`.

    Returns:
        A list of human-readable differences, one per key, e.g.
        `"mode: the checkpoint has 'stash', this run has 'spectrain'"`; lists also say
        which elements differ. A key present on one side only is a difference. `[]` when
        everything matches.

    Raises:
        TypeError: `saved` or `current` is not a dict, or `keys` is not a list of str.
    """
    for name, value in (("saved", saved), ("current", current)):
        if not isinstance(value, abc.Mapping):
            raise TypeError(
                f"`{name}` must be a metadata dict. Received: {name} of type "
                f"{type(value).__name__}"
            )
    keys = _check_keys(keys)
    differences = []
    for key in keys:
        in_saved, in_current = key in saved, key in current
        if not in_saved and not in_current:
            continue
        if not in_saved:
            differences.append(
                f"{key}: the checkpoint does not record it, this run has {show(current[key])}"
            )
        elif not in_current:
            differences.append(
                f"{key}: the checkpoint has {show(saved[key])}, this run does not set it"
            )
        else:
            old, new = _as_json(saved[key]), _as_json(current[key])
            if not _same(old, new):
                differences.append(f"{key}: {describe_difference(old, new)}")
    return differences


class IncompatibleCheckpoint(CheckpointError):
    """A checkpoint written by a run with other settings (the message lists them)."""


def check_compatible(info, current, keys):
    """Refuses a checkpoint written by a run with other settings.

    Args:
        info: the info dict returned by `load_checkpoint`.
        current: the metadata of this run.
        keys: the metadata names that must match, e.g. `["model", "cuts", "mode"]`.

    Raises:
        IncompatibleCheckpoint: (a `CheckpointError`) some of `keys` differ; the message
            names the checkpoint and lists every difference.
        TypeError: `info` is not a `load_checkpoint` info dict, or see `compare_metadata`.
    """
    if not isinstance(info, abc.Mapping) or not isinstance(info.get("metadata"), abc.Mapping):
        raise TypeError(
            "`info` must be the info dict returned by load_checkpoint(), with a "
            f"'metadata' dict. Received: {show(info)}"
        )
    differences = compare_metadata(info["metadata"], current, keys)
    if differences:
        listing = "\n".join(f"  - {difference}" for difference in differences)
        raise IncompatibleCheckpoint(
            f"Checkpoint {info.get('path', '(unknown path)')} was written by a different "
            f"run:\n{listing}\nResume with the same settings, or write checkpoints to "
            "another directory."
        )


def describe_difference(old, new):
    """One line saying how the JSON values `old` (the checkpoint's) and `new` differ.

    Args:
        old: the checkpoint's value, as JSON stores it.
        new: this run's value, as JSON stores it.

    Returns:
        e.g. `"the checkpoint has ['a', 'b'], this run has ['a', 'c'] (element 1: 'b' vs
        'c')"`; lists say which elements differ (the first three), dicts which keys.
    """
    text = f"the checkpoint has {show(old)}, this run has {show(new)}"
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{text} ({len(old)} elements vs {len(new)})"
        indices = [i for i, (x, y) in enumerate(zip(old, new, strict=True)) if not _same(x, y)]
        shown = "; ".join(f"element {i}: {show(old[i])} vs {show(new[i])}" for i in indices[:3])
        more = f"; and {len(indices) - 3} more" if len(indices) > 3 else ""
        return f"{text} ({shown}{more})"
    if isinstance(old, dict) and isinstance(new, dict):
        names = sorted(set(old) ^ set(new)) + sorted(
            key for key in set(old) & set(new) if not _same(old[key], new[key])
        )
        return f"{text} (differs in {', '.join(repr(name) for name in names)})"
    return text


def _check_keys(keys):
    """`keys` as a list of str (one str alone is refused: it is a common slip)."""
    if isinstance(keys, str):
        raise TypeError(
            f"`keys` must be a list of metadata names, not one str. Received: keys={keys!r}; "
            f"did you mean keys=[{keys!r}]?"
        )
    try:
        keys = list(keys)
    except TypeError:
        raise TypeError(
            f"`keys` must be a list of metadata names. Received: keys={show(keys)}"
        ) from None
    bad = [key for key in keys if not isinstance(key, str)]
    if bad:
        raise TypeError(f"`keys` must all be str. Received: keys={show(keys)}")
    return keys


def _as_json(value):
    """`value` as JSON would store it (tuples become lists), when it is JSON at all."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


def _same(a, b):
    """Equality as JSON means it: bools are not numbers, NaN equals NaN."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # an exotic object whose == fails or is ambiguous: not the same
        return False
