"""Which runtime a test's pipeline trains with, as `compile` arguments.

`compile(steps_per_execution=K)` runs windows of K mini-batches (K = 1: a graph call per
mini-batch); `compile(run_eagerly=True)` runs pass by pass, each pass from its stage's thread
(`runtime.executor`). Tests name the second `EAGER` where they take a K.
"""

import warnings

EAGER = "eager"


def compile_options(steps_per_execution):
    """`compile`'s keyword arguments for a K, or for `EAGER`."""
    if steps_per_execution == EAGER:
        return {"run_eagerly": True}
    return {"steps_per_execution": steps_per_execution}


def compile_quietly(pipe, *args, steps_per_execution="auto", **kwargs):
    """`pipe.compile(*args, **kwargs)` for a K or `EAGER`, without `run_eagerly`'s warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*run_eagerly=True", category=UserWarning)
        pipe.compile(*args, **compile_options(steps_per_execution), **kwargs)
