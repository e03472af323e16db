"""Tests of `tf_spectrain.checks`, table by table: the values each check accepts (and what
it returns), a wrong type raising `TypeError` and a value out of range `ValueError`, and
the full message, for an argument name and for a `--flag`."""

import ast
import os
import pathlib

import numpy as np
import pytest

from tf_spectrain import checks

# --- is_int, is_number, show, received ---------------------------------------------------


@pytest.mark.parametrize(
    "value, integer, number",
    [
        (3, True, True),
        (-2, True, True),
        (np.int64(3), True, True),
        (np.uint8(3), True, True),
        (2.0, False, True),
        (np.float32(0.5), False, True),
        (float("nan"), False, True),
        (float("inf"), False, True),
        (True, False, False),
        (np.bool_(False), False, False),
        ("3", False, False),
        (None, False, False),
        (1j, False, False),
    ],
)
def test_is_int_and_is_number(value, integer, number):
    assert checks.is_int(value) is integer
    assert checks.is_number(value) is number


def test_show_shortens_long_values():
    assert checks.show("abc") == "'abc'"
    long = checks.show(list(range(100)))
    assert len(long) == 120 and long.endswith("...") and long.startswith("[0, 1, 2")


@pytest.mark.parametrize(
    "name, value, text",
    [
        ("batch_size", 0, "Received: batch_size=0"),
        ("mode", "spectrum", "Received: mode='spectrum'"),
        ("cuts", None, "Received: cuts=None"),
        ("--gpus", 0, "Received: --gpus 0"),
        ("--lr", 0.5, "Received: --lr 0.5"),
        ("--mode", "spectrum", "Received: --mode spectrum"),
        ("--logdir", "", "Received: --logdir ''"),  # an invisible value is quoted
        ("--logdir", " runs", "Received: --logdir ' runs'"),
    ],
)
def test_received_for_arguments_and_flags(name, value, text):
    assert checks.received(name, value) == text


# --- check_int ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, kwargs, expected",
    [
        (3, {}, 3),
        (-7, {}, -7),
        (np.int64(4), dict(minimum=1), 4),
        (1, dict(minimum=1, maximum=1), 1),
        (0, dict(minimum=0, maximum=5), 0),
        (5, dict(minimum=0, maximum=5), 5),
        ("auto", dict(minimum=1, allow=("auto",)), "auto"),
        (None, dict(minimum=1, none_ok=True), None),
    ],
)
def test_check_int_accepts(value, kwargs, expected):
    got = checks.check_int("n", value, **kwargs)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "name, value, kwargs, error, message",
    [
        ("batch_size", 0, dict(minimum=1), ValueError,
         "`batch_size` must be an integer >= 1. Received: batch_size=0"),
        ("k", 9, dict(maximum=3), ValueError, "`k` must be an integer <= 3. Received: k=9"),
        ("k", -1, dict(minimum=0, maximum=3), ValueError,
         "`k` must be an integer in [0, 3]. Received: k=-1"),
        ("seed", 2.0, {}, TypeError, "`seed` must be an integer. Received: seed=2.0 of type float"),
        ("epochs", True, dict(minimum=1), TypeError,
         "`epochs` must be an integer >= 1. Received: epochs=True of type bool"),
        ("limit", "10", dict(minimum=1, none_ok=True), TypeError,
         "`limit` must be an integer >= 1 or None. Received: limit='10' of type str"),
        # With `allow`, a string is of a valid type: one not allowed is out of range.
        ("workers", "many", dict(minimum=0, allow=("auto",)), ValueError,
         "`workers` must be an integer >= 0 or 'auto'. Received: workers='many'"),
        ("num_stages", 0, dict(minimum=1, meaning="the number of stages"), ValueError,
         "`num_stages` must be an integer >= 1 (the number of stages). Received: num_stages=0"),
        ("limit", None, dict(minimum=1), TypeError,
         "`limit` must be an integer >= 1. Received: limit=None of type NoneType"),
        ("--gpus", 0, dict(minimum=1, maximum=64), ValueError,
         "--gpus must be an integer in [1, 64]. Received: --gpus 0"),
        ("--epochs", 2.5, dict(minimum=1), TypeError,
         "--epochs must be an integer >= 1. Received: --epochs 2.5 of type float"),
        ("--seed", "x", dict(minimum=0), TypeError,
         "--seed must be an integer >= 0. Received: --seed x of type str"),
    ],
)
def test_check_int_rejects(name, value, kwargs, error, message):
    with pytest.raises(error) as raised:
        checks.check_int(name, value, **kwargs)
    assert type(raised.value) is error and str(raised.value) == message


