"""A character-level LSTM encoder-decoder (two inputs), after keras-io's example.

Follows https://keras.io/examples/nlp/lstm_seq2seq/
(examples/nlp/lstm_seq2seq.py in keras-team/keras-io): an LSTM encoder whose final states
start an LSTM decoder fed the target shifted by one step (teacher forcing), a functional
model with two inputs, trained with `validation_split=0.2`, saved with `model.save`,
reloaded with `keras.models.load_model`, and cut into an encoder and a step-by-step
decoder that translate single sequences with `predict`.

Changed from the example: 600 random pairs of "sentences" (input lengths 2 to 15
characters from 40 symbols, targets 2 to 55 from 55, close to the English-French
set's) instead of the download of 10,000 pairs; latent dimension 64 instead of 256;
2 epochs instead of 100; 3 sequences decoded instead of 20. The model's structure and
the Keras calls are the example's.
"""

import keras
import numpy as np

batch_size = 64
epochs = 2
latent_dim = 64
num_samples = 600

# Stand-ins for the English-French pairs: random strings over two alphabets.
rng = np.random.default_rng(20170929)
source_alphabet = list(" abcdefghijklmnopqrstuvwxyz.,!?'-0123456")
target_alphabet = list(" abcdefghijklmnopqrstuvwxyzéèêàâçùûôîï.,!?'-«»ABCDEFGHIJ")


def random_text(alphabet, low, high):
    """A string of `low` to `high` characters drawn from `alphabet`."""
    return "".join(rng.choice(alphabet, size=rng.integers(low, high + 1)))


input_texts = []
target_texts = []
input_characters = set()
target_characters = set()
for _ in range(num_samples):
    input_text = random_text(source_alphabet, 2, 15)
    # Tab starts a target sequence, newline ends it.
    target_text = "\t" + random_text(target_alphabet, 2, 55) + "\n"
    input_texts.append(input_text)
    target_texts.append(target_text)
    input_characters.update(input_text)
    target_characters.update(target_text)

input_characters = sorted(input_characters)
target_characters = sorted(target_characters)
num_encoder_tokens = len(input_characters)
num_decoder_tokens = len(target_characters)
max_encoder_seq_length = max(len(text) for text in input_texts)
max_decoder_seq_length = max(len(text) for text in target_texts)
print("Number of samples:", len(input_texts))
print("Unique input / output tokens:", num_encoder_tokens, num_decoder_tokens)
print("Max input / output length:", max_encoder_seq_length, max_decoder_seq_length)

input_token_index = {char: i for i, char in enumerate(input_characters)}
target_token_index = {char: i for i, char in enumerate(target_characters)}

# One-hot tensors; the rest of each sequence is padded with spaces. The decoder's
# target is its input one step ahead (without the start character).
encoder_input_data = np.zeros(
    (len(input_texts), max_encoder_seq_length, num_encoder_tokens), dtype="float32"
)
decoder_input_data = np.zeros(
    (len(input_texts), max_decoder_seq_length, num_decoder_tokens), dtype="float32"
)
decoder_target_data = np.zeros_like(decoder_input_data)
for i, (input_text, target_text) in enumerate(zip(input_texts, target_texts)):
    for t, char in enumerate(input_text):
        encoder_input_data[i, t, input_token_index[char]] = 1.0
    encoder_input_data[i, len(input_text):, input_token_index[" "]] = 1.0
    for t, char in enumerate(target_text):
        decoder_input_data[i, t, target_token_index[char]] = 1.0
        if t > 0:
            decoder_target_data[i, t - 1, target_token_index[char]] = 1.0
    decoder_input_data[i, len(target_text):, target_token_index[" "]] = 1.0
    decoder_target_data[i, len(target_text) - 1:, target_token_index[" "]] = 1.0

# The encoder keeps only its final states; they start the decoder.
encoder_inputs = keras.Input(shape=(None, num_encoder_tokens))
encoder = keras.layers.LSTM(latent_dim, return_state=True)
encoder_outputs, state_h, state_c = encoder(encoder_inputs)
encoder_states = [state_h, state_c]

decoder_inputs = keras.Input(shape=(None, num_decoder_tokens))
decoder_lstm = keras.layers.LSTM(latent_dim, return_sequences=True, return_state=True)
decoder_outputs, _, _ = decoder_lstm(decoder_inputs, initial_state=encoder_states)
decoder_dense = keras.layers.Dense(num_decoder_tokens, activation="softmax")
decoder_outputs = decoder_dense(decoder_outputs)

model = keras.Model([encoder_inputs, decoder_inputs], decoder_outputs)
# tf_spectrain: the one line goes here

model.compile(optimizer="rmsprop", loss="categorical_crossentropy", metrics=["accuracy"])
model.fit(
    [encoder_input_data, decoder_input_data],
    decoder_target_data,
    batch_size=batch_size,
    epochs=epochs,
    validation_split=0.2,
)
model.save("s2s_model.keras")

# Sampling models, rebuilt from the reloaded model's layers.
model = keras.models.load_model("s2s_model.keras")

encoder_inputs = model.input[0]
encoder_outputs, state_h_enc, state_c_enc = model.layers[2].output
encoder_model = keras.Model(encoder_inputs, [state_h_enc, state_c_enc])

decoder_inputs = model.input[1]
decoder_state_input_h = keras.Input(shape=(latent_dim,))
decoder_state_input_c = keras.Input(shape=(latent_dim,))
decoder_states_inputs = [decoder_state_input_h, decoder_state_input_c]
decoder_lstm = model.layers[3]
decoder_outputs, state_h_dec, state_c_dec = decoder_lstm(
    decoder_inputs, initial_state=decoder_states_inputs
)
decoder_dense = model.layers[4]
decoder_outputs = decoder_dense(decoder_outputs)
decoder_model = keras.Model(
    [decoder_inputs] + decoder_states_inputs, [decoder_outputs, state_h_dec, state_c_dec]
)

reverse_target_char_index = {i: char for char, i in target_token_index.items()}


def decode_sequence(input_seq):
    """Greedy decoding of one one-hot input sequence, a character per decoder call."""
    states_value = encoder_model.predict(input_seq, verbose=0)
    target_seq = np.zeros((1, 1, num_decoder_tokens))
    target_seq[0, 0, target_token_index["\t"]] = 1.0
    decoded_sentence = ""
    while True:
        output_tokens, h, c = decoder_model.predict([target_seq] + states_value, verbose=0)
        sampled_token_index = int(np.argmax(output_tokens[0, -1, :]))
        sampled_char = reverse_target_char_index[sampled_token_index]
        decoded_sentence += sampled_char
        if sampled_char == "\n" or len(decoded_sentence) > max_decoder_seq_length:
            return decoded_sentence
        target_seq = np.zeros((1, 1, num_decoder_tokens))
        target_seq[0, 0, sampled_token_index] = 1.0
        states_value = [h, c]


for seq_index in range(3):
    input_seq = encoder_input_data[seq_index : seq_index + 1]
    print("-")
    print("Input sentence:", input_texts[seq_index])
    print("Decoded sentence:", decode_sequence(input_seq))
