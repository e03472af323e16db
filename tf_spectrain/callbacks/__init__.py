"""Keras callbacks for pipelines (and plain Keras models): telemetry, traces, checkpoints.

Callbacks that define `set_pipeline(pipeline)` are handed the `PipelineModel` by its `fit`;
with a plain `keras.Model` they work on the model alone.
"""

from tf_spectrain.callbacks.telemetry import Telemetry
from tf_spectrain.callbacks.trace import PipelineTrace
from tf_spectrain.checkpoint import (
    CheckpointWriteError,
    PipelineCheckpoint,
    restore_checkpoint,
)

__all__ = [
    "CheckpointWriteError",
    "PipelineCheckpoint",
    "PipelineTrace",
    "Telemetry",
    "restore_checkpoint",
]
