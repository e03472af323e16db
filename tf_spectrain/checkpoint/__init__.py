"""Checkpoints that resume training exactly: files on disk, compatibility, state, callback.

- `format`: one checkpoint's name and files (`arrays.npz`, `metadata.json`), verified reads;
- `store`: checkpoint directories: atomic saves, retention, listing, loading;
- `compat`: what differs between a checkpoint and a run (`compare_metadata`);
- `state`: what a pipeline's (or keras.Model's) state is: `save`, `restore_checkpoint`;
- `layout`, `pipeline_layout`: a pipeline's state keyed by the model's variables, not by
  stage, so that it restores into any cuts (and older checkpoints by stage, converted);
- `resume`: what train.py does with a checkpoint directory (`--resume`, refusals);
- `callback`: the `PipelineCheckpoint` Keras callback.

`format`, `store`, `compat` and `layout` import neither TensorFlow nor Keras.
"""

from tf_spectrain.checkpoint.callback import CheckpointWriteError, PipelineCheckpoint
from tf_spectrain.checkpoint.compat import (
    IncompatibleCheckpoint,
    check_compatible,
    compare_metadata,
)
from tf_spectrain.checkpoint.format import (
    ARRAYS_FILE,
    FORMAT_VERSION,
    METADATA_FILE,
    TMP_PREFIX,
    CheckpointError,
)
from tf_spectrain.checkpoint.resume import (
    apply_learning_rate,
    refuse_existing,
    refuse_other_settings,
    restore_latest,
    saved_cuts,
)
from tf_spectrain.checkpoint.state import (
    COMPARED,
    describe_run,
    restore_checkpoint,
    save,
    trainer_model,
    trainer_optimizers,
)
from tf_spectrain.checkpoint.store import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [
    "ARRAYS_FILE",
    "COMPARED",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "TMP_PREFIX",
    "CheckpointError",
    "CheckpointWriteError",
    "IncompatibleCheckpoint",
    "PipelineCheckpoint",
    "apply_learning_rate",
    "check_compatible",
    "compare_metadata",
    "describe_run",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "refuse_existing",
    "refuse_other_settings",
    "restore_checkpoint",
    "restore_latest",
    "saved_cuts",
    "save",
    "save_checkpoint",
    "trainer_model",
    "trainer_optimizers",
]
