"""Tests of `tf_spectrain.data`. Nothing here touches the network.

tensorflow-datasets sets are tested three ways: with `tfds.testing.mock_data` (random
examples, download mocked as a no-op), with a really prepared data dir built offline from
tfds' own `DummyMnist` test builder (the real `download=False` read path), and with missing
or empty data dirs (the fast offline error).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from sklearn.datasets import load_digits

from tf_spectrain import data

# The well-known per-channel statistics of the training sets, scaled to [0, 1].
KNOWN_STATS = {
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
    "mnist": ([0.1307] * 3, [0.3081] * 3),
    "fashion_mnist": ([0.2860] * 3, [0.3530] * 3),
}
TFDS_NAMES = ["cifar10", "cifar100", "fashion_mnist", "mnist"]


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    # tfds leaves an empty `tmp*tfds` folder behind whenever it builds a DatasetInfo for
    # unprepared data; keep those inside pytest's own temporary folder.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


# ---------------------------------------------------------------------------------------
# Independent reference computations.


def bilinear_reference(images, size):
    """`[N, H, W, C]` -> `[N, size, size, C]`: bilinear, half-pixel centres, 4-tap form."""

    def taps(n_in):
        src = np.clip((np.arange(size) + 0.5) * n_in / size - 0.5, 0, n_in - 1)
        lo = np.floor(src).astype(int)
        return lo, np.minimum(lo + 1, n_in - 1), src - lo

    y0, y1, wy = taps(images.shape[1])
    x0, x1, wx = taps(images.shape[2])
    wy, wx = wy[None, :, None, None], wx[None, None, :, None]
    top = images[:, y0][:, :, x0] * (1 - wx) + images[:, y0][:, :, x1] * wx
    bottom = images[:, y1][:, :, x0] * (1 - wx) + images[:, y1][:, :, x1] * wx
    return top * (1 - wy) + bottom * wy


def expected_tfds_images(name, raw_uint8):
    """What `load` must yield for raw tfds images: [0, 1], 32x32, RGB, normalised."""
    images = raw_uint8.astype(np.float64) / 255.0
    if images.shape[1] != 32:
        images = bilinear_reference(images, 32)
    images = np.repeat(images, 3 // images.shape[-1], axis=-1)
    mean, std = KNOWN_STATS[name]
    return (images - np.array(mean)) / np.array(std)


def shifted(image, dy, dx, fill):
    """`image` moved by (dy, dx) pixels, uncovered pixels set to `fill` (per channel)."""
    out = np.broadcast_to(np.asarray(fill, np.float64), image.shape).copy()
    h, w = image.shape[:2]
    out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
        max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def crop_matches(augmented, original, fill, mirrored):
    """The (dy, dx) shifts within +-4 pixels that turn `original` (maybe mirrored) into
    `augmented`: what a 4-pixel pad and a random 32x32 crop can produce."""
    source = original[:, ::-1] if mirrored else original
    return [
        (dy, dx)
        for dy in range(-4, 5)
        for dx in range(-4, 5)
        if np.allclose(augmented, shifted(source, dy, dx, fill), atol=1e-5)
    ]


def epoch(dataset):
    """One pass over a dataset: concatenated (images, labels) NumPy arrays."""
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in dataset])
    return np.concatenate(xs), np.concatenate(ys)


def sorted_rows(x):
    flat = x.reshape(len(x), -1)
    return flat[np.lexsort(flat.T[::-1])]


# ---------------------------------------------------------------------------------------
# Names, info and argument checks.


def test_dataset_names_and_info():
    names = data.dataset_names()
    assert names == sorted(["cifar10", "cifar100", "digits", "fashion_mnist", "mnist"])
    for name in names:
        info = data.get_info(name)
        assert info.name == name
        assert info.image_shape == (32, 32, 3)
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


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"split": "val"}, ValueError, "`split` must be 'train' or 'test'. Received: split='val'"),
        ({"split": None}, ValueError, "Received: split=None"),
        ({"batch_size": 0}, ValueError, "`batch_size` must be an integer >= 1. Received: "),
        ({"batch_size": -2}, ValueError, "batch_size=-2"),
        ({"batch_size": 2.5}, ValueError, "batch_size=2.5"),
        ({"batch_size": True}, ValueError, "batch_size=True"),
        ({"batch_size": "8"}, ValueError, "batch_size='8'"),
        ({"limit": 0}, ValueError, "`limit` must be an integer >= 1 or None. Received: limit=0"),
        ({"limit": -5}, ValueError, "limit=-5"),
        ({"limit": 1.5}, ValueError, "limit=1.5"),
        ({"seed": -1}, ValueError, "`seed` must be an integer >= 0 and < 4611686018427387904"),
        ({"seed": 2**62}, ValueError, "Received: seed=4611686018427387904"),
        ({"seed": "0"}, ValueError, "seed='0'"),
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
# digits: real data.


@pytest.fixture(scope="module")
def digits_arrays():
    return {split: data.load_arrays("digits", split) for split in ("train", "test")}


def test_digits_shapes_split_and_labels(digits_arrays):
    (x_train, y_train), (x_test, y_test) = digits_arrays["train"], digits_arrays["test"]
    assert x_train.shape == (1437, 32, 32, 3) and x_test.shape == (360, 32, 32, 3)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int32
    info = data.get_info("digits")
    assert (info.num_train, info.num_test) == (len(y_train), len(y_test))
    assert info.num_classes == len(np.unique(load_digits().target))
    assert set(y_train) == set(y_test) == set(range(10))
    # The three channels are copies of one grey image.
    np.testing.assert_array_equal(x_train[..., 0], x_train[..., 2])


def test_digits_are_normalised_by_training_statistics(digits_arrays):
    x_train = digits_arrays["train"][0].astype(np.float64)
    np.testing.assert_allclose(x_train.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(x_train.std(axis=(0, 1, 2)), 1.0, atol=1e-4)
    x_test = digits_arrays["test"][0].astype(np.float64)
    assert abs(x_test.mean()) < 0.1 and abs(x_test.std() - 1) < 0.1


def test_digits_are_the_sklearn_images_resized(digits_arrays):
    """Every image is one sklearn digit, resized, with its own label; the splits
    partition the 1,797 digits and keep the class proportions (stratified)."""
    bunch = load_digits()
    reference = tf.image.resize(bunch.images[..., None] / 16.0, (32, 32)).numpy()[..., 0]
    reference = reference.reshape(len(reference), -1)
    ref_centred = reference - reference.mean(axis=1, keepdims=True)
    ref_centred /= np.linalg.norm(ref_centred, axis=1, keepdims=True)
    indices = {}
    for split, (x, y) in digits_arrays.items():
        ours = x[..., 0].reshape(len(x), -1).astype(np.float64)
        ours_centred = ours - ours.mean(axis=1, keepdims=True)
        ours_centred /= np.linalg.norm(ours_centred, axis=1, keepdims=True)
        # A per-channel affine normalisation keeps the correlation at exactly 1.
        correlation = ours_centred @ ref_centred.T
        indices[split] = correlation.argmax(axis=1)
        assert correlation.max(axis=1).min() > 1 - 1e-6
        np.testing.assert_array_equal(y, bunch.target[indices[split]])
    all_indices = np.concatenate([indices["train"], indices["test"]])
    assert sorted(all_indices) == list(range(len(bunch.target)))
    # Normalisation by the training split's own mean and std.
    raw_train = reference[indices["train"]]
    expected = (raw_train - raw_train.mean()) / raw_train.std()
    ours = digits_arrays["train"][0][..., 0].reshape(len(raw_train), -1)
    np.testing.assert_allclose(ours, expected, atol=1e-4)
    test_counts = np.bincount(digits_arrays["test"][1], minlength=10)
    all_counts = np.bincount(bunch.target, minlength=10)
    assert np.all(np.abs(test_counts - all_counts * 360 / 1797) <= 1)


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


# ---------------------------------------------------------------------------------------
# Shuffling and augmentation.


def two_epochs(seed, augment, name="digits", limit=48, **kwargs):
    dataset = data.load(name, "train", 16, seed=seed, limit=limit, augment=augment, **kwargs)
    return epoch(dataset), epoch(dataset)


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
        for image, label in zip(x, y):
            assert label == y_ref[np.argmin(np.abs(x_ref - image).sum(axis=(1, 2, 3)))]


def test_training_false_means_no_shuffle_on_train_split():
    x, _ = epoch(data.load("digits", "train", 16, limit=32, training=False))
    np.testing.assert_allclose(x, data.load_arrays("digits", "train", limit=32)[0], atol=1e-6)


def classify_augmentations(augmented, original, fill):
    """For each pair: 'plain' (an unflipped crop), 'mirrored' or 'neither'; and shifts."""
    kinds, shifts = [], []
    for aug, orig in zip(augmented, original):
        plain = crop_matches(aug, orig, fill, mirrored=False)
        mirrored = crop_matches(aug, orig, fill, mirrored=True)
        kinds.append("plain" if plain else "mirrored" if mirrored else "neither")
        shifts.append((plain or mirrored or [None])[0])
    return kinds, shifts


def test_digits_augmentation_crops_but_never_mirrors():
    (aug1, y_aug), (aug2, _) = two_epochs(seed=5, augment=True)
    (plain1, y_plain), _ = two_epochs(seed=5, augment=False)
    np.testing.assert_array_equal(y_aug, y_plain)  # same seed: same order
    assert aug1.shape == plain1.shape == (48, 32, 32, 3)
    fill = plain1.min(axis=(0, 1, 2))  # a black pixel, normalised
    kinds, shifts = classify_augmentations(aug1, plain1, fill)
    assert kinds.count("plain") == len(kinds), kinds
    assert sum(shift != (0, 0) for shift in shifts) > len(shifts) // 2
    # The check above could catch a flip: most digits do not look like their mirror image.
    asymmetric = [not crop_matches(a, p[:, ::-1], fill, False) for a, p in zip(aug1, plain1)]
    assert sum(asymmetric) > len(asymmetric) // 2
    # Deterministic per seed, new on each pass.
    (aug1_again, _), (aug2_again, _) = two_epochs(seed=5, augment=True)
    np.testing.assert_array_equal(aug1, aug1_again)
    np.testing.assert_array_equal(aug2, aug2_again)
    (aug_other, _), _ = two_epochs(seed=6, augment=True)
    assert not np.array_equal(aug1, aug2) and not np.array_equal(aug1, aug_other)


def test_augmentation_is_off_for_the_test_split_unless_asked():
    x_plain, _ = epoch(data.load("digits", "test", 32, limit=32))
    augmented = data.load("digits", "test", 32, limit=32, augment=True, seed=1)
    x_aug, x_aug_second = epoch(augmented)[0], epoch(augmented)[0]
    fill = data.load_arrays("digits", "train")[0].min(axis=(0, 1, 2))
    kinds, shifts = classify_augmentations(x_aug, x_plain, fill)
    assert set(kinds) == {"plain"} and any(shift != (0, 0) for shift in shifts)
    # Unshuffled, so only the augmentation can differ: new crops on each pass, the same
    # sequence of passes for a rebuilt pipeline with the same seed.
    _, shifts_second = classify_augmentations(x_aug_second, x_plain, fill)
    assert shifts_second != shifts
    rebuilt = data.load("digits", "test", 32, limit=32, augment=True, seed=1)
    np.testing.assert_array_equal(epoch(rebuilt)[0], x_aug)
    np.testing.assert_array_equal(epoch(rebuilt)[0], x_aug_second)
    other_seed = data.load("digits", "test", 32, limit=32, augment=True, seed=2)
    assert classify_augmentations(epoch(other_seed)[0], x_plain, fill)[1] != shifts


# ---------------------------------------------------------------------------------------
# tensorflow-datasets sets, mocked: random examples, downloading mocked as a no-op.


def mock_raw_examples(name, num_examples):
    """The raw examples the mock serves (deterministic: every load sees the same)."""
    examples = tfds.load(name, split="test", download=True).take(num_examples)
    pairs = [(ex["image"].numpy(), ex["label"].numpy()) for ex in examples]
    return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs])


@pytest.mark.parametrize("name", ["cifar10", "mnist", "fashion_mnist"])
def test_mocked_tfds_batches_are_shaped_and_normalised(name):
    with tfds.testing.mock_data(num_examples=10):
        raw_x, raw_y = mock_raw_examples(name, 10)
        dataset = data.load(name, "test", 4, download=True)
        batches = [(x.numpy(), y.numpy()) for x, y in dataset]
    assert [len(y) for _, y in batches] == [4, 4, 2]
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    assert x.dtype == np.float32 and x.shape == (10, 32, 32, 3) and y.dtype == np.int32
    np.testing.assert_allclose(x, expected_tfds_images(name, raw_x), atol=1e-5)
    np.testing.assert_array_equal(y, raw_y)
    assert y.min() >= 0 and y.max() < data.get_info(name).num_classes


def test_mocked_cifar100_labels_use_100_classes():
    with tfds.testing.mock_data(num_examples=64):
        _, y = data.load_arrays("cifar100", "train", download=True)
    assert y.shape == (64,) and y.max() < 100 and y.max() >= 10


@pytest.mark.parametrize(
    "name, flips", [("cifar10", True), ("fashion_mnist", True), ("mnist", False)]
)
def test_mocked_tfds_augmentation_flips_only_mirror_invariant_sets(name, flips):
    with tfds.testing.mock_data(num_examples=32):
        kwargs = dict(seed=2, name=name, limit=None, download=True)
        (aug, y_aug), _ = two_epochs(augment=True, **kwargs)
        (plain, y_plain), _ = two_epochs(augment=False, **kwargs)
    np.testing.assert_array_equal(y_aug, y_plain)
    mean, std = KNOWN_STATS[name]
    fill = -np.array(mean) / np.array(std)  # a black pixel, normalised
    kinds, _ = classify_augmentations(aug, plain, fill)
    assert "neither" not in kinds
    # Random-noise images never look like their mirror image, so flips are visible.
    assert ("mirrored" in kinds) == flips
    assert "plain" in kinds


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
# Missing data: fail at once, explain how to get the data.


def make_layout(root, files):
    for relative in files:
        path = root / relative
        if relative.endswith("/"):
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")


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


def test_metadata_calls_run_no_tensorflow_op(tmp_path):
    """In a fresh process: importing and querying the module leaves TF uninitialised,
    so the program can still split its devices afterwards."""
    make_layout(tmp_path, ["mnist/3.0.1/dataset_info.json"])
    script = textwrap.dedent(
        f"""
        import tensorflow as tf
        from tf_spectrain import data
        names = data.dataset_names()
        infos = [data.get_info(name) for name in names]
        data.check_available("digits")
        data.check_available("mnist", data_dir={str(tmp_path)!r})
        try:
            data.check_available("cifar10", data_dir={str(tmp_path)!r})
        except data.DatasetNotFoundError:
            pass
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        print("devices", len(tf.config.list_logical_devices("CPU")))
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TFDS_DATA_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "devices 2" in result.stdout
