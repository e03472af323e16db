"""A fully convolutional timeseries classifier with callbacks, after keras-io's example.

Follows https://keras.io/examples/timeseries/timeseries_classification_from_scratch/
(examples/timeseries/timeseries_classification_from_scratch.py in keras-team/keras-io):
three Conv1D / BatchNormalization / ReLU blocks and global average pooling in a
functional model, trained with `validation_split=0.2` and the callbacks
`ModelCheckpoint("best_model.keras", save_best_only=True)`, `ReduceLROnPlateau` and
`EarlyStopping`; the best file is reloaded with `keras.models.load_model` and evaluated.

Changed from the example: random series of FordA's shape (176 steps, one channel, labels
-1 / 1 mapped to 0 / 1) instead of the download; 480 training and 160 test series
instead of 3,601 and 1,320; 3 epochs instead of 500 (so the callbacks' patience is
not reached); no plots. The model, the callbacks' arguments and the Keras calls are the
example's.
"""

import keras
import numpy as np

# Stand-ins for FordA_TRAIN / FordA_TEST: z-normalised series, labels -1 or 1.
rng = np.random.default_rng(20200721)
x_train = rng.standard_normal((480, 176)).astype("float32")
y_train = rng.choice([-1, 1], size=480)
x_test = rng.standard_normal((160, 176)).astype("float32")
y_test = rng.choice([-1, 1], size=160)

# One channel per series; the training set shuffled before validation_split takes its tail.
x_train = x_train.reshape((x_train.shape[0], x_train.shape[1], 1))
x_test = x_test.reshape((x_test.shape[0], x_test.shape[1], 1))
num_classes = len(np.unique(y_train))
order = rng.permutation(len(x_train))
x_train, y_train = x_train[order], y_train[order]
y_train[y_train == -1] = 0
y_test[y_test == -1] = 0


def make_model(input_shape):
    """Three convolution blocks, global average pooling and a softmax."""
    input_layer = keras.layers.Input(input_shape)
    x = input_layer
    for _ in range(3):
        x = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    gap = keras.layers.GlobalAveragePooling1D()(x)
    output_layer = keras.layers.Dense(num_classes, activation="softmax")(gap)
    return keras.models.Model(inputs=input_layer, outputs=output_layer)


model = make_model(input_shape=x_train.shape[1:])
# tf_spectrain: the one line goes here

epochs = 3
batch_size = 32

callbacks = [
    keras.callbacks.ModelCheckpoint("best_model.keras", save_best_only=True, monitor="val_loss"),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=20, min_lr=0.0001),
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=50, verbose=1),
]
model.compile(
    optimizer="adam",
    loss="sparse_categorical_crossentropy",
    metrics=["sparse_categorical_accuracy"],
)
history = model.fit(
    x_train,
    y_train,
    batch_size=batch_size,
    epochs=epochs,
    callbacks=callbacks,
    validation_split=0.2,
    verbose=1,
)

model = keras.models.load_model("best_model.keras")
test_loss, test_acc = model.evaluate(x_test, y_test)
print("Test accuracy", test_acc)
print("Test loss", test_loss)
