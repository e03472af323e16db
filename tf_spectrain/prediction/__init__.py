"""Weight prediction for pipeline stages: `SpecTrain(optimizer)` and `SpecTrainSGD`.

- `directions`: each optimizer's next-update estimate `d` (momentum, Adam, last update).
- `wrapper`: `SpecTrain`, any Keras optimizer that also answers `W + s * d`, and
  `clone_optimizer`, `unwrapped`.
- `sgd`: `SpecTrainSGD`, the wrapper around momentum SGD (the paper's optimizer).
"""

from tf_spectrain.prediction.sgd import SpecTrainSGD
from tf_spectrain.prediction.wrapper import SpecTrain, clone_optimizer, unwrapped

__all__ = ["SpecTrain", "SpecTrainSGD", "clone_optimizer", "unwrapped"]
