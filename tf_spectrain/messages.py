"""Pieces of the Keras-style error messages used across the package (pure Python)."""

import difflib
import inspect
import os


def did_you_mean(value, choices, ignore_case=False, cutoff=0.6):
    """Builds `"; did you mean 'x'?"` for the choice closest to `value`.

    Args:
        value: what the user passed (a non-string never gets a hint).
        choices: the valid names.
        ignore_case: compare `value` in lower case (the choices are lower case).
        cutoff: `difflib.get_close_matches`' similarity threshold in [0, 1].

    Returns:
        The hint, or `""` if no choice is close enough.
    """
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(
        value.lower() if ignore_case else value, list(choices), n=1, cutoff=cutoff
    )
    return f"; did you mean '{close[0]}'?" if close else ""


def user_stacklevel():
    """The `stacklevel` for `warnings.warn`, called in the function that warns, that points
    the warning at the first caller outside tf_spectrain (the user's line)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = inspect.currentframe().f_back, 1  # the function that warns
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level
