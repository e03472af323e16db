"""What a model of the zoo learns and what a dataset teaches, so that a run can pair them.

A model or a dataset is of one kind: `"image"` (classifies images), `"text"` (classifies
token sequences) or `"language_model"` (predicts the next token). `train.py` takes the
default `--dataset` of a model from its kind and refuses a dataset of another kind.
"""

from tf_spectrain import data, models

# The zoo's one language model; the other models of token sequences classify them.
LANGUAGE_MODELS = ("transformer_lm",)
KINDS = {
    "image": "classifies images",
    "text": "classifies token sequences",
    "language_model": "predicts the next token (language modelling)",
}
DEFAULT_DATASETS = {"image": "digits", "language_model": "pydoc"}  # none for "text"


def model_kind(model):
    """The kind of a zoo model by its name; any name the zoo does not know counts as `"image"`."""
    if not isinstance(model, str) or model not in models.model_names():
        return "image"
    if models.model_input_kind(model) != "tokens":
        return "image"
    return "language_model" if model in LANGUAGE_MODELS else "text"


def dataset_kind(dataset):
    """The kind of a dataset of `data.dataset_names()`, in the words of `model_kind`."""
    info = data.get_info(dataset)
    return "language_model" if info.task == "language_model" else info.input_kind


def default_dataset(model):
    """The dataset of a run of `model` without `--dataset`: digits, pydoc, or None (text)."""
    return DEFAULT_DATASETS.get(model_kind(model))

