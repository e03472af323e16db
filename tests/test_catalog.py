"""Tests of `tf_spectrain.data.catalog`: names, `DatasetInfo`, and the offline check that
a dataset can be read (missing or empty data dirs fail at once and explain how to get the
data). Nothing here touches the network."""

import ast
import pathlib
import tempfile
import time

import pytest
import tensorflow_datasets as tfds
from data_reference import TFDS_NAMES, make_layout

from tf_spectrain import data
from tf_spectrain.data import catalog


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    # tfds leaves an empty `tmp*tfds` folder behind whenever it builds a DatasetInfo for
    # unprepared data; keep those inside pytest's own temporary folder.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


# ---------------------------------------------------------------------------------------
# Names and info.


IMAGE_NAMES = ["cifar10", "cifar100", "digits", "fashion_mnist", "mnist"]
TEXT_NAMES = ["imdb_reviews", "pydoc", "pydoc_words"]  # tested in test_text_data.py


def test_dataset_names_and_info():
    names = data.dataset_names()
    assert names == sorted(IMAGE_NAMES + TEXT_NAMES)
    for name in IMAGE_NAMES:
        info = data.get_info(name)
        assert info.name == name
        assert info.image_shape == info.input_shape == (32, 32, 3)
        assert (info.input_kind, info.input_dtype, info.task) == ("image", "float32",
                                                                  "classification")
        assert info.vocab_size is None and info.label_shape == ()
        assert info.model_options() == {}
        assert info.source == ("sklearn" if name == "digits" else "tfds")
    with pytest.raises(AttributeError):
        data.get_info("mnist").num_classes = 3  # frozen


@pytest.mark.parametrize("name", TFDS_NAMES)
def test_num_classes_agree_with_tfds(name, tmp_path):
    # tfds describes its datasets in code: no data and no network needed.
    with tfds.testing.disable_gcs_access():
        builder_info = tfds.builder(name, data_dir=str(tmp_path)).info
    assert data.get_info(name).num_classes == builder_info.features["label"].num_classes


@pytest.mark.parametrize(
    "bad, hint",
    [
        ("cifar", "did you mean 'cifar10'?"),
        ("Mnist", "did you mean 'mnist'?"),
        ("fashion-mnist", "did you mean 'fashion_mnist'?"),
        ("cifar-100", "did you mean 'cifar100'?"),
        ("imagenet", "Received: dataset='imagenet'."),
        (None, "Received: dataset=None."),
    ],
)
def test_unknown_dataset_names_are_explained(bad, hint):
    for call in (data.get_info, data.check_available):
        with pytest.raises(ValueError) as error:
            call(bad)
        assert str(error.value).startswith(f"`dataset` must be one of {data.dataset_names()}")
        assert hint in str(error.value)
    with pytest.raises(ValueError, match="must be one of"):
        data.load(bad, "train", 8)


# ---------------------------------------------------------------------------------------
# Missing data: fail at once, explain how to get the data.


@pytest.mark.parametrize(
    "files, available",
    [
        ([], False),
        (["cifar10/3.0.2/dataset_info.json"], True),
        (["cifar10/1.0.0/dataset_info.json"], True),  # any version
        (["cifar10/3.0.2/"], False),
        (["cifar10/3.0.2/features.json"], False),
        (["cifar10/incomplete.x1y2_3.0.2/dataset_info.json"], False),  # interrupted build
        (["cifar100/3.0.2/dataset_info.json"], False),  # another dataset
        (["cifar10/dataset_info.json"], False),  # no version folder
    ],
)
def test_check_available_looks_for_prepared_files(files, available, tmp_path):
    make_layout(tmp_path, files)
    if available:
        assert data.check_available("cifar10", data_dir=tmp_path) is None
    else:
        with pytest.raises(data.DatasetNotFoundError):
            data.check_available("cifar10", data_dir=tmp_path)


def test_digits_and_download_need_no_prepared_files(tmp_path):
    missing = tmp_path / "missing"
    data.check_available("digits", data_dir=missing)
    data.check_available("cifar10", data_dir=missing, download=True)
    assert not missing.exists()


@pytest.mark.parametrize("which", ["missing", "empty"])
@pytest.mark.parametrize("call", ["check_available", "load", "load_arrays"])
def test_unprepared_dataset_fails_fast_and_explains(which, call, tmp_path):
    data_dir = tmp_path / which
    if which == "empty":
        data_dir.mkdir()
    run = {
        "check_available": lambda: data.check_available("cifar10", data_dir=data_dir),
        "load": lambda: data.load("cifar10", "train", 8, data_dir=data_dir),
        "load_arrays": lambda: data.load_arrays("cifar10", "test", data_dir=str(data_dir)),
    }[call]
    start = time.perf_counter()
    with pytest.raises(data.DatasetNotFoundError) as error:
        run()
    assert time.perf_counter() - start < 5
    assert isinstance(error.value, FileNotFoundError)
    message = str(error.value)
    assert "'cifar10'" in message and repr(str(data_dir)) in message
    assert "python train.py --dataset cifar10 --download --data-dir DIR" in message
    assert ("does not exist" in message) == (which == "missing")


def test_default_data_dir_is_checked_too(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "nowhere"))
    start = time.perf_counter()
    with pytest.raises(data.DatasetNotFoundError, match="default tensorflow-datasets") as error:
        data.load("mnist", "test", 8)
    assert time.perf_counter() - start < 5
    assert str(tmp_path / "nowhere") in str(error.value)


# That the metadata calls run no TensorFlow op (so that a program can still split its
# devices after them) is checked in test_devices.py's fresh process, before it splits the CPU.


def test_catalog_does_not_import_tensorflow():
    tree = ast.parse(pathlib.Path(catalog.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "os" in imported and not imported & {"tensorflow", "tensorflow_datasets", "numpy"}
