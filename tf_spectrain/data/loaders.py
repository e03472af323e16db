"""The `tf.data` loaders: a split as batches (`load`), epochs rebuilt from a seed
(`load_epochs`), a whole split as arrays (`load_arrays`), and the epoch arithmetic.

Each image pipeline reads the raw examples (scikit-learn's digits or tensorflow-datasets),
shuffles, converts and augments them with `transforms.py`'s ops, normalises and batches.
A text pipeline reads the token ids of `text.py` and only shuffles and batches them.
"""

import numpy as np
import tensorflow as tf

from tf_spectrain import checks
from tf_spectrain.data import text, transforms
from tf_spectrain.data.catalog import check_data_dir, check_split, get_info, split_size
from tf_spectrain.data.tfds_source import tfds_examples

_MAX_SEED = 2**62
_ARRAY_BATCH = 512


# ---------------------------------------------------------------------------------------
# Sources: unbatched `(image, label)` datasets before any preprocessing.


def _digits_source(split):
    """The digits split as a dataset of `(image, label)`."""
    images, labels = transforms.digits_arrays()[0][split]
    return tf.data.Dataset.from_tensor_slices((images, labels))


def _tfds_source(name, split, data_dir, download):
    """A tensorflow-datasets split as a dataset of `(image, label)` (checked, offline)."""
    examples = tfds_examples(name, split, data_dir, download)
    return examples.map(lambda example: (example["image"], example["label"]))


def _check_bundled(data_dir, download):
    """A bundled set reads no data dir and downloads nothing, but the arguments are checked."""
    check_data_dir(data_dir)
    checks.check_bool("download", download)


def _text_arrays(info, split, data_dir, download):
    """A text split's `(token ids, labels)` arrays (checked, offline)."""
    if info.source == "embedded":
        _check_bundled(data_dir, download)
        return text.pydoc_windows(info.name, split)
    return text.imdb_arrays(split, data_dir, download)


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
    """Returns a dataset of normalised `(images, labels)` batches, or `(tokens, labels)`.

    Training pipelines shuffle the whole split (a new order on each pass, deterministic
    for `seed`) and augment images (random crop after 4-pixel padding; left/right flip
    only for `cifar10`, `cifar100`, `fashion_mnist`). Test pipelines keep the order of the
    split and do not augment. The last, partial batch is kept. The training shuffle buffer
    holds the whole split (about 150 MB of uint8 images for CIFAR); use `limit` for quick
    runs. Text sets are token ids as they are: never augmented nor normalised.

    Args:
        name: a dataset name, one of `dataset_names()`.
        split: `"train"` or `"test"`.
        batch_size: examples per batch, an int >= 1.
        data_dir: tensorflow-datasets data directory (ignored for the bundled sets); None means
            tfds' default (`$TFDS_DATA_DIR`, else `~/tensorflow_datasets`).
        download: allow tensorflow-datasets to download and prepare the dataset. If False,
            a dataset that is not prepared in `data_dir` raises at once.
        training: shuffle (and, by default, augment). None means `split == "train"`.
        seed: an int in [0, 2**62) that fixes the shuffle order and the augmentation.
        limit: None, or an int >= 1: use only the first `limit` examples of the split
            (taken before shuffling).
        augment: apply the random crop (and flip). None means the value of `training`.
            Ignored for text sets.

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: float32 `[B, 32, 32, 3]` and int32
        `[B]`, prefetched. For a text set `(tokens, labels)`: int32 `[B, seq_len]` and
        int32 `[B]`, or `[B, seq_len]` for language modelling (see `DatasetInfo`).

    Raises:
        ValueError: for an unknown `name` or `split`, or a `batch_size`, `seed` or
            `limit` out of range.
        TypeError: if `batch_size`, `seed` or `limit` is not an int, `training`,
            `augment` or `download` not a bool (or None where allowed), or `data_dir`
            not a path.
        DatasetNotFoundError: if the dataset is not prepared in `data_dir` and
            `download` is False.
    """
    info = get_info(name)
    check_split(split)
    checks.check_int("batch_size", batch_size, 1)
    checks.check_int("seed", seed, 0, _MAX_SEED - 1)
    checks.check_int("limit", limit, 1, none_ok=True)
    checks.check_bool("training", training, none_ok=True)
    checks.check_bool("augment", augment, none_ok=True)
    training = split == "train" if training is None else training
    augment = training if augment is None else augment
    examples, size = _source(info, split, data_dir, download, limit)
    batches = _pass(examples, size, info, batch_size, seed, training, augment)
    return batches.prefetch(tf.data.AUTOTUNE)


def _source(info, split, data_dir, download, limit):
    """The split's raw examples (the first `limit`) and how many there are."""
    if info.input_kind == "text":
        inputs, labels = _text_arrays(info, split, data_dir, download)
        inputs, labels = inputs[:limit], labels[:limit]
        return tf.data.Dataset.from_tensor_slices((inputs, labels)), len(labels)
    if info.source == "sklearn":
        _check_bundled(data_dir, download)
        examples = _digits_source(split)
    else:
        examples = _tfds_source(info.name, split, data_dir, download)
    if limit is not None:
        examples = examples.take(limit)
    return examples, split_size(info.name, split, data_dir, limit)


