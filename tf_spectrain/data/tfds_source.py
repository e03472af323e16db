"""Reading a split of a tensorflow-datasets set offline: only from prepared files, unless
downloading was allowed.
"""

from tf_spectrain.data.catalog import default_data_dir, prepared_version, tfds_name


def tfds_examples(name, split, data_dir, download):
    """Returns a tensorflow-datasets split as its feature dicts, checked first, in file order.

    Args:
        name: a tensorflow-datasets set of `dataset_names()`.
        split: `"train"` or `"test"`.
        data_dir: the data directory; None means tfds' default.
        download: whether tfds may download and prepare the set.

    Returns:
        A `tf.data.Dataset` of dicts (e.g. `{"image", "label"}` or `{"text", "label"}`).

    Raises:
        DatasetNotFoundError: if the set is not prepared and `download` is False (before
            tensorflow-datasets is asked for anything).
    """
    import tensorflow_datasets as tfds

    version = prepared_version(name, data_dir, download)
    if version is not None:
        # An explicit version makes tfds read the prepared files (any version) offline.
        data_dir = default_data_dir() if data_dir is None else data_dir
    return tfds.load(
        tfds_name(name, version), split=split, data_dir=data_dir, download=download,
        shuffle_files=False,
    )
