"""Tests of `tf_spectrain.data.loaders`: argument checks, order, limits, shuffling per seed,
epochs rebuilt from `(seed, epoch)`, and a really prepared data dir (built offline from
tfds' own `DummyMnist` test builder) read with `download=False`. Nothing here touches the
network."""

import json
import shutil
import tempfile
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds
from data_reference import epoch, expected_tfds_images, sorted_rows, two_epochs

from tf_spectrain import data


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    # tfds leaves an empty `tmp*tfds` folder behind whenever it builds a DatasetInfo for
    # unprepared data; keep those inside pytest's own temporary folder.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


# ---------------------------------------------------------------------------------------
# Argument checks.


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"split": "val"}, ValueError, "`split` must be 'train' or 'test'. Received: split='val'"),
        ({"split": None}, ValueError, "Received: split=None"),
        ({"batch_size": 0}, ValueError, "`batch_size` must be an integer >= 1. Received: "),
        ({"batch_size": -2}, ValueError, "batch_size=-2"),
        ({"batch_size": 2.5}, TypeError, "batch_size=2.5"),
        ({"batch_size": True}, TypeError, "batch_size=True"),
        ({"batch_size": "8"}, TypeError, "batch_size='8'"),
        ({"limit": 0}, ValueError, "`limit` must be an integer >= 1 or None. Received: limit=0"),
        ({"limit": -5}, ValueError, "limit=-5"),
        ({"limit": 1.5}, TypeError, "limit=1.5"),
        ({"seed": -1}, ValueError, "`seed` must be an integer in [0, 4611686018427387903]"),
        ({"seed": 2**62}, ValueError, "Received: seed=4611686018427387904"),
        ({"seed": "0"}, TypeError, "seed='0'"),
        ({"training": "yes"}, TypeError, "`training` must be True, False or None. Received: "),
        ({"training": "yes"}, TypeError, "Received: training='yes'"),
        ({"augment": 1}, TypeError, "augment=1"),
        ({"download": None}, TypeError, "`download` must be True or False. Received: download="),
        ({"data_dir": 3}, TypeError, "`data_dir` must be a path"),
    ],
)
@pytest.mark.parametrize("name", ["digits", "cifar10"])
def test_bad_arguments_are_explained(name, kwargs, error, fragment, tmp_path):
    # For cifar10 the data dir is missing, yet the bad argument is what gets reported.
    args = {"split": "train", "batch_size": 8, "data_dir": str(tmp_path / "missing")}
    args.update(kwargs)
    with pytest.raises(error) as raised:
        data.load(name, args.pop("split"), args.pop("batch_size"), **args)
    assert fragment in str(raised.value)


def test_load_arrays_checks_its_arguments():
    with pytest.raises(ValueError, match="Received: split='valid'"):
        data.load_arrays("digits", "valid")
    with pytest.raises(ValueError, match="Received: limit=0"):
        data.load_arrays("digits", "train", limit=0)


# ---------------------------------------------------------------------------------------
# digits: order, limits, shuffling.


@pytest.fixture(scope="module")
def digits_arrays():
    return {split: data.load_arrays("digits", split) for split in ("train", "test")}


def test_digits_split_does_not_depend_on_seed(digits_arrays):
    for seed in (0, 123):
        # `load` normalises in TensorFlow, `load_arrays` in NumPy: compared to 1e-6.
        x_test, y_test = epoch(data.load("digits", "test", 100, seed=seed))
        np.testing.assert_allclose(x_test, digits_arrays["test"][0], atol=1e-6)
        np.testing.assert_array_equal(y_test, digits_arrays["test"][1])
        x_train, _ = epoch(data.load("digits", "train", 500, seed=seed, augment=False))
        np.testing.assert_allclose(
            sorted_rows(x_train), sorted_rows(digits_arrays["train"][0]), atol=1e-6
        )


def test_test_split_is_ordered_unaugmented_and_keeps_the_last_batch():
    dataset = data.load("digits", "test", 64)
    sizes = [len(y) for _, y in dataset]
    assert sizes == [64] * 5 + [40]
    x_first, y_first = epoch(dataset)
    x_again, y_again = epoch(dataset)
    x_arrays, y_arrays = data.load_arrays("digits", "test")
    np.testing.assert_allclose(x_first, x_arrays, atol=1e-6)
    np.testing.assert_array_equal(y_first, y_arrays)
    np.testing.assert_array_equal(x_first, x_again)
    np.testing.assert_array_equal(y_first, y_again)