def _pass(examples, size, info, batch_size, seed, shuffle, augment, rerandomize=True):
    """One pass over `examples`: shuffled, augmented and normalised (images), batched."""
    if shuffle:
        examples = examples.shuffle(size, seed=seed, reshuffle_each_iteration=rerandomize)
    if info.input_kind == "image":
        examples = examples.map(transforms.to_unit_rgb32, num_parallel_calls=tf.data.AUTOTUNE)
        if augment:
            examples = transforms.with_augmentation(examples, info.name, seed, rerandomize)
        examples = transforms.normalised(examples, info.name)
    return examples.batch(batch_size, drop_remainder=False)


def epoch_seed(seed, epoch):
    """The shuffle and augmentation seed of training epoch `epoch` of a run seeded `seed`.

    A pure function of both: the order of any epoch can be rebuilt from the run's seed
    and the epoch number alone (what checkpoints keep to resume exactly).

    Args:
        seed: the run's seed, an int in [0, 2**62).
        epoch: the epoch, an int >= 0.

    Returns:
        An int in [0, 2**62).

    Raises:
        TypeError: if an argument is not an int.
        ValueError: if it is out of range.
    """
    checks.check_int("seed", seed, 0, _MAX_SEED - 1)
    checks.check_int("epoch", epoch, 0)
    state = np.random.SeedSequence([int(seed), int(epoch)]).generate_state(2, np.uint32)
    return (int(state[0]) << 30 | int(state[1]) >> 2) % _MAX_SEED


def steps_per_epoch(name, batch_size, limit=None, data_dir=None):
    """Returns the number of mini-batches in one training epoch (the last may be smaller).

    Args:
        name: a dataset name, one of `dataset_names()`.
        batch_size: examples per batch, an int >= 1.
        limit: None, or an int >= 1: only the first `limit` training examples.
        data_dir: the tensorflow-datasets data directory the set is read from (its
            prepared training split may hold another number of examples than the
            catalog's, see `split_size`); None means tfds' default.

    Returns:
        `ceil(examples / batch_size)`, an int.

    Raises:
        ValueError: for an unknown `name`, or `batch_size` or `limit` out of range.
        TypeError: if `batch_size` or `limit` is not an int (or None for `limit`).
    """
    checks.check_int("batch_size", batch_size, 1)
    checks.check_int("limit", limit, 1, none_ok=True)
    return -(-split_size(name, "train", data_dir, limit) // batch_size)


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
    would have seen. Pass `steps_per_epoch(name, batch_size, limit, data_dir)` to `fit`, as the
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
        augment: apply the random crop (and flip), as for `load` (ignored for text sets).

    Returns:
        A finite `tf.data.Dataset` of `(images, labels)` (or `(tokens, labels)`) batches,
        prefetched.

    Raises:
        ValueError, TypeError, DatasetNotFoundError: for bad arguments, as for `load`.
    """
    info = get_info(name)
    checks.check_int("batch_size", batch_size, 1)
    checks.check_int("seed", seed, 0, _MAX_SEED - 1)
    checks.check_int("limit", limit, 1, none_ok=True)
    checks.check_int("start_epoch", start_epoch, 0)
    checks.check_int("epochs", epochs, start_epoch + 1)
    per_epoch = steps_per_epoch(name, batch_size, limit, data_dir)
    checks.check_int("skip_batches", skip_batches, 0, per_epoch - 1)
    checks.check_bool("augment", augment)
    examples, size = _source(info, "train", data_dir, download, limit)
    dataset = None
    for epoch in range(start_epoch, epochs):
        one = _pass(
            examples, size, info, batch_size, epoch_seed(seed, epoch), True, augment,
            rerandomize=False,
        )
        if epoch == start_epoch and skip_batches:
            one = one.skip(skip_batches)
        dataset = one if dataset is None else dataset.concatenate(one)
    return dataset.prefetch(tf.data.AUTOTUNE)


def load_arrays(name, split, *, data_dir=None, download=False, limit=None):
    """Returns a whole split as normalised NumPy arrays, in order, without augmentation.

    Meant for small sets and tests: a full CIFAR training split takes about 600 MB. A text
    set gives its token ids and labels (read-only arrays, see `load`).

    Args:
        name: a dataset name, one of `dataset_names()`.
        split: `"train"` or `"test"`.
        data_dir: tensorflow-datasets data directory, as for `load`.
        download: allow downloading, as for `load`.
        limit: None, or an int >= 1: only the first `limit` examples.

    Returns:
        `(x, y)`: float32 `[N, 32, 32, 3]` images and int32 `[N]` labels; for a text set
        int32 token ids `[N, seq_len]` and labels `[N]` (or `[N, seq_len]`).

    Raises:
        ValueError, TypeError, DatasetNotFoundError: as for `load`.
    """
    info = get_info(name)
    check_split(split)
    checks.check_int("limit", limit, 1, none_ok=True)
    if info.input_kind == "text":
        inputs, labels = _text_arrays(info, split, data_dir, download)
        return inputs[:limit], labels[:limit]
    if info.source == "sklearn":
        _check_bundled(data_dir, download)
        images, labels = transforms.digits_arrays()[0][split]
        mean, std = transforms.stats(name)
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
    xs, ys = zip(*batches.as_numpy_iterator(), strict=True)
    return np.concatenate(xs), np.concatenate(ys)