# --- check_number ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, kwargs, expected",
    [
        (0.5, {}, 0.5),
        (3, {}, 3.0),
        (np.float32(0.25), dict(minimum=0), 0.25),
        (0, dict(minimum=0), 0.0),
        (0.999, dict(minimum=0, maximum=1), 0.999),
        (1e-9, dict(minimum=0, strict=True), 1e-9),
        (float("inf"), dict(minimum=0, allow_inf=True), float("inf")),
        (10**400, dict(allow_inf=True), float("inf")),  # beyond any float: infinite
    ],
)
def test_check_number_accepts(value, kwargs, expected):
    got = checks.check_number("x", value, **kwargs)
    assert got == expected and type(got) is float


@pytest.mark.parametrize(
    "name, value, kwargs, error, message",
    [
        ("lr", 0, dict(minimum=0, strict=True), ValueError,
         "`lr` must be a finite number > 0. Received: lr=0"),
        ("lr", -0.1, dict(minimum=0), ValueError,
         "`lr` must be a finite number >= 0. Received: lr=-0.1"),
        ("momentum", 1.0, dict(minimum=0, maximum=1), ValueError,
         "`momentum` must be a finite number >= 0 and < 1. Received: momentum=1.0"),
        ("lr", float("nan"), {}, ValueError, "`lr` must be a finite number. Received: lr=nan"),
        ("lr", float("inf"), dict(minimum=0), ValueError,
         "`lr` must be a finite number >= 0. Received: lr=inf"),
        ("bandwidth", float("nan"), dict(allow_inf=True), ValueError,
         "`bandwidth` must be a number. Received: bandwidth=nan"),
        ("bandwidth", -float("inf"), dict(minimum=0, allow_inf=True), ValueError,
         "`bandwidth` must be a number >= 0. Received: bandwidth=-inf"),
        ("latency", 1e-7, dict(minimum=1e-6, meaning="seconds"), ValueError,
         "`latency` must be a finite number >= 1e-06 (seconds). Received: latency=1e-07"),
        ("lr", 10**400, {}, ValueError, "`lr` must be a finite number. Received: lr=1000"),
        ("lr", "0.1", {}, TypeError,
         "`lr` must be a finite number. Received: lr='0.1' of type str"),
        ("lr", True, dict(minimum=0), TypeError,
         "`lr` must be a finite number >= 0. Received: lr=True of type bool"),
        ("lr", None, {}, TypeError, "`lr` must be a finite number. Received: lr=None of type "
                                    "NoneType"),
        ("--lr", 0.0, dict(minimum=0, strict=True), ValueError,
         "--lr must be a finite number > 0. Received: --lr 0.0"),
        ("--momentum", 1.5, dict(minimum=0, maximum=1), ValueError,
         "--momentum must be a finite number >= 0 and < 1. Received: --momentum 1.5"),
    ],
)
def test_check_number_rejects(name, value, kwargs, error, message):
    with pytest.raises(error) as raised:
        checks.check_number(name, value, **kwargs)
    assert type(raised.value) is error and str(raised.value).startswith(message)


# --- check_bool -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, none_ok, expected",
    [(True, False, True), (False, False, False), (np.bool_(True), False, True),
     (None, True, None), (False, True, False)],
)
def test_check_bool_accepts(value, none_ok, expected):
    got = checks.check_bool("flag", value, none_ok=none_ok)
    assert got is expected


@pytest.mark.parametrize(
    "name, value, none_ok, message",
    [
        ("download", 1, False,
         "`download` must be True or False. Received: download=1 of type int"),
        ("download", None, False,
         "`download` must be True or False. Received: download=None of type NoneType"),
        ("training", "yes", True,
         "`training` must be True, False or None. Received: training='yes' of type str"),
        ("--resume", "no", False,
         "--resume must be True or False. Received: --resume no of type str"),
    ],
)
def test_check_bool_rejects_with_a_type_error(name, value, none_ok, message):
    with pytest.raises(TypeError) as raised:
        checks.check_bool(name, value, none_ok=none_ok)
    assert str(raised.value) == message


# --- check_one_of ---------------------------------------------------------------------------

MODES = ["spectrain", "stash", "vanilla", "sync"]


@pytest.mark.parametrize("value", MODES)
def test_check_one_of_accepts(value):
    assert checks.check_one_of("mode", value, MODES) is value
    assert checks.check_one_of("mode", value, tuple(MODES)) is value  # any iterable


@pytest.mark.parametrize(
    "name, value, kwargs, message",
    [
        ("mode", "spectrian", {}, "`mode` must be one of ['spectrain', 'stash', 'vanilla', "
                                  "'sync']. Received: mode='spectrian'; did you mean 'spectrain'?"),
        ("mode", "gpipe", {}, "`mode` must be one of ['spectrain', 'stash', 'vanilla', 'sync']. "
                              "Received: mode='gpipe'"),
        ("mode", "STASH", dict(ignore_case=True), "Received: mode='STASH'; did you mean 'stash'?"),
        ("mode", None, {}, "Received: mode=None"),
        ("mode", 3, {}, "Received: mode=3"),
        ("mode", ["stash"], {}, "Received: mode=['stash']"),  # unhashable: not a choice
        ("mode", np.array(["stash", "sync"]), {}, "Received: mode=array("),  # ambiguous ==
        ("--mode", "spectrian", {}, "--mode must be one of ['spectrain', 'stash', 'vanilla', "
                                    "'sync']. Received: --mode spectrian; did you mean "
                                    "'spectrain'?"),
    ],
)
def test_check_one_of_rejects_with_a_value_error(name, value, kwargs, message):
    with pytest.raises(ValueError) as raised:
        checks.check_one_of(name, value, MODES, **kwargs)
    assert message in str(raised.value)
    assert str(raised.value).startswith("--mode must be one of" if name == "--mode" else
                                        "`mode` must be one of ['spectrain', ")


