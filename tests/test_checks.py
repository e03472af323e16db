"""tf_spectrain.checks: one rule (TypeError: wrong type, ValueError: out of range), one shape."""

import numpy as np
import pytest

from tf_spectrain import checks


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: checks.check_int("epochs", 0, 1), ValueError,
         "`epochs` must be an integer >= 1. Received: epochs=0"),
        (lambda: checks.check_int("epochs", "3", 1), TypeError,
         "`epochs` must be an integer >= 1. Received: epochs='3' of type str"),
        (lambda: checks.check_int("epochs", True, 1), TypeError, "epochs=True of type bool"),
        (lambda: checks.check_int("--gpus", 0, 1), ValueError,
         "--gpus must be an integer >= 1. Received: --gpus 0"),
        (lambda: checks.check_int("--gpus", 65, maximum=64, valid="at most 64",
                                  meaning="one device per stage"), ValueError,
         "--gpus must be at most 64 (one device per stage). Received: --gpus 65"),
        # With `allow`, strings are of a valid type: any other string is out of range.
        (lambda: checks.check_int("log_every", "often", 1, allow=("auto",)), ValueError,
         "`log_every` must be an integer >= 1 or 'auto'. Received: log_every='often'"),
        (lambda: checks.check_int("log_every", 1.5, 1, allow=("auto",)), TypeError,
         "log_every=1.5 of type float"),
        (lambda: checks.check_number("--momentum", 1.0, 0, 1, valid="in [0, 1)",
                                     meaning="0 <= momentum < 1"), ValueError,
         "--momentum must be in [0, 1) (0 <= momentum < 1). Received: --momentum 1.0"),
        (lambda: checks.check_number("--lr", float("nan"), 0, strict=True), ValueError,
         "--lr must be a finite number > 0. Received: --lr nan"),
        (lambda: checks.check_path("--logdir", "", valid="a path"), ValueError,
         "--logdir must be a path. Received: --logdir ''"),
        (lambda: checks.check_path("logdir", 3), TypeError, "`logdir` must be a path"),
    ],
)
def test_messages(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)


def test_accepted_values_come_back_converted():
    assert checks.check_int("n", np.int64(3), 1) == 3 and type(checks.check_int("n", 3)) is int
    assert checks.check_int("log_every", "auto", 1, allow=("auto",)) == "auto"
    assert checks.check_number("lr", 1, 0, strict=True) == 1.0
    assert checks.check_bool("flag", np.bool_(True)) is True
