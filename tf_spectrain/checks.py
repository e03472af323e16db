"""Argument checks used at the package's boundaries: one rule, one message shape.

A value of the wrong type raises `TypeError`; a value of the right type but out of range
raises `ValueError`. Messages read "`name` must be <what is valid>. Received: name=<value>",
or "--flag must be <...>. Received: --flag <value>" when `name` is a command-line flag.
Pure Python: no TensorFlow, Keras or NumPy import.
"""

import math
import numbers
import os
import tempfile

from tf_spectrain.messages import did_you_mean

_SHOW_LIMIT = 120


def is_int(value):
    """Whether `value` is an integral number (Python or NumPy) that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value):
    """Whether `value` is a real number (Python or NumPy) that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def show(value):
    """`repr(value)` for a message, cut to 120 characters (ending in "...") when longer."""
    text = repr(value)
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 3] + "..."


def received(name, value):
    """Builds the "Received: ..." part of a message, for an argument or a `--flag`.

    Args:
        name: the argument's name, or a flag starting with "--".
        value: the value received.

    Returns:
        "Received: name=<repr>" for an argument, or "Received: --flag <value>" for a flag (the
        value as typed, quoted when empty or padded with spaces).
    """
    if name.startswith("--"):
        shown = value if isinstance(value, (int, float)) else _flag_value(value)
        return f"Received: {name} {shown}"
    return f"Received: {name}={show(value)}"


def _flag_value(value):
    """A flag's value as typed, quoted when it would be invisible (empty or spaces)."""
    text = str(value)
    return repr(value) if not text.strip() or text != text.strip() else text


def _label(name):
    return name if name.startswith("--") else f"`{name}`"


def _fail(error, name, value, valid, meaning=""):
    meaning = f" ({meaning})" if meaning else ""
    kind = f" of type {type(value).__name__}" if error is TypeError else ""
    raise error(f"{_label(name)} must be {valid}{meaning}. {received(name, value)}{kind}")


def _int_range(minimum, maximum):
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def check_int(
    name, value, minimum=None, maximum=None, *, meaning="", allow=(), none_ok=False, valid=None
):
    """Checks that `value` is an integer (not a bool) in `[minimum, maximum]`.

    Args:
        name: the argument's name (or a `--flag`), for the message.
        value: the value to check.
        minimum, maximum: the inclusive bounds (None: unbounded).
        meaning: what the number means, shown in parentheses.
        allow: strings that are accepted as they are (e.g. `("auto",)`).
        none_ok: True if None is accepted.
        valid: what the message says is valid, instead of the range (e.g. "at most 64").

    Returns:
        `value` as an int (or the allowed value, or None).

    Raises:
        TypeError: if `value` is not an integral number (and not allowed).
        ValueError: if it is out of range, or a string that `allow` does not hold (when
            `allow` is given, strings are of a valid type).
    """
    if (value is None and none_ok) or (isinstance(value, str) and value in allow):
        return value
    if valid is None:
        valid = _int_range(minimum, maximum)
        valid += "".join(f" or {a!r}" for a in allow) + (" or None" if none_ok else "")
    if allow and isinstance(value, str):
        _fail(ValueError, name, value, valid, meaning)
    if not is_int(value):
        _fail(TypeError, name, value, valid, meaning)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        _fail(ValueError, name, value, valid, meaning)
    return int(value)


def check_number(
    name, value, minimum=None, maximum=None, *, strict=False, allow_inf=False, meaning="",
    valid=None,
):
    """Checks that `value` is a real number (not a bool), finite unless `allow_inf`.

    Args:
        name: the argument's name (or a `--flag`), for the message.
        value: the value to check.
        minimum: the smallest valid value (None: unbounded); `strict` excludes it.
        maximum: the largest valid value, excluded (None: unbounded).
        strict: True if `minimum` itself is invalid.
        allow_inf: True if an infinite value is valid.
        meaning: what the number means, shown in parentheses.
        valid: what the message says is valid, instead of the range (e.g. "in [0, 1)").

    Returns:
        `value` as a float.

    Raises:
        TypeError: if `value` is not a real number.
        ValueError: if it is NaN, infinite when that is not allowed, or out of range.
    """
    if valid is None:
        parts = []
        if minimum is not None:
            parts.append(f"> {minimum:g}" if strict else f">= {minimum:g}")
        if maximum is not None:
            parts.append(f"< {maximum:g}")
        valid = ("a number" if allow_inf else "a finite number") + (
            " " + " and ".join(parts) if parts else ""
        )
    if not is_number(value):
        _fail(TypeError, name, value, valid, meaning)
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float: beyond any finite bound
        number = math.inf if value > 0 else -math.inf
    bad = (
        math.isnan(number)
        or (math.isinf(number) and not allow_inf)
        or (minimum is not None and (number < minimum or (strict and number == minimum)))
        or (maximum is not None and number >= maximum)
    )
    if bad:
        _fail(ValueError, name, value, valid, meaning)
    return number