# --- check_instance, check_path ---------------------------------------------------------------


def test_check_instance():
    assert checks.check_instance("cuts", ["a"], (list, tuple)) == ["a"]
    with pytest.raises(TypeError) as raised:
        checks.check_instance("cuts", "a", (list, tuple), hint=" of layer names")
    assert str(raised.value) == (
        "`cuts` must be a list or tuple of layer names. Received: cuts='a' of type str"
    )
    with pytest.raises(TypeError, match=r"^--model must be a str\. Received: --model 3 of type"):
        checks.check_instance("--model", 3, str)


@pytest.mark.parametrize(
    "value, expected",
    [("runs/a", "runs/a"), (pathlib.Path("runs") / "a", os.path.join("runs", "a")), (" x", " x")],
)
def test_check_path_accepts(value, expected):
    assert checks.check_path("logdir", value) == expected


@pytest.mark.parametrize(
    "name, value, error, message",
    [
        ("logdir", 3, TypeError,
         "`logdir` must be a path (str or os.PathLike). Received: logdir=3 of type int"),
        ("logdir", b"runs", TypeError, "Received: logdir=b'runs' of type bytes"),
        ("logdir", None, TypeError, "Received: logdir=None of type NoneType"),
        ("logdir", "", ValueError, "`logdir` must be a non-empty path. Received: logdir=''"),
        ("logdir", "  ", ValueError, "`logdir` must be a non-empty path. Received: logdir='  '"),
        ("--logdir", "", ValueError, "--logdir must be a non-empty path. Received: --logdir ''"),
    ],
)
def test_check_path_rejects(name, value, error, message):
    with pytest.raises(error) as raised:
        checks.check_path(name, value)
    assert type(raised.value) is error and message in str(raised.value)


# --- check_writable_dir, os_reason ---------------------------------------------------------


def test_check_writable_dir_creates_the_directory_and_leaves_nothing(tmp_path):
    target = tmp_path / "a" / "b"
    assert checks.check_writable_dir("logdir", target) == str(target)
    assert target.is_dir() and os.listdir(target) == []
    assert checks.check_writable_dir("--logdir", str(target)) == str(target)  # exists: fine


@pytest.mark.parametrize("name, label", [("logdir", "`logdir`"), ("--logdir", "--logdir")])
def test_check_writable_dir_refuses_a_file_and_an_uncreatable_dir(tmp_path, name, label):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    shown = f"{name} {blocker}" if name.startswith("--") else f"{name}={str(blocker)!r}"
    with pytest.raises(ValueError) as raised:
        checks.check_writable_dir(name, blocker)
    assert str(raised.value).startswith(
        f"{label} must be a directory, but it is an existing file. Received: {shown}. "
    )
    with pytest.raises(ValueError) as raised:
        checks.check_writable_dir(name, blocker / "sub")
    assert str(raised.value).startswith(f"{label} must be a directory that can be created.")
    assert "creating it failed: " in str(raised.value)
    with pytest.raises(TypeError, match="must be a path"):
        checks.check_writable_dir(name, 3)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can write anywhere")
def test_check_writable_dir_refuses_a_read_only_dir(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="must be a directory where files can be written"):
            checks.check_writable_dir("logdir", tmp_path)
    finally:
        tmp_path.chmod(0o700)


def test_os_reason():
    assert checks.os_reason(PermissionError(13, "Permission denied")) == "Permission denied"
    assert checks.os_reason(OSError("disk on fire")) == "disk on fire"


# --- purity -----------------------------------------------------------------------------------


def test_checks_is_pure_python():
    tree = ast.parse(pathlib.Path(checks.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= {"math", "numbers", "os", "tempfile", "tf_spectrain.messages"}, imported


# --- the shapes the CLI and the API rely on (valid=, allow=, meaning=) -----------------


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
def test_messages_of_the_cli_and_api_shapes(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)


def test_accepted_values_come_back_converted_to_python_types():
    assert checks.check_int("n", np.int64(3), 1) == 3 and type(checks.check_int("n", 3)) is int
    assert checks.check_int("log_every", "auto", 1, allow=("auto",)) == "auto"
    assert checks.check_number("lr", 1, 0, strict=True) == 1.0
    assert checks.check_bool("flag", np.bool_(True)) is True
