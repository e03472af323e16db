"""Image and text datasets as `tf.data` pipelines.

Every image set comes out the same way, so that any image model of `tf_spectrain.models`
can train on any of them: batches of `(images, labels)` with float32 images
`[B, 32, 32, 3]` and int32 labels `[B]`.

| name            | classes | train  | test   | source                             |
|-----------------|---------|--------|--------|------------------------------------|
| `digits`        | 10      | 1,437  | 360    | scikit-learn (bundled, no network) |
| `mnist`         | 10      | 60,000 | 10,000 | tensorflow-datasets                |
| `fashion_mnist` | 10      | 60,000 | 10,000 | tensorflow-datasets                |
| `cifar10`       | 10      | 50,000 | 10,000 | tensorflow-datasets                |
| `cifar100`      | 100     | 50,000 | 10,000 | tensorflow-datasets                |

Preprocessing:

- Images are scaled to [0, 1]. Smaller images (8x8 digits, 28x28 MNIST-like) are resized
  bilinearly to 32x32, and grey images are repeated to 3 channels.
- Each channel is normalised: `(x - mean) / std`. CIFAR and MNIST-like datasets use their
  well-known training-set constants; `digits` uses the mean and std of its own training
  split, computed once.
- `digits` is scikit-learn's 8x8 handwritten digits set with a fixed 80/20 stratified split
  (the same split whatever `seed` is, so the test set never changes).

Augmentation (the standard CIFAR recipe), applied to training batches only by default:
pad 4 black pixels on each side, take a random 32x32 crop, and flip left/right with
probability 1/2. The flip is used only where a mirror image shows the same class
(`cifar10`, `cifar100`, `fashion_mnist`); never for `digits` and `mnist`, because a mirrored
digit is not that digit.

Text sets come as int32 token ids `[B, seq_len]` (`get_info(name)` gives `seq_len`,
`vocab_size` and the `task`) with int32 labels: `[B]` for classification, `[B, seq_len]`
(the next token at every position) for language modelling, where `num_classes` is the
vocabulary size. `DatasetInfo.model_options()` gives what a text model also needs.

| name           | task           | vocab  | seq_len | train  | test   | source              |
|----------------|----------------|--------|---------|--------|--------|---------------------|
| `pydoc`        | next byte      | 256    | 128     | ~2,659 | ~262   | Python (bundled)    |
| `pydoc_words`  | next word      | 2,048  | 64      | ~1,325 | ~124   | Python (bundled)    |
| `imdb_reviews` | sentiment, 2   | 20,000 | 256     | 25,000 | 25,000 | tensorflow-datasets |

- `pydoc` and `pydoc_words` are next-token language modelling on the English prose of
  `pydoc_data.topics` (the text of `help()`, which ships with every Python), repeated
  paragraphs removed and every 10th paragraph held out for testing: byte-level (ids are
  the UTF-8 bytes) or word-level (a vocabulary of the training split's most frequent
  words; 0 padding, 1 unknown). The counts above are Python 3.11's; the text changes a
  little between versions. See `pydoc_corpus`.
- `imdb_reviews` is read from a prepared tensorflow-datasets data dir and tokenised with
  a Keras `TextVectorization` adapted on the training reviews (`imdb_vectorizer`): 0
  padding, 1 unknown, reviews cut or padded to 256 tokens. See `text`.

Shuffling and augmentation are deterministic: the same `seed` gives the same epochs, in the
same order, in every run (TensorFlow combines the `seed` with its global seed, so set the
global seed to the same value too, or not at all). Each new pass over a training dataset
(each Keras epoch) is shuffled and augmented anew.

Offline use: tensorflow-datasets data are read from `data_dir` and nothing is downloaded
unless `download=True`. A dataset that is not prepared there fails at once with
`DatasetNotFoundError`, which explains how to prepare it elsewhere and copy it over.
`get_info`, `dataset_names`, `check_available` and `split_size` run no TensorFlow op, so
they are safe to call before the program has set up its devices.

Modules: `catalog` (names, `DatasetInfo`, availability; no TensorFlow), `pydoc_corpus`
(the pydoc text and its tokens; no TensorFlow), `transforms` (the digits arrays and the
per-image ops), `text` (the text sets as token arrays), `tfds_source` (reading a prepared
tensorflow-datasets split) and `loaders` (the `tf.data` pipelines). Every public name of
`catalog` and `loaders`, and `imdb_vectorizer`, is re-exported here.
"""

from tf_spectrain.data.catalog import (
    IMAGE_SIZE,
    DatasetInfo,
    DatasetNotFoundError,
    check_available,
    dataset_names,
    get_info,
    split_size,
)
from tf_spectrain.data.loaders import (
    epoch_seed,
    load,
    load_arrays,
    load_epochs,
    steps_per_epoch,
)
from tf_spectrain.data.text import imdb_vectorizer

__all__ = [
    "IMAGE_SIZE",
    "DatasetInfo",
    "DatasetNotFoundError",
    "check_available",
    "dataset_names",
    "epoch_seed",
    "get_info",
    "imdb_vectorizer",
    "load",
    "load_arrays",
    "load_epochs",
    "split_size",
    "steps_per_epoch",
]
