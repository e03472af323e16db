"""`benchmarks.floor`'s pure parts: the cuts, the table's ratios and the profile's kinds of
work (made-up measurements in, markdown out). The measurements run in benchmarks/."""

import pytest

from benchmarks import floor


def test_cuts_split_the_layers_evenly():
    assert floor.cuts(1) == []
    assert floor.cuts(2) == ["l3"]
    assert floor.cuts(4) == ["l1", "l3", "l5"]
    assert floor.cuts(8) == [f"l{n}" for n in range(7)]
    assert floor.cuts(4, layers=32) == ["l7", "l15", "l23"]


def record(ms, keras_spe, cores=1.0):
    return {"ms_per_batch": ms, "batches_per_second": 1e3 / ms, "cores": cores,
            "keras_spe": keras_spe}


def test_the_table_divides_by_keras_in_the_same_round():
    args = floor.parse_args(["--stages", "2", "--steps-per-execution", "1,8", "--rounds", "2"])
    results = {
        "keras fit, spe=1": [record(2.0, 1), record(4.0, 1)],
        "keras fit, spe=8": [record(0.5, 8), record(1.0, 8)],
        "stash, N=2, spe=1": [record(10.0, 1), record(12.0, 1)],
        "stash, N=2, spe=8": [record(1.0, 8), record(1.0, 8, cores=1.5)],
    }
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")
            for line in floor.table(results, args).splitlines() if line.startswith("| ")}
    # Per round: 10 / 2 = 5.0 and 12 / 4 = 3.0 -> median 4.00 (3.00-5.00).
    assert rows["stash, N=2, spe=1"][3] == "4.00 (3.00-5.00)x"
    assert rows["stash, N=2, spe=1"][4] == "4.00 (3.00-5.00)x"  # its own spe is 1
    # Windows of 8: 1 / 2 and 1 / 4 against Keras' default, 1 / 0.5 and 1 / 1 against spe=8.
    assert rows["stash, N=2, spe=8"][3] == "0.38 (0.25-0.50)x"
    assert rows["stash, N=2, spe=8"][4] == "1.50 (1.00-2.00)x"
    assert rows["stash, N=2, spe=8"][5].startswith("1.25 (1.00-1.50)")


@pytest.mark.parametrize("module, name, kind", [
    ("tensorflow.python._pywrap_tfe", "TFE_Py_Execute", "TensorFlow executes graphs (C++)"),
    ("/x/tensorflow/python/eager/backprop.py", "GradientTape.gradient", "gradient tape"),
    ("/x/tf_spectrain/runtime/handoff.py", "Channel.get", "hand-offs and threads"),
    ("/x/tf_spectrain/runtime/stage.py", "StageRunner.forward", "pipeline runtime (Python)"),
    ("builtins", "isinstance", "Python builtins (mostly called by TensorFlow's Python)"),
    ("/x/mine.py", "f", "other Python"),
])
def test_profile_kinds(module, name, kind):
    assert floor.categorise(module, name) == kind


@pytest.mark.parametrize("value, options, keras", [
    ("eager", {"run_eagerly": True}, 1),
    ("1", {"steps_per_execution": 1}, 1),
    ("8", {"steps_per_execution": 8}, 8),
    ("auto", {"steps_per_execution": "auto"}, 1),
])
def test_a_steps_per_execution_value_compiles_and_compares_as_said(value, options, keras):
    assert floor.compile_options(value) == options
    assert floor.keras_value(value) == keras
