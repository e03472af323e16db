"""Which datasets there are, what they hold, and whether one can be read here.

The names, each dataset's `DatasetInfo`, the normalisation constants and which sets may be
mirrored, and the offline availability check: `dataset_names`, `get_info` and
`check_available` run no TensorFlow op (this module does not even import TensorFlow), so
they are safe to call before the program has set up its devices.
"""

import dataclasses
import os
import re

from tf_spectrain import checks
from tf_spectrain.messages import did_you_mean

IMAGE_SIZE = 32
DIGITS_TEST_SIZE = 360
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
    """A `DatasetInfo` with the common image shape."""
    shape = (IMAGE_SIZE, IMAGE_SIZE, 3)
    return DatasetInfo(name, num_classes, shape, num_train, num_test, source)


_INFOS = {
    "cifar10": _info("cifar10", 10, 50_000, 10_000, "tfds"),
    "cifar100": _info("cifar100", 100, 50_000, 10_000, "tfds"),
    "digits": _info("digits", 10, 1_797 - DIGITS_TEST_SIZE, DIGITS_TEST_SIZE, "sklearn"),
    "fashion_mnist": _info("fashion_mnist", 10, 60_000, 10_000, "tfds"),
    "mnist": _info("mnist", 10, 60_000, 10_000, "tfds"),
}

# Per-channel (mean, std) of the training images scaled to [0, 1]; digits: computed from
# its own training split (see `transforms.digits_arrays`).
KNOWN_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,) * 3, (0.3081,) * 3),
    "fashion_mnist": ((0.2860,) * 3, (0.3530,) * 3),
}

# Datasets whose mirror images belong to the same class: only these are flipped.
FLIP_INVARIANT = frozenset({"cifar10", "cifar100", "fashion_mnist"})


# ---------------------------------------------------------------------------------------
# Argument checks shared by the loaders.


def _check_name(name):
    """`name` is a known dataset (a "did you mean" for a near miss)."""
    if isinstance(name, str) and name in _INFOS:
        return name
    message = f"`dataset` must be one of {dataset_names()}. Received: dataset={name!r}"
    hint = did_you_mean(name, dataset_names(), ignore_case=True, cutoff=0.5)
    raise ValueError(f"{message}{hint or '.'}")


def check_split(split):
    """Checks that `split` is `"train"` or `"test"`.

    Args:
        split: the value to check.

    Raises:
        ValueError: for anything else.
    """
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")


def check_data_dir(data_dir):
    """Checks that `data_dir` is None or a path.

    Args:
        data_dir: the value to check.

    Returns:
        `data_dir` as a str, or None.

    Raises:
        TypeError: if it is neither a path (str or `os.PathLike`) nor None.
    """
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
    prepared_version(name, data_dir, download)


def default_data_dir():
    """Returns tensorflow-datasets' default data directory, without importing tfds.

    Returns:
        `$TFDS_DATA_DIR` if set, else `~/tensorflow_datasets` (tfds' own rule).
    """
    default = os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
    return os.environ.get("TFDS_DATA_DIR", default)


def _how_to_prepare(name):
    """The sentence saying how to get dataset `name` onto this machine."""
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


def prepared_version(name, data_dir, download):
    """Checks that a dataset can be read; returns the newest prepared version to read.

    Args:
        name, data_dir, download: as for `check_available`.

    Returns:
        A version string such as `"3.0.2"`, or None when nothing needs to be on disk:
        `digits`, or `download=True`.

    Raises:
        ValueError, TypeError, DatasetNotFoundError: as `check_available`.
    """
    info = get_info(name)
    data_dir = check_data_dir(data_dir)
    checks.check_bool("download", download)
    if info.source != "tfds" or download:
        return None
    root = default_data_dir() if data_dir is None else data_dir
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
