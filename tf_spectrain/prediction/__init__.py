"""Weight prediction for pipeline stages: `SpecTrain(optimizer)` and `SpecTrainSGD`.

- `directions`: each optimizer's next-update estimate `d` (momentum, Adam, last update).
- `formula`: the predicted weights `W + s * d` (and the check of the version gap `s`).
- `wrapper`: `SpecTrain`, any Keras optimizer that also answers `W + s * d`, and `unwrapped`.
- `cloning`: `clone_optimizer`, a fresh optimizer per stage; `slots`: slots beside weights.
- `sgd`: `SpecTrainSGD`, the wrapper around momentum SGD (the paper's optimizer).
- `nesterov`: mode "nesterov" (SPECTRAIN.md 6e): `nesterov_form`, a stage's Nesterov SGD or
  `Nadam` (Keras' Nadam with PyTorch's `momentum_decay`), and `check_nesterov_optimizer`.
"""

from tf_spectrain.prediction.cloning import clone_optimizer
from tf_spectrain.prediction.nesterov import Nadam, check_nesterov_optimizer, nesterov_form
from tf_spectrain.prediction.sgd import SpecTrainSGD
from tf_spectrain.prediction.wrapper import SpecTrain, unwrapped

__all__ = [
    "Nadam", "SpecTrain", "SpecTrainSGD", "check_nesterov_optimizer", "clone_optimizer",
    "nesterov_form", "unwrapped",
]
