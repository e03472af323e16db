"""The old import path of the checkpoint files' code, kept so that existing imports work.

The code lives in the `tf_spectrain.checkpoint` package now (`format`, `store`, `compat`);
this module re-exports its public names, plus `check_writable_dir(path, what)`.
"""

from tf_spectrain import checks
from tf_spectrain.checkpoint.compat import check_compatible, compare_metadata
from tf_spectrain.checkpoint.format import (
    ARRAYS_FILE,
    FORMAT_VERSION,
    METADATA_FILE,
    TMP_PREFIX,
    CheckpointError,
)
from tf_spectrain.checkpoint.store import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [
    "ARRAYS_FILE",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "TMP_PREFIX",
    "CheckpointError",
    "check_compatible",
    "check_writable_dir",
    "compare_metadata",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]


def check_writable_dir(path, what):
    """Creates `path` if missing and checks that a file can be written there.

    The old signature of `tf_spectrain.checks.check_writable_dir(what, path)`.

    Args:
        path: the directory (str or `os.PathLike`).
        what: how the user named it, for messages (a `--flag` or an argument name).

    Raises:
        TypeError: `path` is not a path.
        ValueError: `path` is a file, cannot be created, or is not writable; the message
            names `what`, `path` and the reason the system gave.
    """
    checks.check_instance("what", what, str)
    checks.check_writable_dir(what, path, probe_prefix=TMP_PREFIX + "probe-")
