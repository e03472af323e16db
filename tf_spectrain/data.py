"""Image classification datasets as `tf.data` pipelines.

Every dataset comes out the same way, so that any model of `tf_spectrain.models` can train
on any of them: batches of `(images, labels)` with float32 images `[B, 32, 32, 3]` and int32
labels `[B]`.

| name            | classes | train  | test   | source                             |
|-----------------|---------|--------|--------|------------------------------------|
| `digits`        | 10      | 1,437  | 360    | scikit-learn (bundled, no network) |
| `mnist`         | 10      | 60,000 | 10,000 | tensorflow-datasets                |
| `fashion_mnist` | 10      | 60,000 | 10,000 | tensorflow-datasets                |
| `cifar10`       | 10      | 50,000 | 10,000 | tensorflow-datasets                |
| `cifar100`      | 100     | 50,000 | 10,000 | tensorflow-datasets                |

Preprocessing:

- Images are scaled to [0, 1]. Smaller images (8x8 digits, 28x28 MNIST-like) are resized
  bilinearly to 32x32, and grey images are repeated to 3 channels.
- Each channel is normalised: `(x - mean) / std`. CIFAR and MNIST-like datasets use their
  well-known training-set constants; `digits` uses the mean and std of its own training
  split, computed once.
- `digits` is scikit-learn's 8x8 handwritten digits set with a fixed 80/20 stratified split
  (the same split whatever `seed` is, so the test set never changes).

Augmentation (the standard CIFAR recipe), applied to training batches only by default:
pad 4 black pixels on each side, take a random 32x32 crop, and flip left/right with
probability 1/2. The flip is used only where a mirror image shows the same class
(`cifar10`, `cifar100`, `fashion_mnist`); never for `digits` and `mnist`, because a mirrored
digit is not that digit.

Shuffling and augmentation are deterministic: the same `seed` gives the same epochs, in the
same order, in every run (TensorFlow combines the `seed` with its global seed, so set the
global seed to the same value too, or not at all). Each new pass over a training dataset
(each Keras epoch) is shuffled and augmented anew.

Offline use: tensorflow-datasets data are read from `data_dir` and nothing is downloaded
unless `download=True`. A dataset that is not prepared there fails at once with
`DatasetNotFoundError`, which explains how to prepare it elsewhere and copy it over.
`get_info`, `dataset_names` and `check_available` run no TensorFlow op, so they are safe
to call before the program has set up its devices.
"""

import dataclasses
import functools
import numbers
import os
import re

import numpy as np
import tensorflow as tf

from tf_spectrain.messages import did_you_mean

