"""The model zoo: Keras functional models with readable layer names for pipeline cuts.

    from tf_spectrain import models

    models.model_names()   # ['mlp', 'resnet20', ..., 'transformer_lm', 'vgg16']
    model = models.get_model("vgg16", input_shape=(32, 32, 3), num_classes=10)
    model = models.get_model("residual_lstm", (128,), 2, vocab_size=10000)
    models.model_input_kind("residual_lstm")   # 'tokens' ('image' for vgg16)

Every model outputs logits (no softmax) and is named after its registry name. The image
models take `(height, width, channels)` floats; the text models (`transformer_lm`,
`transformer_classifier`, `residual_lstm`, see `text.py`) int token ids `(seq_len,)`.
`vgg16_narrow(input_shape, num_classes, divisor=8)`, VGG16 with every width divided, is
a builder outside the registry (and the command line's `--model` list).

Inside this folder imports are relative: it is installed as `tf_spectrain.models`.
"""

from .registry import get_model, model_input_kind, model_names
from .vgg import vgg16_narrow

__all__ = ["get_model", "model_input_kind", "model_names", "vgg16_narrow"]
