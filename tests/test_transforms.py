"""Tests of `tf_spectrain.data.transforms`: the digits images (resized from scikit-learn's,
split and normalised), every image brought to 32x32 RGB and normalised, and the
augmentation (crops; flips only where a mirror image keeps its class). tensorflow-datasets
sets are mocked with `tfds.testing.mock_data`; nothing here touches the network."""

import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from data_reference import (
    KNOWN_STATS,
    classify_augmentations,
    crop_matches,
    epoch,
    expected_tfds_images,
    mock_raw_examples,
    two_epochs,
)
from sklearn.datasets import load_digits

from tf_spectrain import data


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    # tfds leaves an empty `tmp*tfds` folder behind whenever it builds a DatasetInfo for
    # unprepared data; keep those inside pytest's own temporary folder.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


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


# ---------------------------------------------------------------------------------------
# tensorflow-datasets images, mocked: converted and normalised.


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


# ---------------------------------------------------------------------------------------
# Augmentation.


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
    asymmetric = [
        not crop_matches(a, p[:, ::-1], fill, False)
        for a, p in zip(aug1, plain1, strict=True)
    ]
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