IMAGE_SIZE = 32
_PAD = 4  # pixels of padding before the random crop
_DIGITS_TEST_SIZE = 360
_DIGITS_SPLIT_SEED = 20180907  # fixed: the digits test set never changes
_MAX_SEED = 2**62
# Augmentation draws from seeds in [2**62, 2**63), shuffling from [0, 2**62): never equal.
_AUGMENT_SEED_OFFSET = 2**62
_ARRAY_BATCH = 512
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is not prepared on disk and downloading was not allowed."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset.

    Attributes:
        name: the dataset name, one of `dataset_names()`.
        num_classes: the number of classes; labels are `0..num_classes-1`.
        image_shape: the shape of one image as `load` yields it, `(32, 32, 3)`.
        num_train: the number of training examples.
        num_test: the number of test examples.
        source: `"sklearn"` (bundled, always available) or `"tfds"`
            (tensorflow-datasets, prepared in a data dir).
    """

    name: str
    num_classes: int
    image_shape: tuple
    num_train: int
    num_test: int
    source: str


def _info(name, num_classes, num_train, num_test, source):
    shape = (IMAGE_SIZE, IMAGE_SIZE, 3)
    return DatasetInfo(name, num_classes, shape, num_train, num_test, source)


_INFOS = {
    "cifar10": _info("cifar10", 10, 50_000, 10_000, "tfds"),
    "cifar100": _info("cifar100", 100, 50_000, 10_000, "tfds"),
    "digits": _info("digits", 10, 1_797 - _DIGITS_TEST_SIZE, _DIGITS_TEST_SIZE, "sklearn"),
    "fashion_mnist": _info("fashion_mnist", 10, 60_000, 10_000, "tfds"),
    "mnist": _info("mnist", 10, 60_000, 10_000, "tfds"),
}

# Per-channel (mean, std) of the training images scaled to [0, 1]; digits: computed.
_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,) * 3, (0.3081,) * 3),
    "fashion_mnist": ((0.2860,) * 3, (0.3530,) * 3),
}

# Datasets whose mirror images belong to the same class: only these are flipped.
_FLIP_INVARIANT = frozenset({"cifar10", "cifar100", "fashion_mnist"})


# ---------------------------------------------------------------------------------------
# Argument checks (no TensorFlow).


def _check_name(name):
    if isinstance(name, str) and name in _INFOS:
        return name
    message = f"`dataset` must be one of {dataset_names()}. Received: dataset={name!r}"
    hint = did_you_mean(name, dataset_names(), ignore_case=True, cutoff=0.5)
    raise ValueError(f"{message}{hint or '.'}")


def _check_split(split):
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(arg, value, low, high=None, allow_none=False):
    if value is None and allow_none:
        return
    if not _is_int(value) or value < low or (high is not None and value >= high):
        valid = f"an integer >= {low}" + ("" if high is None else f" and < {high}")
        valid += " or None" if allow_none else ""
        raise ValueError(f"`{arg}` must be {valid}. Received: {arg}={value!r}")


def _check_bool(arg, value, allow_none=False):
    if isinstance(value, bool) or (value is None and allow_none):
        return
    valid = "True, False or None" if allow_none else "True or False"
    raise TypeError(f"`{arg}` must be {valid}. Received: {arg}={value!r}")


def _check_data_dir(data_dir):
    if data_dir is None:
        return None
    if not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(
            "`data_dir` must be a path (str or os.PathLike) or None. "
            f"Received: data_dir={data_dir!r}"
        )
    return os.fspath(data_dir)


# ---------------------------------------------------------------------------------------
# Public metadata API (no TensorFlow op).


def dataset_names():
    """Returns the names of the available datasets, sorted.

    Returns:
        A list of str: `['cifar10', 'cifar100', 'digits', 'fashion_mnist', 'mnist']`.
    """
    return sorted(_INFOS)


def get_info(name):
    """Returns the `DatasetInfo` of a dataset. Runs no TensorFlow op.

    Args:
        name: a dataset name, one of `dataset_names()`.

    Returns:
        A `DatasetInfo`.

    Raises:
        ValueError: if `name` is not a known dataset.
    """
    return _INFOS[_check_name(name)]


def check_available(name, data_dir=None, download=False):
    """Checks, without TensorFlow and without network, that `load` can read a dataset.

    A tensorflow-datasets dataset is available when it is prepared on disk, i.e. some
    `<data_dir>/<name>/<version>/dataset_info.json` exists, or when `download=True` (then
    `load` downloads and prepares it if needed). `digits` is always available.

    Args:
        name: a dataset name, one of `dataset_names()`.
        data_dir: the tensorflow-datasets data directory; None means tfds' default
            (`$TFDS_DATA_DIR`, else `~/tensorflow_datasets`).
        download: whether downloading is allowed.

    Returns:
        None.

    Raises:
        ValueError: if `name` is not a known dataset.
        TypeError: if `data_dir` is not a path or `download` not a bool.
        DatasetNotFoundError: if the dataset is not prepared and `download` is False;
            the message says how to prepare it.
    """
    _prepared_version(name, data_dir, download)


def _default_data_dir():
    # The same rule as tensorflow-datasets' own default, without importing it.
    default = os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
    return os.environ.get("TFDS_DATA_DIR", default)


def _how_to_prepare(name):
    return (
        f"To get it, run `python train.py --dataset {name} --download --data-dir DIR` "
        f"(or `tfds build {name} --data_dir DIR`) on a machine with network access, copy "
        "DIR to this machine and pass it as `data_dir` (`--data-dir DIR`); or pass "
        "`download=True` (`--download`) if this machine can reach the network."
    )


def _prepared_versions(dataset_dir):
    """Versions (sorted, oldest first) of `dataset_dir` holding a `dataset_info.json`."""
    if not os.path.isdir(dataset_dir):
        return []
    versions = [
        entry
        for entry in os.listdir(dataset_dir)
        if _VERSION_RE.match(entry)
        and os.path.isfile(os.path.join(dataset_dir, entry, "dataset_info.json"))
    ]
    return sorted(versions, key=lambda v: tuple(int(part) for part in v.split(".")))


def _prepared_version(name, data_dir, download):
    """Checks availability; returns the newest prepared version to read, or None.

    None means that nothing needs to be on disk: `digits`, or `download=True`.
    """
    info = get_info(name)
    data_dir = _check_data_dir(data_dir)
    _check_bool("download", download)
    if info.source != "tfds" or download:
        return None
    root = _default_data_dir() if data_dir is None else data_dir
    which = "The default tensorflow-datasets data directory" if data_dir is None else "`data_dir`"
    if not os.path.isdir(root):
        raise DatasetNotFoundError(
            f"Cannot load dataset {name!r}: {which} {root!r} does not exist (or is not a "
            f"directory), and download=False so nothing is downloaded. {_how_to_prepare(name)}"
        )
    versions = _prepared_versions(os.path.join(root, name))
    if not versions:
        raise DatasetNotFoundError(
            f"Dataset {name!r} is not prepared in {which} {root!r}: no "
            f"{os.path.join(root, name, '<version>', 'dataset_info.json')!r} was found, and "
            f"download=False so nothing is downloaded. {_how_to_prepare(name)}"
        )
    return versions[-1]


# ---------------------------------------------------------------------------------------
# digits: scikit-learn's bundled 8x8 images, resized in NumPy.


def _bilinear_matrix(size_in, size_out):
    """`[size_out, size_in]` bilinear interpolation weights with half-pixel centres.

    The same sampling as `tf.image.resize(..., method="bilinear")` without antialiasing.
    """
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
def _digits():
    """The digits splits in [0, 1] and their training statistics (cached, read-only)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = _resize_to_rgb32(bunch.images / 16.0)
    labels = bunch.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images,
        labels,
        test_size=_DIGITS_TEST_SIZE,
        stratify=labels,
        random_state=_DIGITS_SPLIT_SEED,
    )
    mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64)
    std = x_train.std(axis=(0, 1, 2), dtype=np.float64)
    arrays = {"train": (x_train, y_train), "test": (x_test, y_test)}
    for array in (x_train, x_test, y_train, y_test):
        array.flags.writeable = False
    return arrays, (tuple(mean), tuple(std))


