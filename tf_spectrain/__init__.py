"""tf_spectrain: pipelined model parallelism with SpecTrain weight prediction for Keras.

Vocabulary used throughout the package (see SPECTRAIN.md):

- `k`: a stage index, `0..N-1`; stage 0 holds the input, stage N-1 the loss.
- `i`: a mini-batch index within an epoch, `0..T-1`.
- `s`: a version gap: how many optimizer updates ahead a weight prediction looks.

Call `tf_spectrain.setup_devices(n)` before any TensorFlow op, build a model with
`tf_spectrain.models.get_model(...)`, and train it with `tf_spectrain.PipelineModel`.
"""

from tf_spectrain import (
    callbacks,
    checkpoint,
    cluster,
    costmodel,
    data,
    models,
    partition,
    prediction,
    schedule,
)
from tf_spectrain._version import __version__
from tf_spectrain.cluster import connect_cluster
from tf_spectrain.devices import setup_devices
from tf_spectrain.pipeline_model import NonFiniteLossError, PipelineModel, PipelineStalledError
from tf_spectrain.prediction import SpecTrain, SpecTrainSGD

__all__ = [
    "NonFiniteLossError",
    "PipelineModel",
    "PipelineStalledError",
    "SpecTrain",
    "SpecTrainSGD",
    "callbacks",
    "checkpoint",
    "cluster",
    "connect_cluster",
    "costmodel",
    "data",
    "models",
    "partition",
    "prediction",
    "schedule",
    "setup_devices",
    "__version__",
]
