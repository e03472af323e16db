"""setup_devices: in this process (already split by conftest) and in fresh subprocesses."""

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from conftest import NUM_DEVICES
from data_reference import make_layout

import tf_spectrain
from tf_spectrain import devices


def run_python(code, **env):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_conftest_split_gives_four_logical_cpus():
    assert len(tf.config.list_logical_devices("CPU")) == NUM_DEVICES


@pytest.mark.parametrize("n", [1, 2, 4])
def test_after_init_returns_existing_devices(n):
    assert tf_spectrain.setup_devices(n) == [f"/CPU:{k}" for k in range(n)]


def test_after_init_too_many_devices_says_to_call_it_first():
    with pytest.raises(RuntimeError, match=r"setup_devices\(5\).*after TensorFlow had initialised"):
        tf_spectrain.setup_devices(NUM_DEVICES + 1)


@pytest.mark.parametrize(
    "bad, error",
    [(0, ValueError), (-1, ValueError), (2.5, TypeError), ("4", TypeError), (None, TypeError),
     (True, TypeError)],
)
def test_bad_count(bad, error):
    with pytest.raises(error, match=r"`n` must be an integer >= 1.*Received: n="):
        tf_spectrain.setup_devices(bad)


@pytest.mark.parametrize(
    "physical, n, expected",
    [(1, 4, [4]), (2, 4, [2, 2]), (3, 8, [3, 3, 2]), (4, 5, [2, 1, 1, 1]), (2, 3, [2, 1])],
)
def test_split_counts(physical, n, expected):
    counts = devices.split_counts(physical, n)
    assert counts == expected
    assert sum(counts) == n


def test_fresh_process_splits_cpu_warns_and_sets_inter_op_threads(tmp_path):
    # First the data catalog's metadata calls (test_catalog.py): they must run no
    # TensorFlow op, or the split after them would fail. (One fresh process for both: each
    # costs seconds of imports.)
    make_layout(tmp_path, ["mnist/3.0.1/dataset_info.json"])
    out = run_python(
        f"""
        import warnings
        import tensorflow as tf
        import tf_spectrain
        from tf_spectrain import data
        names = data.dataset_names()
        infos = [data.get_info(name) for name in names]
        data.check_available("digits")
        data.check_available("mnist", data_dir={str(tmp_path)!r})
        try:
            data.check_available("cifar10", data_dir={str(tmp_path)!r})
        except data.DatasetNotFoundError:
            pass
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            names = tf_spectrain.setup_devices(3)
        print(names)
        print(len(tf.config.list_logical_devices("CPU")))
        print(tf.config.threading.get_inter_op_parallelism_threads())
        print(any("logical devices" in str(x.message) for x in w))
        with tf.device(names[2]):
            t = tf.constant(1.0) + 1.0
        print(t.device)
        """,
        TFDS_DATA_DIR=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "['/CPU:0', '/CPU:1', '/CPU:2']"
    assert lines[1] == "3"
    assert int(lines[2]) >= 3
    assert lines[3] == "True"
    assert lines[4].endswith("CPU:2")


def test_fresh_process_one_device_keeps_tensorflows_thread_choice_and_too_late_raises():
    # One fresh process: setup_devices(1) changes nothing; then, once an op has run, more
    # devices cannot be had, and the error says to call setup_devices first.
    out = run_python(
        """
        import warnings
        import tensorflow as tf
        import tf_spectrain
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            print(tf_spectrain.setup_devices(1))
        print(tf.config.threading.get_inter_op_parallelism_threads())
        print(any("logical devices" in str(x.message) for x in w))
        tf.constant(1.0)
        try:
            tf_spectrain.setup_devices(2)
        except RuntimeError as e:
            print("ERROR", e)
        """
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() + lines[1:3] == ["['/CPU:0']", "0", "False"]
    assert lines[3].startswith("ERROR")
    assert "Call `tf_spectrain.setup_devices(n)` at the start" in lines[3]


@pytest.mark.parametrize(
    "text, visible, num_gpus, expected",
    [
        ("16160\n16160\n", None, 2, [16160, 16160]),
        ("8000\n16000\n24000\n", "2,0", 2, [24000, 8000]),
        ("8000\n", None, 2, [8000, None]),
        ("[N/A]\n40000\n", "", 2, [None, 40000]),
        ("8000\n16000\n", "GPU-1234-uuid", 1, [8000]),
    ],
)
def test_parse_gpu_memory(text, visible, num_gpus, expected):
    assert devices.parse_gpu_memory(text, visible, num_gpus) == expected


def test_gpu_memory_without_nvidia_smi_is_unknown(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert devices.gpu_memory_mb(2) == [None, None]