def test_limit_takes_the_first_examples():
    x_all, y_all = data.load_arrays("digits", "train")
    x_few, y_few = data.load_arrays("digits", "train", limit=10)
    np.testing.assert_array_equal(x_few, x_all[:10])
    np.testing.assert_array_equal(y_few, y_all[:10])
    x_shuffled, _ = epoch(data.load("digits", "train", 4, limit=10, augment=False))
    np.testing.assert_allclose(sorted_rows(x_shuffled), sorted_rows(x_few), atol=1e-6)


def test_shuffling_is_deterministic_per_seed_and_new_each_epoch():
    (x1, y1), (x2, y2) = two_epochs(seed=3, augment=False)
    (x1_again, _), (x2_again, _) = two_epochs(seed=3, augment=False)
    (x1_other, _), _ = two_epochs(seed=4, augment=False)
    np.testing.assert_array_equal(x1, x1_again)
    np.testing.assert_array_equal(x2, x2_again)
    assert not np.array_equal(x1, x2), "each pass must be reshuffled"
    assert not np.array_equal(x1, x1_other), "another seed must give another order"
    # Every epoch is a permutation of the first 48 examples, labels kept with images.
    x_ref, y_ref = data.load_arrays("digits", "train", limit=48)
    for x, y in ((x1, y1), (x2, y2)):
        np.testing.assert_allclose(sorted_rows(x), sorted_rows(x_ref), atol=1e-6)
        for image, label in zip(x, y, strict=True):
            assert label == y_ref[np.argmin(np.abs(x_ref - image).sum(axis=(1, 2, 3)))]


def test_training_false_means_no_shuffle_on_train_split():
    x, _ = epoch(data.load("digits", "train", 16, limit=32, training=False))
    np.testing.assert_allclose(x, data.load_arrays("digits", "train", limit=32)[0], atol=1e-6)


# ---------------------------------------------------------------------------------------
# tensorflow-datasets sets, mocked: random examples, downloading mocked as a no-op.


def test_mocked_cifar100_labels_use_100_classes():
    with tfds.testing.mock_data(num_examples=64):
        _, y = data.load_arrays("cifar100", "train", download=True)
    assert y.shape == (64,) and y.max() < 100 and y.max() >= 10


def test_mocked_training_split_is_shuffled():
    with tfds.testing.mock_data(num_examples=32):
        kwargs = dict(seed=0, name="cifar10", limit=None, download=True)
        (x_train, _), _ = two_epochs(augment=False, **kwargs)
        x_test, _ = data.load_arrays("cifar10", "test", download=True)
    assert not np.array_equal(x_train, x_test)  # the mock serves the same examples to both
    np.testing.assert_array_equal(sorted_rows(x_train), sorted_rows(x_test))


# ---------------------------------------------------------------------------------------
# A really prepared data dir, read offline with download=False.


@pytest.fixture(scope="module")
def prepared_mnist_dir(tmp_path_factory):
    """A data dir holding a prepared 'mnist' (20 examples per split), built offline.

    tfds' own test builder `DummyMnist` has mnist's features; its prepared files are
    renamed to mnist's layout `<dir>/mnist/3.0.1/`. Also returns its raw test examples.
    """
    root = tmp_path_factory.mktemp("tfds")
    scratch = tmp_path_factory.mktemp("scratch")
    with tfds.testing.disable_gcs_access(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(scratch))
        builder = tfds.testing.DummyMnist(data_dir=str(root))
        builder.download_and_prepare()  # generates its examples locally
    examples = list(builder.as_dataset(split="test", shuffle_files=False))
    raw_x = np.stack([ex["image"].numpy() for ex in examples])
    raw_y = np.array([ex["label"].numpy() for ex in examples])
    source = root / "dummy_mnist" / str(builder.version)
    target = root / "mnist" / str(builder.version)
    target.parent.mkdir()
    shutil.move(str(source), str(target))
    for path in target.iterdir():
        if path.name.startswith("dummy_mnist-"):
            path.rename(target / path.name.replace("dummy_mnist-", "mnist-"))
    info_path = target / "dataset_info.json"
    info = json.loads(info_path.read_text())
    info["name"] = "mnist"
    info_path.write_text(json.dumps(info))
    shutil.rmtree(root / "dummy_mnist")
    return str(root), raw_x, raw_y