def _stats(name):
    """Per-channel (mean, std) as float32 arrays of shape [3]."""
    mean, std = _digits()[1] if name == "digits" else _STATS[name]
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)


# ---------------------------------------------------------------------------------------
# Sources: unbatched `(image, label)` datasets before any preprocessing.


def _digits_source(split):
    images, labels = _digits()[0][split]
    return tf.data.Dataset.from_tensor_slices((images, labels))


def _tfds_source(name, split, data_dir, download):
    import tensorflow_datasets as tfds

    version = _prepared_version(name, data_dir, download)
    if version is not None:
        # An explicit version makes tfds read the prepared files (any version) offline.
        spec = f"{name}:{version}"
        data_dir = _default_data_dir() if data_dir is None else data_dir
    else:
        spec = name
    examples = tfds.load(
        spec, split=split, data_dir=data_dir, download=download, shuffle_files=False
    )
    return examples.map(lambda example: (example["image"], example["label"]))


def _to_unit_rgb32(image, label):
    """Any source image -> float32 `[32, 32, 3]` in [0, 1]; label -> int32."""
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


def _with_augmentation(examples, name, seed, rerandomize=True):
    # One fresh pair of seeds per example, deterministic for `seed`, new on each pass
    # (unless `rerandomize` is False: then every pass draws the same).
    seeds = tf.data.Dataset.random(
        seed=seed + _AUGMENT_SEED_OFFSET, rerandomize_each_iteration=rerandomize
    ).batch(2)
    flip = name in _FLIP_INVARIANT
    return tf.data.Dataset.zip((examples, seeds)).map(
        lambda example, pair: (_augment(example[0], pair, flip), example[1]),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


# ---------------------------------------------------------------------------------------
# Public loading API.


def load(
    name,
    split,
    batch_size,
    *,
    data_dir=None,
    download=False,
    training=None,
    seed=0,
    limit=None,
    augment=None,
):
    """Returns a dataset of normalised `(images, labels)` batches.

    Training pipelines shuffle the whole split (a new order on each pass, deterministic
    for `seed`) and augment (random crop after 4-pixel padding; left/right flip only for
    `cifar10`, `cifar100`, `fashion_mnist`). Test pipelines keep the order of the split
    and do not augment. The last, partial batch is kept. The training shuffle buffer holds
    the whole split (about 150 MB of uint8 images for CIFAR); use `limit` for quick runs.

    Args:
        name: a dataset name, one of `dataset_names()`.
        split: `"train"` or `"test"`.
        batch_size: examples per batch, an int >= 1.
        data_dir: tensorflow-datasets data directory (ignored for `digits`); None means
            tfds' default (`$TFDS_DATA_DIR`, else `~/tensorflow_datasets`).
        download: allow tensorflow-datasets to download and prepare the dataset. If False,
            a dataset that is not prepared in `data_dir` raises at once.
        training: shuffle (and, by default, augment). None means `split == "train"`.
        seed: an int in [0, 2**62) that fixes the shuffle order and the augmentation.
        limit: None, or an int >= 1: use only the first `limit` examples of the split
            (taken before shuffling).
        augment: apply the random crop (and flip). None means the value of `training`.

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: float32 `[B, 32, 32, 3]` and int32
        `[B]`, prefetched.

    Raises:
        ValueError: for an unknown `name` or `split`, or a bad `batch_size`, `seed`,
            `limit`.
        TypeError: if `training`, `augment` or `download` is not a bool (or None where
            allowed), or `data_dir` not a path.
        DatasetNotFoundError: if the dataset is not prepared in `data_dir` and
            `download` is False.
    """
    info = get_info(name)
    _check_split(split)
    _check_int("batch_size", batch_size, 1)
    _check_int("seed", seed, 0, _MAX_SEED)
    _check_int("limit", limit, 1, allow_none=True)
    _check_bool("training", training, allow_none=True)
    _check_bool("augment", augment, allow_none=True)
    training = split == "train" if training is None else training
    augment = training if augment is None else augment
    examples, size = _source(info, split, data_dir, download, limit)
    batches = _pass(examples, size, info.name, batch_size, seed, training, augment)
    return batches.prefetch(tf.data.AUTOTUNE)


def _source(info, split, data_dir, download, limit):
    """The split's raw examples (the first `limit`) and how many there are."""
    if info.source == "sklearn":
        _check_data_dir(data_dir)
        _check_bool("download", download)
        examples = _digits_source(split)
    else:
        examples = _tfds_source(info.name, split, data_dir, download)
    size = info.num_train if split == "train" else info.num_test
    if limit is not None:
        examples = examples.take(limit)
        size = min(size, limit)
    return examples, size


def _pass(examples, size, name, batch_size, seed, shuffle, augment, rerandomize=True):
    """One pass over `examples`: shuffled, augmented, normalised, batched."""
    if shuffle:
        examples = examples.shuffle(size, seed=seed, reshuffle_each_iteration=rerandomize)
    examples = examples.map(_to_unit_rgb32, num_parallel_calls=tf.data.AUTOTUNE)
    if augment:
        examples = _with_augmentation(examples, name, seed, rerandomize)
    mean, std = _stats(name)
    examples = examples.map(
        lambda image, label: ((image - mean) / std, label),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return examples.batch(batch_size, drop_remainder=False)


def epoch_seed(seed, epoch):
    """The shuffle and augmentation seed of training epoch `epoch` of a run seeded `seed`.

    A pure function of both, in [0, 2**62): the order of any epoch can be rebuilt from
    the run's seed and the epoch number alone (what checkpoints keep to resume exactly).
    """
    _check_int("seed", seed, 0, _MAX_SEED)
    _check_int("epoch", epoch, 0)
    state = np.random.SeedSequence([int(seed), int(epoch)]).generate_state(2, np.uint32)
    return (int(state[0]) << 30 | int(state[1]) >> 2) % _MAX_SEED


def steps_per_epoch(name, batch_size, limit=None):
    """Mini-batches in one training epoch (the last one may be smaller)."""
    info = get_info(name)
    _check_int("batch_size", batch_size, 1)
    _check_int("limit", limit, 1, allow_none=True)
    size = info.num_train if limit is None else min(limit, info.num_train)
    return -(-size // batch_size)


def load_epochs(
    name,
    batch_size,
    *,
    epochs,
    start_epoch=0,
    skip_batches=0,
    seed=0,
    data_dir=None,
    download=False,
    limit=None,
    augment=True,
):
    """The training batches of epochs `start_epoch .. epochs - 1`, one after another.

    Unlike `load`, whose order changes with each pass over the dataset, the order and
    augmentation of epoch `e` here depend only on `(seed, e)` (see `epoch_seed`): a run
    resumed at epoch `e`, in a new process, sees exactly the data an uninterrupted run
    would have seen. Pass `steps_per_epoch(name, batch_size, limit)` to `fit`, as the
    dataset holds several epochs.

    Args:
        name: a dataset name, one of `dataset_names()`.
        batch_size: examples per batch, an int >= 1.
        epochs: the epoch to stop before (an int > `start_epoch`).
        start_epoch: the first epoch, an int >= 0.
        skip_batches: leave out the first batches of `start_epoch` (resuming a
            checkpoint written in the middle of an epoch); an int >= 0 smaller than the
            number of batches of an epoch.
        seed: an int in [0, 2**62), the run's seed.
        data_dir, download, limit: as for `load`.
        augment: apply the random crop (and flip), as for `load`.

    Returns:
        A finite `tf.data.Dataset` of `(images, labels)` batches, prefetched.

    Raises:
        ValueError, TypeError, DatasetNotFoundError: for bad arguments, as for `load`.
    """
    info = get_info(name)
    _check_int("batch_size", batch_size, 1)
    _check_int("seed", seed, 0, _MAX_SEED)
    _check_int("limit", limit, 1, allow_none=True)
    _check_int("start_epoch", start_epoch, 0)
    _check_int("epochs", epochs, start_epoch + 1)
    per_epoch = steps_per_epoch(name, batch_size, limit)
    _check_int("skip_batches", skip_batches, 0, per_epoch)
    _check_bool("augment", augment)
    examples, size = _source(info, "train", data_dir, download, limit)
    dataset = None
    for epoch in range(start_epoch, epochs):
        one = _pass(
            examples, size, info.name, batch_size, epoch_seed(seed, epoch), True, augment,
            rerandomize=False,
        )
        if epoch == start_epoch and skip_batches:
            one = one.skip(skip_batches)
        dataset = one if dataset is None else dataset.concatenate(one)
    return dataset.prefetch(tf.data.AUTOTUNE)


def load_arrays(name, split, *, data_dir=None, download=False, limit=None):
    """Returns a whole split as normalised NumPy arrays, in order, without augmentation.

    Meant for small sets and tests: a full CIFAR training split takes about 600 MB.

    Args:
        name: a dataset name, one of `dataset_names()`.
        split: `"train"` or `"test"`.
        data_dir: tensorflow-datasets data directory, as for `load`.
        download: allow downloading, as for `load`.
        limit: None, or an int >= 1: only the first `limit` examples.

    Returns:
        `(x, y)`: float32 `[N, 32, 32, 3]` images and int32 `[N]` labels.

    Raises:
        ValueError, TypeError, DatasetNotFoundError: as for `load`.
    """
    info = get_info(name)
    _check_split(split)
    _check_int("limit", limit, 1, allow_none=True)
    if info.source == "sklearn":
        _check_data_dir(data_dir)
        _check_bool("download", download)
        images, labels = _digits()[0][split]
        mean, std = _stats(name)
        return (images[:limit] - mean) / std, labels[:limit].copy()
    batches = load(
        name,
        split,
        _ARRAY_BATCH,
        data_dir=data_dir,
        download=download,
        training=False,
        augment=False,
        limit=limit,
    )
    xs, ys = zip(*batches.as_numpy_iterator())
    return np.concatenate(xs), np.concatenate(ys)
