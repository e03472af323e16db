"""The import paths of the checkpoint code before `tf_spectrain.checkpoint` keep working.

`tf_spectrain.checkpoint_store` and `tf_spectrain.callbacks.checkpoint` re-export the
package's names (the README imports `latest_checkpoint` from the first);
`checkpoint_store.check_writable_dir(path, what)` wraps `tf_spectrain.checks`.
"""

import importlib
import os
import tempfile

import pytest

import tf_spectrain
from tf_spectrain import checkpoint, checkpoint_store

OLD_NAMES = {
    "tf_spectrain.checkpoint_store": [
        "ARRAYS_FILE",
        "FORMAT_VERSION",
        "METADATA_FILE",
        "TMP_PREFIX",
        "CheckpointError",
        "check_compatible",
        "compare_metadata",
        "latest_checkpoint",
        "list_checkpoints",
        "load_checkpoint",
        "save_checkpoint",
    ],
    "tf_spectrain.callbacks.checkpoint": [
        "COMPARED",
        "CheckpointWriteError",
        "PipelineCheckpoint",
        "describe_run",
        "restore_checkpoint",
        "save",
    ],
    "tf_spectrain.callbacks": ["CheckpointWriteError", "PipelineCheckpoint", "restore_checkpoint"],
}


@pytest.mark.parametrize("module", sorted(OLD_NAMES))
def test_old_paths_name_the_package_objects(module):
    old = importlib.import_module(module)
    for name in OLD_NAMES[module]:
        assert getattr(old, name) is getattr(checkpoint, name), f"{module}.{name}"


def test_the_readme_import_and_the_package_attribute():
    from tf_spectrain.checkpoint_store import CheckpointError, latest_checkpoint

    assert latest_checkpoint is checkpoint.latest_checkpoint
    assert issubclass(CheckpointError, ValueError)
    assert tf_spectrain.checkpoint_store.FORMAT_VERSION == 1
    from tf_spectrain.checkpoint_store import check_writable_dir

    assert callable(check_writable_dir)


# --- checkpoint_store.check_writable_dir (cli.py and telemetry.py call it) ---


def test_check_writable_dir_creates_nested_directories(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    checkpoint_store.check_writable_dir(str(target), "directory")  # `what` has no default now
    assert target.is_dir()
    assert os.listdir(target) == []  # the probe file is gone


@pytest.mark.parametrize(
    "relative, fragment",
    [("a_file", "is an existing file"), ("a_file/sub", "Not a directory")],
)
def test_check_writable_dir_refuses_a_file_in_the_way(tmp_path, relative, fragment):
    (tmp_path / "a_file").write_text("x")
    target = str(tmp_path / relative)
    with pytest.raises(ValueError) as error:
        checkpoint_store.check_writable_dir(target, what="--checkpoint-dir")
    message = str(error.value)
    # A flag's value is shown as typed (tf_spectrain.checks), no longer as a repr.
    assert "--checkpoint-dir" in message and f"--checkpoint-dir {target}" in message
    assert fragment in message


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can write anywhere")
def test_check_writable_dir_refuses_a_read_only_directory(tmp_path):
    target = tmp_path / "read_only"
    target.mkdir()
    target.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="Permission denied") as error:
            checkpoint_store.check_writable_dir(str(target), what="checkpoint_dir")
        assert "`checkpoint_dir`" in str(error.value)
    finally:
        target.chmod(0o700)


def test_check_writable_dir_reports_a_failed_probe_write(tmp_path, monkeypatch):
    # The read-only test above is skipped as root; this one forces the same OS error.
    def refuse(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(ValueError) as error:
        checkpoint_store.check_writable_dir(tmp_path, what="--checkpoint-dir")
    message = str(error.value)
    assert f"Received: --checkpoint-dir {tmp_path}" in message  # was --checkpoint-dir='...'
    assert "writing a file there failed: Permission denied" in message
