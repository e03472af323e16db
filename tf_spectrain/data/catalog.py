"""Which datasets there are, what they hold, and whether one can be read here.

The names, each dataset's `DatasetInfo` (images or token sequences, what the labels are,
and what a text model needs to know), the normalisation constants and which sets may be
mirrored, and the offline availability check: `dataset_names`, `get_info` and
`check_available` run no TensorFlow op (this module does not even import TensorFlow), so
they are safe to call before the program has set up its devices.
"""

import dataclasses
import functools
import json
import os
import re

from tf_spectrain import checks
from tf_spectrain.data import pydoc_corpus
from tf_spectrain.messages import did_you_mean

IMAGE_SIZE = 32
DIGITS_TEST_SIZE = 360
PYDOC_SEQ_LEN = 128  # bytes per `pydoc` example
PYDOC_WORDS_SEQ_LEN = 64  # tokens per `pydoc_words` example
IMDB_SEQ_LEN = 256  # tokens per review: longer ones are cut, shorter ones padded with 0
IMDB_VOCAB_SIZE = 20_000  # token ids of `imdb_reviews`: 0 padding, 1 unknown, 19,998 words
TASKS = ("classification", "language_model")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is not prepared on disk and downloading was not allowed."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset.

    Image sets yield float32 images and one int32 class per image. Text sets yield int32
    token ids `[seq_len]` (ids `0 .. vocab_size - 1`); their labels are one class per
    sequence (`task="classification"`) or, for language modelling, the next token at
    every position (`task="language_model"`: labels `[seq_len]`, `num_classes` equal to
    `vocab_size`).

    Attributes:
        name: the dataset name, one of `dataset_names()`.
        num_classes: the number of classes; labels are `0..num_classes-1`.
        input_shape: the shape of one example as `load` yields it: `(32, 32, 3)` for the
            image sets, `(seq_len,)` for the text sets.
        num_train: the number of training examples.
        num_test: the number of test examples.
        source: `"sklearn"` or `"embedded"` (bundled with scikit-learn or Python, always
            available) or `"tfds"` (tensorflow-datasets, prepared in a data dir).
        task: `"classification"` or `"language_model"`.
        vocab_size: the number of token ids of a text set; None for an image set.
    """

    name: str
    num_classes: int
    input_shape: tuple
    num_train: int
    num_test: int
    source: str
    task: str = "classification"
    vocab_size: int | None = None

    @property
    def input_kind(self):
        """`"text"` (token ids) or `"image"`."""
        return "image" if self.vocab_size is None else "text"

    @property
    def input_dtype(self):
        """The dtype of the examples: `"float32"` (images) or `"int32"` (token ids)."""
        return "float32" if self.vocab_size is None else "int32"

    @property
    def image_shape(self):
        """The shape of one image, `(32, 32, 3)`; None for a text set."""
        return self.input_shape if self.vocab_size is None else None

    @property
    def seq_len(self):
        """Tokens per example of a text set; None for an image set."""
        return None if self.vocab_size is None else self.input_shape[0]

    @property
    def label_shape(self):
        """The shape of one example's labels: `()`, or `(seq_len,)` for language modelling."""
        return self.input_shape if self.task == "language_model" else ()

    def model_options(self):
        """Returns the keyword options a model of the zoo needs for this dataset.

        Build a model for the dataset with
        `models.get_model(name, info.input_shape, info.num_classes, **info.model_options())`.
        A text classifier needs the size of its token embedding, `vocab_size`; a language
        model reads and predicts the same tokens, so `num_classes` (= `vocab_size`) tells it
        both; image models need nothing more.

        Returns:
            `{"vocab_size": vocab_size}` for a text classification set, else `{}`.
        """
        if self.input_kind == "text" and self.task == "classification":
            return {"vocab_size": self.vocab_size}
        return {}


def _info(name, num_classes, num_train, num_test, source):
    """A `DatasetInfo` with the common image shape."""
    shape = (IMAGE_SIZE, IMAGE_SIZE, 3)
    return DatasetInfo(name, num_classes, shape, num_train, num_test, source)


_INFOS = {
    "cifar10": _info("cifar10", 10, 50_000, 10_000, "tfds"),
    "cifar100": _info("cifar100", 100, 50_000, 10_000, "tfds"),
    "digits": _info("digits", 10, 1_797 - DIGITS_TEST_SIZE, DIGITS_TEST_SIZE, "sklearn"),
    "fashion_mnist": _info("fashion_mnist", 10, 60_000, 10_000, "tfds"),
    "imdb_reviews": DatasetInfo(
        "imdb_reviews", 2, (IMDB_SEQ_LEN,), 25_000, 25_000, "tfds",
        vocab_size=IMDB_VOCAB_SIZE,
    ),
    "mnist": _info("mnist", 10, 60_000, 10_000, "tfds"),
}

# The `pydoc` sets: their level and example length; their counts come from the text.
PYDOC_SETS = {"pydoc": ("bytes", PYDOC_SEQ_LEN), "pydoc_words": ("words", PYDOC_WORDS_SEQ_LEN)}

# tensorflow-datasets sets read in a builder config: prepared in `<data_dir>/<name>/<config>`.
TFDS_CONFIGS = {"imdb_reviews": "plain_text"}


