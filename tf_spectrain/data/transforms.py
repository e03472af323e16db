"""What happens to the images: the digits set resized in NumPy, and the TensorFlow ops that
bring every image to float32 32x32 RGB in [0, 1], augment it and normalise it.

The loaders (`loaders.py`) chain these ops into `tf.data` pipelines.
"""

import functools

import numpy as np
import tensorflow as tf

from tf_spectrain.data.catalog import DIGITS_TEST_SIZE, FLIP_INVARIANT, IMAGE_SIZE, KNOWN_STATS

_PAD = 4  # pixels of padding before the random crop
_DIGITS_SPLIT_SEED = 20180907  # fixed: the digits test set never changes
# Augmentation draws from seeds in [2**62, 2**63), shuffling from [0, 2**62): never equal.
_AUGMENT_SEED_OFFSET = 2**62


# ---------------------------------------------------------------------------------------
# digits: scikit-learn's bundled 8x8 images, resized in NumPy.


def _bilinear_matrix(size_in, size_out):
    """`[size_out, size_in]` bilinear weights, as `tf.image.resize` samples without antialiasing."""
    centres = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
    centres = np.clip(centres, 0, size_in - 1)
    low = np.floor(centres).astype(int)
    high = np.minimum(low + 1, size_in - 1)
    frac = centres - low
    weights = np.zeros((size_out, size_in))
    rows = np.arange(size_out)
    np.add.at(weights, (rows, low), 1 - frac)
    np.add.at(weights, (rows, high), frac)
    return weights


def _resize_to_rgb32(images):
    """`[N, H, W]` grey images in [0, 1] -> float32 `[N, 32, 32, 3]`, bilinear."""
    rows = _bilinear_matrix(images.shape[1], IMAGE_SIZE)
    cols = _bilinear_matrix(images.shape[2], IMAGE_SIZE)
    resized = np.einsum("ah,nhw,bw->nab", rows, images, cols)
    return np.repeat(resized[..., None], 3, axis=-1).astype(np.float32)


@functools.lru_cache(maxsize=1)
def digits_arrays():
    """The digits splits in [0, 1] and their training statistics (cached, read-only).

    scikit-learn's 8x8 digits, resized to 32x32 RGB, with a fixed 80/20 stratified split.

    Returns:
        `(arrays, (mean, std))`: `arrays` maps `"train"` and `"test"` to read-only
        `(images, labels)` (float32 `[N, 32, 32, 3]`, int32 `[N]`); `mean` and `std` are
        the per-channel statistics of the training images.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = _resize_to_rgb32(bunch.images / 16.0)
    labels = bunch.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images,
        labels,
        test_size=DIGITS_TEST_SIZE,
        stratify=labels,
        random_state=_DIGITS_SPLIT_SEED,
    )
    mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64)
    std = x_train.std(axis=(0, 1, 2), dtype=np.float64)
    arrays = {"train": (x_train, y_train), "test": (x_test, y_test)}
    for array in (x_train, x_test, y_train, y_test):
        array.flags.writeable = False
    return arrays, (tuple(mean), tuple(std))


def stats(name):
    """`(mean, std)`, float32 `[3]`, of `"digits"` (its training split) or a `KNOWN_STATS` name.

    Raises KeyError for a name that is neither."""
    mean, std = digits_arrays()[1] if name == "digits" else KNOWN_STATS[name]
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)


# ---------------------------------------------------------------------------------------
# Per-example TensorFlow ops.


def to_unit_rgb32(image, label):
    """Brings any source image to float32 `[32, 32, 3]` in [0, 1], and its label to int32.

    uint8 images are divided by 255; other sizes are resized (bilinear); grey images get
    three equal channels.

    Args:
        image: an image tensor `[H, W, C]` (uint8 in [0, 255], or float in [0, 1]).
        label: its label tensor.

    Returns:
        `(image, label)`.
    """
    if image.dtype == tf.uint8:
        image = tf.cast(image, tf.float32) / 255.0
    if tuple(image.shape[:2]) != (IMAGE_SIZE, IMAGE_SIZE):
        image = tf.image.resize(image, (IMAGE_SIZE, IMAGE_SIZE), method="bilinear")
    if image.shape[-1] == 1:
        image = tf.repeat(image, 3, axis=-1)
    return image, tf.cast(label, tf.int32)


def _augment(image, seed, flip):
    """Pads 4 black pixels, crops a random 32x32 window, maybe flips: all from `seed`."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    padded = tf.pad(image, [[_PAD, _PAD], [_PAD, _PAD], [0, 0]])
    image = tf.image.stateless_random_crop(padded, (IMAGE_SIZE, IMAGE_SIZE, 3), crop_seed)
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return image


def with_augmentation(examples, name, seed, rerandomize=True):
    """Applies the standard CIFAR augmentation of dataset `name` to `(image, label)` examples.

    A 4-pixel black padding and a random 32x32 crop, and a left/right flip with
    probability 1/2 where a mirror image shows the same class. One fresh pair of seeds per
    example, deterministic for `seed`, new on each pass (unless `rerandomize` is False:
    then every pass draws the same).

    Args:
        examples: a `tf.data.Dataset` of `(image, label)`, images float32 `[32, 32, 3]`.
        name: the dataset name (it decides whether images are flipped).
        seed: the augmentation seed, an int in [0, 2**62).
        rerandomize: whether each pass over the dataset draws new crops and flips.

    Returns:
        The augmented `tf.data.Dataset`.
    """
    seeds = tf.data.Dataset.random(
        seed=seed + _AUGMENT_SEED_OFFSET, rerandomize_each_iteration=rerandomize
    ).batch(2)
    flip = name in FLIP_INVARIANT
    return tf.data.Dataset.zip((examples, seeds)).map(
        lambda example, pair: (_augment(example[0], pair, flip), example[1]),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def normalised(examples, name):
    """Normalises each image channel of `(image, label)` examples: `(x - mean) / std`.

    Args:
        examples: a `tf.data.Dataset` of `(image, label)`, images float32 `[32, 32, 3]`.
        name: the dataset name whose statistics are used (see `stats`).

    Returns:
        The normalised `tf.data.Dataset`.

    Raises:
        KeyError: for a dataset without known statistics.
    """
    mean, std = stats(name)
    return examples.map(
        lambda image, label: ((image - mean) / std, label),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