def test_prepared_data_dir_loads_offline(prepared_mnist_dir):
    root, raw_x, raw_y = prepared_mnist_dir
    data.check_available("mnist", data_dir=root)
    start = time.perf_counter()
    x, y = data.load_arrays("mnist", "test", data_dir=root)
    assert time.perf_counter() - start < 10
    np.testing.assert_allclose(x, expected_tfds_images("mnist", raw_x), atol=1e-5)
    np.testing.assert_array_equal(y, raw_y)
    x_train, y_train = epoch(data.load("mnist", "train", 8, data_dir=root, seed=1))
    assert x_train.shape == (20, 32, 32, 3) and y_train.dtype == np.int32
    # Another dataset in the same dir is not prepared.
    with pytest.raises(data.DatasetNotFoundError, match="'cifar10' is not prepared"):
        data.load("cifar10", "train", 8, data_dir=root)


# ---------------------------------------------------------------------------------------
# Epochs rebuilt from (seed, epoch): what resuming relies on.


def test_epoch_seed_is_a_pure_function_of_seed_and_epoch():
    seeds = {(s, e): data.epoch_seed(s, e) for s in (0, 1, 2**62 - 1) for e in (0, 1, 7)}
    assert len(set(seeds.values())) == len(seeds)  # every (seed, epoch) its own order
    assert all(0 <= v < 2**62 for v in seeds.values())
    assert data.epoch_seed(1, 7) == seeds[(1, 7)]
    assert data.epoch_seed(np.int64(1), np.int64(7)) == seeds[(1, 7)]


@pytest.mark.parametrize(
    "seed, epoch, error, message",
    [
        (-1, 0, ValueError, "`seed` must be an integer in [0, 4611686018427387903]. Received: "
                            "seed=-1"),
        (2**62, 0, ValueError, "Received: seed=4611686018427387904"),
        (0, -1, ValueError, "`epoch` must be an integer >= 0. Received: epoch=-1"),
        (0.0, 0, TypeError, "Received: seed=0.0 of type float"),
        (0, True, TypeError, "Received: epoch=True of type bool"),
    ],
)
def test_epoch_seed_checks_its_arguments(seed, epoch, error, message):
    with pytest.raises(error) as raised:
        data.epoch_seed(seed, epoch)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "batch_size, limit, expected", [(32, None, 45), (1437, None, 1), (16, 40, 3), (8, 40, 5)]
)
def test_steps_per_epoch_counts_the_last_partial_batch(batch_size, limit, expected):
    assert data.steps_per_epoch("digits", batch_size, limit) == expected  # 1,437 images


def batches(dataset):
    return [(x.numpy(), y.numpy()) for x, y in dataset]


def test_load_epochs_rebuilds_any_epoch_and_skips_into_one():
    kwargs = dict(seed=3, limit=40)
    whole = batches(data.load_epochs("digits", 16, epochs=3, **kwargs))
    per_epoch = data.steps_per_epoch("digits", 16, 40)
    assert [len(y) for _, y in whole] == [16, 16, 8] * 3
    later = batches(data.load_epochs("digits", 16, epochs=3, start_epoch=1, **kwargs))
    skipped = batches(data.load_epochs("digits", 16, epochs=3, start_epoch=1, skip_batches=2,
                                       **kwargs))
    assert len(later) == 2 * per_epoch and len(skipped) == 2 * per_epoch - 2
    for got, want in zip(later + skipped, whole[per_epoch:] + whole[per_epoch + 2 :],
                         strict=True):
        np.testing.assert_array_equal(got[0], want[0])  # the same pipeline, rebuilt
        np.testing.assert_array_equal(got[1], want[1])
    # Each epoch is a new order of the same 40 examples.
    first, second = (np.concatenate([y for _, y in whole[e * 3 : e * 3 + 3]]) for e in (0, 1))
    assert not np.array_equal(first, second)
    assert sorted(first) == sorted(second)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(epochs=1, start_epoch=1), ValueError, "`epochs` must be an integer >= 2. "
                                                    "Received: epochs=1"),
        (dict(epochs=2, skip_batches=3), ValueError, "`skip_batches` must be an integer in "
                                                     "[0, 2]. Received: skip_batches=3"),
        (dict(epochs=2, start_epoch=-1), ValueError, "start_epoch=-1"),
        (dict(epochs=2.0), TypeError, "epochs=2.0 of type float"),
        (dict(epochs=2, augment=None), TypeError, "`augment` must be True or False"),
    ],
)
def test_load_epochs_checks_its_arguments(kwargs, error, message):
    with pytest.raises(error) as raised:
        data.load_epochs("digits", 16, limit=40, **kwargs)
    assert message in str(raised.value)
