"""The SpecTrain optimizers, where earlier versions defined them (`tf_spectrain.prediction`).

`from tf_spectrain.optimizer import SpecTrainSGD` keeps working; new code imports
`tf_spectrain.SpecTrain` / `tf_spectrain.SpecTrainSGD`.
"""

from tf_spectrain.prediction import SpecTrain, SpecTrainSGD

__all__ = ["SpecTrain", "SpecTrainSGD"]