@functools.lru_cache(maxsize=None)
def _pydoc_info(name):
    """The `DatasetInfo` of a `pydoc` set, counted from Python's own text."""
    level, seq_len = PYDOC_SETS[name]
    counts = [
        pydoc_corpus.num_windows(len(pydoc_corpus.token_ids(level, split)), seq_len)
        for split in ("train", "test")
    ]
    vocab = pydoc_corpus.vocab_size(level)
    return DatasetInfo(name, vocab, (seq_len,), *counts, "embedded", "language_model", vocab)

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
    if isinstance(name, str) and (name in _INFOS or name in PYDOC_SETS):
        return name
    message = f"`dataset` must be one of {dataset_names()}. Received: dataset={name!r}"
    hint = did_you_mean(name, dataset_names(), ignore_case=True, cutoff=0.5)
    raise ValueError(f"{message}{hint or '.'}")


def check_split(split):
    """Raises ValueError unless `split` is `"train"` or `"test"`."""
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
        A list of str: `['cifar10', 'cifar100', 'digits', 'fashion_mnist', 'imdb_reviews',
        'mnist', 'pydoc', 'pydoc_words']`.
    """
    return sorted([*_INFOS, *PYDOC_SETS])


def get_info(name):
    """The `DatasetInfo` of dataset `name` (ValueError for an unknown one). Runs no TF op."""
    name = _check_name(name)
    return _pydoc_info(name) if name in PYDOC_SETS else _INFOS[name]


def check_available(name, data_dir=None, download=False):
    """Checks, without TensorFlow or network, that `load` can read dataset `name`.

    A tensorflow-datasets set is available when prepared on disk (some
    `<data_dir>/<name>[/<config>]/<version>/dataset_info.json`) or when `download=True`;
    `digits`, `pydoc` and `pydoc_words` always are. `data_dir` None means tfds' default
    (`$TFDS_DATA_DIR`, else `~/tensorflow_datasets`).

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


def tfds_name(name, version=None):
    """The name tensorflow-datasets knows set `name` by (`"imdb_reviews/plain_text"`), with
    `":<version>"` when `version` is given."""
    full = f"{name}/{TFDS_CONFIGS[name]}" if name in TFDS_CONFIGS else name
    return full if version is None else f"{full}:{version}"


def _how_to_prepare(name):
    """The sentence saying how to get dataset `name` onto this machine."""
    return (
        f"To get it, run `python train.py --dataset {name} --download --data-dir DIR` "
        f"(or `tfds build {name} --data_dir DIR`) on a machine with network access, copy "
        "DIR to this machine and pass it as `data_dir` (`--data-dir DIR`); or pass "
        "`download=True` (`--download`) if this machine can reach the network."
    )


def _dataset_folder(root, name):
    """The folder of tfds dataset `name` under `root`, and its prepared versions."""
    folder = os.path.join(root, *tfds_name(name).split("/"))
    return folder, _prepared_versions(folder)


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
        A version string such as `"3.0.2"`, or None when nothing needs to be on disk: a
        bundled set (`digits`, `pydoc`, `pydoc_words`), or `download=True`.

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
    folder, versions = _dataset_folder(root, name)
    if not versions:
        raise DatasetNotFoundError(
            f"Dataset {name!r} is not prepared in {which} {root!r}: no "
            f"{os.path.join(folder, '<version>', 'dataset_info.json')!r} was found, and "
            f"download=False so nothing is downloaded. {_how_to_prepare(name)}"
        )
    return versions[-1]


def split_size(name, split, data_dir=None, limit=None):
    """Returns the number of examples in a split as it is on disk, without TensorFlow.

    For a tensorflow-datasets set prepared in `data_dir` the size its newest prepared
    version records (`dataset_info.json`: the shard lengths of the split), which may
    differ from the catalog's when the set was prepared from other files (e.g. by
    `benchmarks/prepare_imdb.py`); otherwise, or when that file does not record it, the
    catalog's `num_train` / `num_test`.

    Args:
        name: a dataset name, one of `dataset_names()`.
        split: `"train"` or `"test"`.
        data_dir: the tensorflow-datasets data directory; None means tfds' default.
        limit: None, or an int >= 1: count only the first `limit` examples, as the
            loaders' `limit` reads them.

    Returns:
        An int >= 0.

    Raises:
        ValueError: for an unknown `name` or `split`, or `limit` < 1.
        TypeError: if `data_dir` is not a path or `limit` not an int (or None).
    """
    info = get_info(name)
    check_split(split)
    data_dir = check_data_dir(data_dir)
    checks.check_int("limit", limit, 1, none_ok=True)
    size = info.num_train if split == "train" else info.num_test
    if info.source == "tfds":
        root = default_data_dir() if data_dir is None else data_dir
        folder, versions = _dataset_folder(root, name)
        if versions:
            info_file = os.path.join(folder, versions[-1], "dataset_info.json")
            size = _recorded_size(info_file, split, size)
    return size if limit is None else min(limit, size)


def _recorded_size(path, split, default):
    """The example count of `split` in a tfds `dataset_info.json`, else `default`."""
    try:
        with open(path, encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        lengths = next(s["shardLengths"] for s in splits if s.get("name") == split)
        return sum(int(n) for n in lengths)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, StopIteration):
        return default
