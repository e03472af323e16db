"""Two small layers the text models need and Keras does not have as layers.

`PaddingMask` turns token ids into an explicit boolean padding mask, which the text models
pass to the layers that need it (`mask=`, `value_mask=`) as an ordinary tensor: a tensor
crosses a pipeline cut, a Keras mask attached to a tensor does not. `PositionEmbedding`
adds a learned vector per position. Both are registered for Keras serialisation.
"""

import keras
from keras import layers, ops


@keras.saving.register_keras_serializable(package="tf_spectrain")
class PaddingMask(layers.Layer):
    """`tokens != padding_id`: True at real tokens, False at padding, shape `(batch, seq_len)`.

    Args:
        padding_id: the token id that marks padding (0 by default).
        **kwargs: standard layer arguments (`name`, ...).
    """

    def __init__(self, padding_id=0, **kwargs):
        super().__init__(**kwargs)
        self.padding_id = int(padding_id)

    def call(self, tokens):
        """The boolean mask of the non-padding tokens."""
        return ops.not_equal(tokens, self.padding_id)

    def compute_output_spec(self, tokens):
        """A boolean tensor of the tokens' shape."""
        return keras.KerasTensor(tokens.shape, dtype="bool")

    def get_config(self):
        """The layer's config, with `padding_id`."""
        return {**super().get_config(), "padding_id": self.padding_id}


@keras.saving.register_keras_serializable(package="tf_spectrain")
class PositionEmbedding(layers.Layer):
    """Adds a learned vector to each position of a `(batch, seq_len, width)` sequence.

    The vectors are initialised like `keras.layers.Embedding`'s (uniform in
    [-0.05, 0.05]), so they follow the global Keras seed.

    Args:
        sequence_length: the number of positions, an int >= 1 (the inputs' `seq_len`).
        **kwargs: standard layer arguments (`name`, ...).
    """

    def __init__(self, sequence_length, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = int(sequence_length)
        self.supports_masking = True  # adds the same vector whether a step is masked or not

    def build(self, input_shape):
        """Creates the `(sequence_length, width)` table of position vectors."""
        self.embeddings = self.add_weight(
            shape=(self.sequence_length, input_shape[-1]),
            initializer="uniform",
            name="embeddings",
        )

    def call(self, inputs):
        """`inputs` plus the vector of each position."""
        return inputs + ops.cast(self.embeddings, inputs.dtype)

    def get_config(self):
        """The layer's config, with `sequence_length`."""
        return {**super().get_config(), "sequence_length": self.sequence_length}
