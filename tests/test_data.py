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
    "epoch_seed", "get_info", "load", "load_arrays", "load_epochs", "steps_per_epoch",
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
    assert sorted(row[0] for row in rows) == data.dataset_names()
    for name, classes, train, test, source in rows:
        info = data.get_info(name)
        assert (info.num_classes, info.num_train, info.num_test) == (
            int(classes), int(train.replace(",", "")), int(test.replace(",", ""))
        )
        assert source.startswith("scikit-learn" if info.source == "sklearn" else "tensorflow")
