"""Argument checks shared by the cost model (pure Python).

Each check raises `TypeError` for a value of the wrong kind and `ValueError` for one out of
range, with a message that names the argument, shows the value and says what is valid.
"""

import math
import numbers


def is_number(value):
    """True for a real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int(value):
    """True for an integral number that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_number(name, value, what, minimum=0.0, strict=False, allow_inf=False):
    """Checks that `value` is a real number `>= minimum` (`> minimum` if `strict`).

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        what: what the number means, e.g. "bytes per second".
        minimum: the smallest valid value.
        strict: True if `minimum` itself is invalid.
        allow_inf: True if `math.inf` is valid.

    Returns:
        `value` as a float.

    Raises:
        TypeError: if `value` is not a real number.
        ValueError: if it is out of range, NaN, or infinite when that is not allowed.
    """
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    finite = "" if allow_inf else " finite"
    expected = f"a{finite} number {bound} ({what})"
    if not is_number(value):
        raise TypeError(
            f"`{name}` must be {expected}. Received: {name}={value!r} "
            f"of type {type(value).__name__}"
        )
    number = float(value)
    bad = (
        math.isnan(number)
        or (math.isinf(number) and not allow_inf)
        or number < minimum
        or (strict and number == minimum)
    )
    if bad:
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")
    return number


def check_int(name, value, what, minimum=1):
    """Checks that `value` is an int `>= minimum` and returns it as an int.

    Raises:
        TypeError: if `value` is not an integral number (bools are refused).
        ValueError: if it is smaller than `minimum`.
    """
    if not is_int(value):
        raise TypeError(
            f"`{name}` must be an int >= {minimum} ({what}). Received: {name}={value!r} "
            f"of type {type(value).__name__}"
        )
    if value < minimum:
        raise ValueError(
            f"`{name}` must be an int >= {minimum} ({what}). Received: {name}={value!r}"
        )
    return int(value)


def check_bool(name, value):
    """Checks that `value` is True or False.

    Raises:
        TypeError: for anything else (0 and 1 included).
    """
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False. Received: {name}={value!r}")
    return value


def check_instance(name, value, cls, hint=""):
    """Checks that `value` is an instance of `cls`.

    Raises:
        TypeError: if it is not; `hint` is appended to the message.
    """
    if not isinstance(value, cls):
        raise TypeError(
            f"`{name}` must be a {cls.__name__}{hint}. Received: {name}={value!r} "
            f"of type {type(value).__name__}"
        )
    return value
