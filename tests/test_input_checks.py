"""tf_spectrain.workflow.input_checks: the argument checks of PipelineModel and train.py's
split check.

`fit`, `evaluate` and `predict` reject bad arguments in tests/test_bad_input.py; here the
pieces that are called directly (train.py, the pipeline) and the names kept for them.
"""

import numpy as np
import pytest

from tf_spectrain.workflow import input_checks


@pytest.mark.parametrize(
    "args, flags, message",
    [
        ((16, 6, 4), False, "`micro_batches`=4 must divide `batch_size` (each mini-batch splits "
                            "into 4 equal micro-batches). Received: batch_size=6"),
        ((16, 6, 4), True, "--micro-batches must divide --batch-size. Received: --batch-size 6 "
                           "and --micro-batches 4"),
        ((18, 8, 4), False, "The last mini-batch of an epoch has 2 examples (18 examples, "
                            "batch_size=8), fewer than `micro_batches`=4: it cannot be split. "
                            "Choose a batch size that leaves no remainder, or fewer "
                            "micro-batches."),
        ((66, 32, 4), True, "The last mini-batch of an epoch has 2 examples (66 training "
                            "examples, --batch-size 32), fewer than --micro-batches 4: it "
                            "cannot be split. Choose a batch size that leaves no remainder or "
                            "a larger one, or fewer micro-batches."),
    ],
)
def test_micro_batch_split_messages(args, flags, message):
    with pytest.raises(ValueError) as info:
        input_checks.check_micro_batch_split(*args, flags=flags)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "args",
    [(18, 8, 1), (16, 8, 4), (20, 8, 4), (19, 8, 2), (None, 8, 4), (3, 8, 2)],
)
def test_micro_batch_split_accepts(args):
    # One micro-batch, no remainder, a remainder of at least m, or an unknown length; an
    # epoch shorter than a batch is its own last mini-batch (3 examples split into 2).
    assert input_checks.check_micro_batch_split(*args) is None


@pytest.mark.parametrize(
    "verbose, error", [(3, ValueError), ("yes", ValueError), (None, TypeError), (1.0, TypeError)]
)
def test_verbose(verbose, error):
    with pytest.raises(error, match=r"`verbose` must be 'auto', 0 \(silent\)"):
        input_checks.check_verbose(verbose)
    for good in ("auto", 0, 1, 2, np.int64(2)):
        input_checks.check_verbose(good)


def test_every_exported_name_is_defined_here():
    assert input_checks.DEFAULT_BATCH_SIZE == 32
    for name in input_checks.__all__:
        value = getattr(input_checks, name)
        assert not callable(value) or value.__module__ == input_checks.__name__, name


@pytest.mark.parametrize("verbose", [True, False, 0, 1, 2, "auto"])
def test_verbose_takes_what_keras_takes(verbose):
    assert input_checks.check_verbose(verbose) is None
