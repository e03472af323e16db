"""messages.did_you_mean: the shared 'did you mean' hint, as a table."""

import pytest

from tf_spectrain.messages import did_you_mean

CHOICES = ["vgg16", "resnet20", "small_cnn"]


@pytest.mark.parametrize(
    "value, kwargs, expected",
    [
        ("vgg61", {}, "; did you mean 'vgg16'?"),
        ("VGG16", {}, ""),
        ("VGG16", {"ignore_case": True}, "; did you mean 'vgg16'?"),
        ("transformer", {}, ""),
        (16, {}, ""),
        (None, {}, ""),
        ("smal", {"cutoff": 0.3}, "; did you mean 'small_cnn'?"),
        ("smal", {"cutoff": 0.9}, ""),
    ],
)
def test_did_you_mean(value, kwargs, expected):
    assert did_you_mean(value, CHOICES, **kwargs) == expected
