"""A Transformer block as a Keras layer for text classification, after keras-io's example.

Follows https://keras.io/examples/nlp/text_classification_with_transformer/
(examples/nlp/text_classification_with_transformer.py in keras-team/keras-io): two custom
layers (`TokenAndPositionEmbedding`, `TransformerBlock`) whose `__init__` takes
positional arguments and which define no `get_config`, in a functional model trained
with `validation_data`.

Changed from the example: random token ids of IMDB's shapes (vocabulary 20,000, 200
tokens, left-padded with zeros as `pad_sequences` does) instead of the download; 640
training and 160 validation reviews instead of 25,000 each. The model (embedding 32, 2
heads, feed-forward 32), the 2 epochs and the Keras calls are the example's.
"""

import keras
import numpy as np
from keras import layers, ops


class TransformerBlock(layers.Layer):
    """Self-attention and a feed-forward net, each with dropout, a residual and a norm."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attended = self.dropout1(self.att(inputs, inputs))
        mid = self.layernorm1(inputs + attended)
        fed = self.dropout2(self.ffn(mid))
        return self.layernorm2(mid + fed)


class TokenAndPositionEmbedding(layers.Layer):
    """The sum of a token embedding and a learned embedding of each position."""

    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        length = ops.shape(x)[-1]
        positions = self.pos_emb(ops.arange(start=0, stop=length, step=1))
        return self.token_emb(x) + positions


vocab_size = 20000
maxlen = 200


def random_reviews(count, rng):
    """Token-id reviews of random lengths, cut or zero-padded on the left to `maxlen`."""
    reviews = [rng.integers(1, vocab_size, size=rng.integers(20, 400)) for _ in range(count)]
    return keras.utils.pad_sequences(reviews, maxlen=maxlen)


rng = np.random.default_rng(20200510)
x_train, y_train = random_reviews(640, rng), rng.integers(0, 2, size=(640,))
x_val, y_val = random_reviews(160, rng), rng.integers(0, 2, size=(160,))
print(len(x_train), "training sequences,", len(x_val), "validation sequences")

embed_dim = 32
num_heads = 2
ff_dim = 32

inputs = layers.Input(shape=(maxlen,))
x = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)(inputs)
x = TransformerBlock(embed_dim, num_heads, ff_dim)(x)
x = layers.GlobalAveragePooling1D()(x)
x = layers.Dropout(0.1)(x)
x = layers.Dense(20, activation="relu")(x)
x = layers.Dropout(0.1)(x)
outputs = layers.Dense(2, activation="softmax")(x)
model = keras.Model(inputs=inputs, outputs=outputs)
# tf_spectrain: the one line goes here

model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x_train, y_train, batch_size=32, epochs=2, validation_data=(x_val, y_val))
print("final training loss:", history.history["loss"][-1])
