"""A small convnet on MNIST-shaped digits, after keras-io's "Simple MNIST convnet".

Follows https://keras.io/examples/vision/mnist_convnet/
(examples/vision/mnist_convnet.py in keras-team/keras-io): a `Sequential` model that
starts with `keras.Input`, two convolution / max-pooling blocks, dropout and a softmax,
trained with `validation_split=0.1` and scored with `evaluate`.

Changed from the example: random images and labels of MNIST's shapes instead of the
download (1,200 training and 300 test images instead of 60,000 and 10,000); 2 epochs
instead of 15. The model and the Keras calls are the example's.
"""

import keras
import numpy as np
from keras import layers

num_classes = 10
input_shape = (28, 28, 1)

# Stand-ins for keras.datasets.mnist: uint8 pixels and integer labels.
rng = np.random.default_rng(20150619)
x_train = rng.integers(0, 256, size=(1200, 28, 28), dtype=np.uint8)
y_train = rng.integers(0, num_classes, size=(1200,))
x_test = rng.integers(0, 256, size=(300, 28, 28), dtype=np.uint8)
y_test = rng.integers(0, num_classes, size=(300,))

# Pixels in [0, 1], one channel axis, one-hot labels.
x_train = np.expand_dims(x_train.astype("float32") / 255.0, -1)
x_test = np.expand_dims(x_test.astype("float32") / 255.0, -1)
print("x_train shape:", x_train.shape, "-", len(x_test), "test samples")
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)
# tf_spectrain: the one line goes here
model.summary()

batch_size = 128
epochs = 2

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
