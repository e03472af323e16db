"""Independent reference computations and helpers for the tests of `tf_spectrain.data`.

Used by test_catalog.py, test_transforms.py, test_loaders.py and test_data.py; nothing here
comes from the module under test except `two_epochs`, which only calls `data.load`.
"""

import numpy as np
import tensorflow_datasets as tfds

from tf_spectrain import data

# The well-known per-channel statistics of the training sets, scaled to [0, 1].
KNOWN_STATS = {
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
    "mnist": ([0.1307] * 3, [0.3081] * 3),
    "fashion_mnist": ([0.2860] * 3, [0.3530] * 3),
}

TFDS_NAMES = ["cifar10", "cifar100", "fashion_mnist", "mnist"]


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
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in dataset], strict=True)
    return np.concatenate(xs), np.concatenate(ys)


def sorted_rows(x):
    flat = x.reshape(len(x), -1)
    return flat[np.lexsort(flat.T[::-1])]


def two_epochs(seed, augment, name="digits", limit=48, **kwargs):
    dataset = data.load(name, "train", 16, seed=seed, limit=limit, augment=augment, **kwargs)
    return epoch(dataset), epoch(dataset)


def classify_augmentations(augmented, original, fill):
    """For each pair: 'plain' (an unflipped crop), 'mirrored' or 'neither'; and shifts."""
    kinds, shifts = [], []
    for aug, orig in zip(augmented, original, strict=True):
        plain = crop_matches(aug, orig, fill, mirrored=False)
        mirrored = crop_matches(aug, orig, fill, mirrored=True)
        kinds.append("plain" if plain else "mirrored" if mirrored else "neither")
        shifts.append((plain or mirrored or [None])[0])
    return kinds, shifts


def mock_raw_examples(name, num_examples):
    """The raw examples the mock serves (deterministic: every load sees the same)."""
    examples = tfds.load(name, split="test", download=True).take(num_examples)
    pairs = [(ex["image"].numpy(), ex["label"].numpy()) for ex in examples]
    return np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def make_layout(root, files):
    for relative in files:
        path = root / relative
        if relative.endswith("/"):
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
