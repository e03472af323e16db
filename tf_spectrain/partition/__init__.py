"""Cut a Keras functional model into pipeline stages and place them on devices.

Nested functional models (a `keras.applications` backbone under a new head) are read as
their layers (`graph.read_graph`), so cuts may name layers inside them.

- `split_model(model, cuts)`: stage sub-models that share the model's layers.
- `describe_stages(model, cuts)`: a `StageSpec` per stage (layers, crossing shapes).
- `default_cuts(model, num_stages, by="params")`: static balanced cut layers (parameters,
  or with `by="macs"` compute, see `layer_costs`, or `by="layers"` layer counts);
  `plan_cuts` is the pure planner. `PipelineModel(cuts="auto")` plans from measured time
  (`tf_spectrain.costmodel.auto_partition`).
- `cuts_keeping_masks(model)`: the layers a cut may follow without losing a Keras mask
  (`split_model` refuses the others).
- `place_stages(stages, devices)`: a copy of each stage on its device (layers that cannot
  be rebuilt from their config are copied as objects, `layer_copy`);
  `copy_weights(src_models, dst_models)` copies weights back; `check_stage_devices`
  checks a list of stage devices before placing.
"""

from tf_spectrain.partition.costs import COSTS, layer_costs
from tf_spectrain.partition.cuts import default_cuts
from tf_spectrain.partition.masks import cuts_keeping_masks
from tf_spectrain.partition.placement import (
    check_devices,
    check_stage_devices,
    copy_trainable,
    copy_weights,
    place_stages,
)
from tf_spectrain.partition.planner import plan_cuts
from tf_spectrain.partition.stages import StageSpec, describe_stages, split_model

__all__ = [
    "COSTS",
    "StageSpec",
    "check_devices",
    "check_stage_devices",
    "copy_trainable",
    "copy_weights",
    "cuts_keeping_masks",
    "default_cuts",
    "describe_stages",
    "layer_costs",
    "place_stages",
    "plan_cuts",
    "split_model",
]
