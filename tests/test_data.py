"""Tests for the `tf_spectrain.data` package as a whole: every public name is exported, and
the table in its docstring says what the catalog says.

The modules are tested in test_catalog.py, test_transforms.py and test_loaders.py.
"""

import re

from tf_spectrain import data

# What `tf_spectrain.data` exported as a single module (the README, the command line, the
# benchmarks and the tests use these names).
PUBLIC = [
    "IMAGE_SIZE", "DatasetInfo", "DatasetNotFoundError", "check_available", "dataset_names",
    "epoch_seed", "get_info", "load", "load_arrays", "load_epochs", "split_size", "steps_per_epoch",
    "imdb_vectorizer",
]


def test_every_public_name_is_exported():
    for name in PUBLIC:
        assert hasattr(data, name), name
    assert sorted(data.__all__) == sorted(PUBLIC)
    assert data.load is data.loaders.load
    assert data.get_info is data.catalog.get_info
    assert issubclass(data.DatasetNotFoundError, FileNotFoundError)


def test_docstring_table_matches_the_catalog():
    rows = re.findall(r"^\| `(\w+)` +\| (\d+) +\| ([\d,]+) +\| ([\d,]+) +\| (.+?) +\|$",
                      data.__doc__, flags=re.M)
    images = [name for name in data.dataset_names() if data.get_info(name).input_kind == "image"]
    assert sorted(row[0] for row in rows) == images
    for name, classes, train, test, source in rows:
        info = data.get_info(name)
        assert (info.num_classes, info.num_train, info.num_test) == (
            int(classes), int(train.replace(",", "")), int(test.replace(",", ""))
        )
        assert source.startswith("scikit-learn" if info.source == "sklearn" else "tensorflow")


def test_docstring_text_table_matches_the_catalog():
    rows = re.findall(r"^\| `(\w+)` +\| [^|]+\| ([\d,]+) +\| (\d+) +\| ~?([\d,]+) +\| "
                      r"~?([\d,]+) +\| [^|]+\|$", data.__doc__, flags=re.M)
    texts = [name for name in data.dataset_names() if data.get_info(name).input_kind == "text"]
    assert sorted(row[0] for row in rows) == texts
    for name, vocab, seq_len, train, test in rows:
        info = data.get_info(name)
        assert (info.vocab_size, info.seq_len) == (int(vocab.replace(",", "")), int(seq_len))
        # The pydoc counts ("~") are Python 3.11's; the text changes a little with versions.
        for count, documented in ((info.num_train, train), (info.num_test, test)):
            assert abs(count - int(documented.replace(",", ""))) <= 0.1 * count