def check_bool(name, value, none_ok=False):
    """Checks that `value` is True or False (a Python or NumPy bool; not 0 or 1).

    Args:
        name: the argument's name (or a `--flag`), for the message.
        value: the value to check.
        none_ok: True if None is accepted.

    Returns:
        `value` as a Python bool (or None when `none_ok`).

    Raises:
        TypeError: for anything else.
    """
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or _is_numpy_bool(value):
        return bool(value)
    _fail(TypeError, name, value, "True, False or None" if none_ok else "True or False")


def _is_numpy_bool(value):
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")


def check_one_of(name, value, choices, *, ignore_case=False):
    """Checks that `value` is one of `choices` (with a "did you mean" for near misses).

    Args:
        name: the argument's name (or a `--flag`), for the message.
        value: the value to check; an unhashable or uncomparable value is not a choice.
        choices: the valid values (any iterable).
        ignore_case: True if the "did you mean" hint ignores case (matching itself does not).

    Returns:
        `value`.

    Raises:
        ValueError: if it is not one of them.
    """
    choices = list(choices)
    try:
        if value in choices:
            return value
    except (TypeError, ValueError):  # unhashable, uncomparable or an array: not a choice
        pass
    hint = did_you_mean(value, choices, ignore_case=ignore_case) if isinstance(value, str) else ""
    label = _label(name)
    raise ValueError(f"{label} must be one of {choices}. {received(name, value)}{hint}")


def check_instance(name, value, cls, hint=""):
    """Checks that `value` is an instance of `cls`.

    Args:
        name: the argument's name (or a `--flag`), for the message.
        value: the value to check.
        cls: a class or a tuple of classes.
        hint: text appended to the class names in the message (e.g. " or a path").

    Returns:
        `value`.

    Raises:
        TypeError: if it is not an instance of `cls`.
    """
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        _fail(TypeError, name, value, f"a {names}{hint}")
    return value


def check_path(name, value, valid=None):
    """Checks that `value` is a non-empty path (str or `os.PathLike`).

    Args:
        name: the argument's name (or a `--flag`), for the message.
        value: the value to check.
        valid: what the message says is valid (e.g. "a path"); None: a default description.

    Returns:
        `value` as a str.

    Raises:
        TypeError: if it is not a str or `os.PathLike`.
        ValueError: if it is empty or only spaces.
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        _fail(TypeError, name, value, valid or "a path (str or os.PathLike)")
    if not value.strip():
        _fail(ValueError, name, value, valid or "a non-empty path")
    return value


def check_writable_dir(name, path, probe_prefix=".tmp-probe-"):
    """Creates directory `path` if missing and checks that a file can be written there.

    Cheap (one probe file, written and removed): meant to run before long work starts.

    Args:
        name: how the caller named the directory (an argument name or a `--flag`).
        path: the directory (str or `os.PathLike`).
        probe_prefix: the name prefix of the probe file.

    Returns:
        `path` as a str.

    Raises:
        TypeError: if `path` is not a path.
        ValueError: if `path` is a file, cannot be created, or is not writable; the message
            names `name`, `path` and the reason the system gave.
    """
    path = check_path(name, path)
    label = _label(name)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"{label} must be a directory, but it is an existing file. {received(name, path)}. "
            "Remove the file or choose another directory."
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"{label} must be a directory that can be created. {received(name, path)}; "
            f"creating it failed: {os_reason(error)}"
        ) from error
    try:
        handle, probe = tempfile.mkstemp(prefix=probe_prefix, dir=path)
        try:
            os.write(handle, b"probe")
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as error:
        raise ValueError(
            f"{label} must be a directory where files can be written. {received(name, path)}; "
            f"writing a file there failed: {os_reason(error)}"
        ) from error
    return path


def os_reason(error):
    """The system's reason for an `OSError`: its `strerror`, else its text."""
    return error.strerror or str(error)
