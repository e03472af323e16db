"""Credit-card fraud detection with class weights, after keras-io's example.

Follows https://keras.io/examples/structured_data/imbalanced_classification/
(examples/structured_data/imbalanced_classification.py in keras-team/keras-io): a
`Sequential` model (with `keras.Input`) of three 256-unit layers and dropout, confusion
metrics, a `ModelCheckpoint` that saves the model at every epoch, `validation_data` and
`class_weight` set to the inverse class frequencies.

Changed from the example: 5,120 random transactions of 30 features (about 2% fraud, so
that every batch has some; the real set has 284,807 and 0.17%) instead of the CSV;
3 epochs instead of 30. The model, the batch size (2048), the metrics and the Keras
calls are the example's.
"""

import keras
import numpy as np

# Stand-in for creditcard.csv: 30 float features, a 0/1 target per transaction.
rng = np.random.default_rng(20190528)
features = rng.standard_normal((5120, 30)).astype("float32") * rng.uniform(0.5, 50.0, 30)
targets = (rng.uniform(size=(5120, 1)) < 0.02).astype("uint8")
features[targets[:, 0] == 1] += 0.5  # frauds a little apart
print("features.shape:", features.shape, "targets.shape:", targets.shape)

num_val_samples = int(len(features) * 0.2)
train_features, train_targets = features[:-num_val_samples], targets[:-num_val_samples]
val_features, val_targets = features[-num_val_samples:], targets[-num_val_samples:]
print("Number of training samples:", len(train_features))
print("Number of validation samples:", len(val_features))

counts = np.bincount(train_targets[:, 0])
print(
    f"Number of positive samples in training data: {counts[1]} "
    f"({100 * float(counts[1]) / len(train_targets):.2f}% of total)"
)
weight_for_0 = 1.0 / counts[0]
weight_for_1 = 1.0 / counts[1]

# Standardise with the training set's statistics.
mean = np.mean(train_features, axis=0)
train_features -= mean
val_features -= mean
std = np.std(train_features, axis=0)
train_features /= std
val_features /= std

model = keras.Sequential(
    [
        keras.Input(shape=train_features.shape[1:]),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
# tf_spectrain: the one line goes here
model.summary()

metrics = [
    keras.metrics.FalseNegatives(name="fn"),
    keras.metrics.FalsePositives(name="fp"),
    keras.metrics.TrueNegatives(name="tn"),
    keras.metrics.TruePositives(name="tp"),
    keras.metrics.Precision(name="precision"),
    keras.metrics.Recall(name="recall"),
]
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics)

callbacks = [keras.callbacks.ModelCheckpoint("fraud_model_at_epoch_{epoch}.keras")]
class_weight = {0: weight_for_0, 1: weight_for_1}
model.fit(
    train_features,
    train_targets,
    batch_size=2048,
    epochs=3,
    verbose=2,
    callbacks=callbacks,
    validation_data=(val_features, val_targets),
    class_weight=class_weight,
)
