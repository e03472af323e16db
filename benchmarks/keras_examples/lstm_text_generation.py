"""Character-level text generation with an LSTM, after the Keras example.

Follows https://keras.io/examples/generative/lstm_character_level_text_generation/
(examples/generative/lstm_character_level_text_generation.py in keras-team/keras-io) in
the form of its original, examples/lstm_text_generation.py in keras-team/keras
(https://github.com/keras-team/keras/blob/2.3.1/examples/lstm_text_generation.py): a
`Sequential` model built with `model.add(LSTM(128, input_shape=(maxlen, len(chars))))`,
no `Input`, and a softmax over the characters, trained with RMSprop on one-hot windows of
40 characters; a `LambdaCallback` samples text at every epoch end, one `predict` on a
single window per character.

Changed from the example: a random text of 6,000 characters over 30 symbols instead of
Nietzsche's 600,000 (1,987 windows instead of 200,285); 2 epochs instead of 60; at each
epoch end 2 temperatures and 20 characters each instead of 4 and 400. `lr=` is spelled
`learning_rate=` (Keras 3). The model and the Keras calls are the example's.
"""

import random
import sys

import numpy as np
from keras.callbacks import LambdaCallback
from keras.layers import LSTM, Dense
from keras.models import Sequential
from keras.optimizers import RMSprop

# Stand-in for nietzsche.txt: random lower-case letters, spaces, some punctuation.
rng = np.random.default_rng(20150615)
text = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz .,\n"), size=6000))
print("corpus length:", len(text))

chars = sorted(set(text))
print("total chars:", len(chars))
char_indices = {c: i for i, c in enumerate(chars)}
indices_char = {i: c for i, c in enumerate(chars)}

# Windows of maxlen characters every `step` characters, each with the character after it.
maxlen = 40
step = 3
sentences = [text[i : i + maxlen] for i in range(0, len(text) - maxlen, step)]
next_chars = [text[i + maxlen] for i in range(0, len(text) - maxlen, step)]
print("nb sequences:", len(sentences))

x = np.zeros((len(sentences), maxlen, len(chars)), dtype=bool)
y = np.zeros((len(sentences), len(chars)), dtype=bool)
for i, sentence in enumerate(sentences):
    for t, char in enumerate(sentence):
        x[i, t, char_indices[char]] = True
    y[i, char_indices[next_chars[i]]] = True

model = Sequential()
model.add(LSTM(128, input_shape=(maxlen, len(chars))))
model.add(Dense(len(chars), activation="softmax"))
# tf_spectrain: the one line goes here

optimizer = RMSprop(learning_rate=0.01)
model.compile(loss="categorical_crossentropy", optimizer=optimizer)


def sample(preds, temperature=1.0):
    """An index drawn from the probabilities `preds` sharpened by `temperature`."""
    logits = np.log(np.asarray(preds).astype("float64")) / temperature
    probs = np.exp(logits) / np.sum(np.exp(logits))
    return int(np.argmax(np.random.multinomial(1, probs, 1)))


def on_epoch_end(epoch, _):
    """Prints text the model generates from a random window of the corpus."""
    print()
    print("----- Generating text after Epoch: %d" % epoch)
    start_index = random.randint(0, len(text) - maxlen - 1)
    for diversity in [0.2, 1.0]:
        print("----- diversity:", diversity)
        sentence = text[start_index : start_index + maxlen]
        print('----- Generating with seed: "' + sentence + '"')
        sys.stdout.write(sentence)
        for _ in range(20):
            x_pred = np.zeros((1, maxlen, len(chars)))
            for t, char in enumerate(sentence):
                x_pred[0, t, char_indices[char]] = 1.0
            preds = model.predict(x_pred, verbose=0)[0]
            next_char = indices_char[sample(preds, diversity)]
            sentence = sentence[1:] + next_char
            sys.stdout.write(next_char)
            sys.stdout.flush()
        print()


print_callback = LambdaCallback(on_epoch_end=on_epoch_end)
model.fit(x, y, batch_size=128, epochs=2, callbacks=[print_callback])
