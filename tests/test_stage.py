"""Tests for tf_spectrain.runtime.graphs: its small list helpers. A stage's passes are exercised
through `fit` in test_executor.py, test_pipeline_model.py and test_pipeline_modes.py."""

from tf_spectrain.partition.keras_nodes import one_or_list
from tf_spectrain.runtime import graphs as stage


def test_as_list_and_one_or_list():
    assert stage.as_list(1) == [1] and stage.as_list((1, 2)) == [1, 2]
    assert one_or_list([1]) == 1 and one_or_list([1, 2]) == [1, 2]
