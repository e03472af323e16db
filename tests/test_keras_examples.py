"""The Keras example scripts of issue 30 and their runner (benchmarks/keras_examples_run.py).

Every script must have exactly one marker line where the pipeline's line goes. The
runner's machinery (the script rewritten for a mode, run in a fresh process and
directory, every `fit`'s History captured) runs the fastest script without dropout
twice, plain Keras and `sync`; `sync` must give Keras' History (an independent
computation: Keras' own `fit` in another process, from the same seed).
"""

import ast
import math

import pytest

from benchmarks import keras_examples_run as runner

# The fastest script without randomness in training (about 10 s in plain Keras).
FAST_SCRIPT = "timeseries_classification_from_scratch"


def _source(name):
    with open(runner.script_path(name), encoding="utf-8") as f:
        return f.read()


def test_there_are_eight_scripts_and_the_runner_knows_their_randomness():
    names = runner.script_names()
    assert len(names) >= 8
    assert set(runner.RANDOM_IN_TRAINING) <= set(names)
    assert FAST_SCRIPT in names and FAST_SCRIPT not in runner.RANDOM_IN_TRAINING


@pytest.mark.parametrize("name", runner.script_names())
def test_every_script_has_exactly_one_marker_and_names_its_example(name):
    source = _source(name)
    lines = source.splitlines()
    assert [i for i, line in enumerate(lines) if runner.MARKER in line] == \
        runner.marker_lines(source)
    assert len(runner.marker_lines(source)) == 1
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring and "https://" in docstring and "Changed from the example" in docstring
    for mode, line in runner.MODES.items():
        rewritten = runner.script_for_mode(source, mode)
        ast.parse(rewritten)
        if line is None:
            assert rewritten == source
            continue
        assert runner.MARKER not in rewritten
        assert rewritten.count("tf_spectrain.PipelineModel(model") == 1
        # Only the marker line changed, and it kept its place.
        new_lines = rewritten.splitlines()
        assert len(new_lines) == len(lines)
        changed = [i for i, (a, b) in enumerate(zip(lines, new_lines)) if a != b]
        assert changed == runner.marker_lines(source)
        assert new_lines[changed[0]].strip() == line


def test_a_script_without_exactly_one_marker_is_refused():
    with pytest.raises(ValueError, match="exactly one line"):
        runner.script_for_mode("model = 1\n", "sync")
    twice = f"model = 1\n{runner.MARKER}\n    {runner.MARKER}\n"
    with pytest.raises(ValueError, match="has 2"):
        runner.script_for_mode(twice, "keras")
    indented = f"def build():\n    model = 1\n    {runner.MARKER}\n    return model\n"
    assert "\n    import tf_spectrain; model = tf_spectrain.PipelineModel(model)\n" in (
        runner.script_for_mode(indented, "spectrain"))


def test_compare_histories_finds_every_kind_of_difference():
    keras = [{"loss": [1.0, 0.5], "val_loss": [1.2, 0.9]}]
    assert runner.compare_histories(keras, [{"loss": [1.00005, 0.5], "val_loss": [1.2, 0.9]}]) \
        == "equal"
    assert "epoch 2" in runner.compare_histories(
        keras, [{"loss": [1.0, 0.5003], "val_loss": [1.2, 0.9]}])
    assert "keys" in runner.compare_histories(keras, [{"loss": [1.0, 0.5]}])
    assert "epochs" in runner.compare_histories(keras, [{"loss": [1.0], "val_loss": [1.2]}])
    assert "fits" in runner.compare_histories(keras, keras + keras)
    assert "epoch 1" in runner.compare_histories(
        keras, [{"loss": [math.nan, 0.5], "val_loss": [1.2, 0.9]}])


@pytest.fixture(scope="module")
def keras_run():
    return runner.run_script(FAST_SCRIPT, "keras")


def test_the_plain_keras_run_is_recorded(keras_run):
    assert keras_run["ran"], keras_run["stderr_tail"]
    (history,) = keras_run["histories"]  # the script calls fit once, for 3 epochs
    assert {"loss", "val_loss", "sparse_categorical_accuracy"} <= set(history)
    assert len(history["loss"]) == 3
    assert keras_run["final_loss"] == history["loss"][-1]
    assert all(math.isfinite(v) for v in history["loss"])


def test_sync_pipeline_gives_keras_history(keras_run):
    # shuffle=True as the script has it: under the seed the pipeline takes Keras' order
    assert keras_run["ran"], keras_run["stderr_tail"]
    sync = runner.run_script(FAST_SCRIPT, "sync")
    check = runner.history_check(sync, keras_run)
    assert sync["ran"], f"{sync['error']} (History: {check})\n{sync['stderr_tail']}"
    assert check == "equal"
