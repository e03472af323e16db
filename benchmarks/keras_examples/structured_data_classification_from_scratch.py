"""Heart-disease classification from a dict of features, after keras-io's example.

Follows https://keras.io/examples/structured_data/structured_data_classification_from_scratch/
(examples/structured_data/structured_data_classification_from_scratch.py in
keras-team/keras-io, the backend-agnostic version): categorical columns are multi-hot
encoded by `IntegerLookup` / `StringLookup` inside a `tf.data` pipeline, numerical ones
by `Normalization` layers adapted on the training set; a functional model takes a dict
of 13 inputs, a custom layer (`Classifier`) concatenates them, and the model trains on
`tf.data` datasets with `validation_data`, then predicts one patient from a dict.

Changed from the example: 303 random patients with the columns and value ranges of the
Cleveland heart-disease CSV instead of the download, kept in a dict of NumPy columns
instead of a pandas DataFrame (the train / validation split takes 20% at random, as
`DataFrame.sample(frac=0.2)` does); the TensorFlow backend (the example sets
`KERAS_BACKEND=torch`); 3 epochs instead of 50; no `plot_model`. The model and the Keras
calls are the example's, including one quirk: the numerical entries of the model's
input dict are the `Normalization` layers' outputs, not `Input`s, so Keras warns that
their names do not match and feeds the raw numbers there.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

# Stand-in for heart.csv: one array per column; "thal" is the only string column.
rng = np.random.default_rng(20200609)
num_rows = 303
columns = {
    "age": rng.integers(29, 78, num_rows),
    "sex": rng.integers(0, 2, num_rows),
    "cp": rng.integers(0, 5, num_rows),
    "trestbps": rng.integers(94, 201, num_rows),
    "chol": rng.integers(126, 565, num_rows),
    "fbs": rng.integers(0, 2, num_rows),
    "restecg": rng.integers(0, 3, num_rows),
    "thalach": rng.integers(71, 203, num_rows),
    "exang": rng.integers(0, 2, num_rows),
    "oldpeak": np.round(rng.uniform(0.0, 6.2, num_rows), 1),
    "slope": rng.integers(1, 4, num_rows),
    "ca": rng.integers(0, 4, num_rows),
    "thal": rng.choice(["fixed", "normal", "reversible", "1", "2"], num_rows),
    "target": rng.integers(0, 2, num_rows),
}
val_rows = rng.choice(num_rows, size=round(0.2 * num_rows), replace=False)
train_rows = np.setdiff1d(np.arange(num_rows), val_rows)
print(f"Using {len(train_rows)} samples for training and {len(val_rows)} for validation")

COLUMN_NAMES = list(columns)
TARGET_FEATURE_NAME = "target"
NUMERIC_FEATURE_NAMES = ["age", "trestbps", "thalach", "oldpeak", "slope", "chol"]
# Every other feature is categorical: its sorted values (ints stay ints, the rest strings).
CATEGORICAL_FEATURES_WITH_VOCABULARY = {
    name: sorted(
        value if columns[name].dtype == "int64" else str(value)
        for value in np.unique(columns[name]).tolist()
    )
    for name in COLUMN_NAMES
    if name not in NUMERIC_FEATURE_NAMES + [TARGET_FEATURE_NAME]
}
FEATURE_NAMES = NUMERIC_FEATURE_NAMES + list(CATEGORICAL_FEATURES_WITH_VOCABULARY)


def encode_categorical(features, target):
    """Replaces each categorical feature by its multi-hot encoding (in `tf.data`)."""
    for name in features:
        if name not in CATEGORICAL_FEATURES_WITH_VOCABULARY:
            continue
        lookup_class = (
            layers.StringLookup if features[name].dtype == "string" else layers.IntegerLookup
        )
        lookup = lookup_class(
            vocabulary=CATEGORICAL_FEATURES_WITH_VOCABULARY[name],
            mask_token=None,
            num_oov_indices=0,
            output_mode="binary",
        )
        features[name] = lookup(features[name])
    return dict(features), target


def encode_numerical_feature(feature, name, dataset):
    """`feature` through a `Normalization` layer adapted on `dataset`'s column `name`."""
    normalizer = layers.Normalization()
    column = dataset.map(lambda x, y: x[name]).map(lambda x: tf.expand_dims(x, -1))
    normalizer.adapt(column)
    return normalizer(feature)


def rows_to_dataset(rows):
    """A shuffled dataset of (dict of features, target) for the rows `rows`."""
    features = {name: values[rows] for name, values in columns.items() if name != "target"}
    labels = columns["target"][rows]
    ds = tf.data.Dataset.from_tensor_slices((features, labels)).map(encode_categorical)
    return ds.shuffle(buffer_size=len(rows))


train_ds = rows_to_dataset(train_rows)
val_ds = rows_to_dataset(val_rows)
for x, y in train_ds.take(1):
    print("Input:", x)
    print("Target:", y)
train_ds = train_ds.batch(32)
val_ds = val_ds.batch(32)


def create_model_inputs():
    """The model's inputs by feature name: multi-hot categoricals, normalized numbers."""
    inputs = {}
    for name in FEATURE_NAMES:
        if name in CATEGORICAL_FEATURES_WITH_VOCABULARY:
            size = len(CATEGORICAL_FEATURES_WITH_VOCABULARY[name])
            inputs[name] = layers.Input(name=name, shape=(size,), dtype="int64")
        else:
            number = layers.Input(name=name, shape=(1,), dtype="float32")
            inputs[name] = encode_numerical_feature(number, name, train_ds)
    return inputs


class Classifier(keras.layers.Layer):
    """Concatenates a dict of features; a hidden layer, dropout and a sigmoid unit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense_1 = layers.Dense(32, activation="relu")
        self.dropout = layers.Dropout(0.5)
        self.dense_2 = layers.Dense(1, activation="sigmoid")

    def call(self, inputs):
        features = layers.concatenate(list(inputs.values()))
        return self.dense_2(self.dropout(self.dense_1(features)))

    def build(self, input_shape):
        self.built = True


def create_model():
    """The functional model from the dict of inputs to the probability of disease."""
    all_inputs = create_model_inputs()
    return keras.Model(all_inputs, Classifier()(all_inputs))


model = create_model()
# tf_spectrain: the one line goes here
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
model.fit(train_ds, epochs=3, validation_data=val_ds)

# One new patient: scalars wrapped in a batch of one, categoricals one-hot encoded by hand.
sample = {
    "age": 60,
    "sex": 1,
    "cp": 1,
    "trestbps": 145,
    "chol": 233,
    "fbs": 1,
    "restecg": 2,
    "thalach": 150,
    "exang": 0,
    "oldpeak": 2.3,
    "slope": 3,
    "ca": 0,
    "thal": "fixed",
}


def get_cat_encoding(categories, value):
    """The one-hot list of `value` among `categories` (all zeros if absent)."""
    return [1 if category == value else 0 for category in categories]


for name, value in sample.items():
    if name in CATEGORICAL_FEATURES_WITH_VOCABULARY:
        sample[name] = get_cat_encoding(CATEGORICAL_FEATURES_WITH_VOCABULARY[name], value)
input_dict = {name: tf.convert_to_tensor([value]) for name, value in sample.items()}
predictions = model.predict(input_dict)
print(
    f"This particular patient had a {100 * predictions[0][0]:.1f} percent probability "
    "of having a heart disease, as evaluated by our model."
)
