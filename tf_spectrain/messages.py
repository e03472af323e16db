"""Pieces of the Keras-style error messages used across the package (pure Python)."""

import difflib


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
