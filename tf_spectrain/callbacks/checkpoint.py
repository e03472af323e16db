"""The old import path of the checkpoint callback and of save / restore, kept working.

The code lives in the `tf_spectrain.checkpoint` package now (`callback`, `state`).
"""

from tf_spectrain.checkpoint.callback import CheckpointWriteError, PipelineCheckpoint
from tf_spectrain.checkpoint.state import COMPARED, describe_run, restore_checkpoint, save

__all__ = [
    "COMPARED",
    "CheckpointWriteError",
    "PipelineCheckpoint",
    "describe_run",
    "restore_checkpoint",
    "save",
]
