"""Two stacked bidirectional LSTMs on IMDB-shaped reviews, after keras-io's example.

Follows https://keras.io/examples/nlp/bidirectional_lstm_imdb/
(examples/nlp/bidirectional_lstm_imdb.py in keras-team/keras-io): a functional model on
variable-length integer sequences (`Input(shape=(None,))`), an embedding and two
`Bidirectional(LSTM(64))` layers, trained with `validation_data`.

Changed from the example: random token ids of IMDB's shapes (vocabulary 20,000, 200
tokens, zero-padded on the left by `pad_sequences`) instead of the download; 320
training and 64 validation reviews instead of 25,000 each. One change to the model: the
`Embedding` has `mask_zero=True`, so that the padding is masked and a Keras mask runs
through the LSTMs (the example pads with zeros but feeds the zeros to the LSTMs); this
adds no weights. Widths (128, 64), the 2 epochs and the Keras calls are the example's.
"""

import keras
import numpy as np
from keras import layers

max_features = 20000
maxlen = 200

inputs = keras.Input(shape=(None,), dtype="int32")
x = layers.Embedding(max_features, 128, mask_zero=True)(inputs)
x = layers.Bidirectional(layers.LSTM(64, return_sequences=True))(x)
x = layers.Bidirectional(layers.LSTM(64))(x)
outputs = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs, outputs)
# tf_spectrain: the one line goes here
model.summary()

# Stand-ins for keras.datasets.imdb: reviews of 10 to 400 word ids (1 .. max_features-1).
rng = np.random.default_rng(20200503)


def random_reviews(count):
    """Lists of word ids of random lengths, as `imdb.load_data` returns them."""
    return [rng.integers(1, max_features, size=rng.integers(10, 400)) for _ in range(count)]


x_train, y_train = random_reviews(320), rng.integers(0, 2, size=(320,))
x_val, y_val = random_reviews(64), rng.integers(0, 2, size=(64,))
print(len(x_train), "training sequences,", len(x_val), "validation sequences")
x_train = keras.utils.pad_sequences(x_train, maxlen=maxlen)
x_val = keras.utils.pad_sequences(x_val, maxlen=maxlen)

model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=32, epochs=2, validation_data=(x_val, y_val))
