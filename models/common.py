"""Pieces shared by the model builders."""

from keras import layers

# The moving statistics follow the batches with PyTorch's default rate (momentum 0.1 there,
# 0.9 in Keras' convention), as in the SpecTrain paper's PyTorch models. Keras' default,
# 0.99, lags so far behind in short runs (a few hundred steps) that inference-mode
# accuracy stays at chance while training accuracy is already high.
BN_MOMENTUM = 0.9


def batch_norm(name):
    """A BatchNormalization layer with the zoo's momentum."""
    return layers.BatchNormalization(momentum=BN_MOMENTUM, name=name)
