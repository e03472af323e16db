"""`schedule.options.PipelineOptions`: one frozen, checked object of a pipeline's options."""

import dataclasses
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tf_spectrain.schedule import modes
from tf_spectrain.schedule.options import PipelineOptions


def test_defaults_are_pipeline_models():
    options = PipelineOptions()
    assert (options.mode, options.spectrain_target, options.micro_batches, options.schedule,
            options.recompute, options.replicas) == ("spectrain", "paper", 1, "gpipe", "auto", 1)


def test_numpy_ints_become_ints_and_the_object_is_frozen():
    options = PipelineOptions(mode="sync", micro_batches=np.int64(4), replicas=np.int32(2))
    assert type(options.micro_batches) is int and options.micro_batches == 4
    assert type(options.replicas) is int and options.replicas == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.mode = "stash"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(mode="async"), ValueError, r"`mode` must be one of"),
        (dict(spectrain_target="exact"), ValueError, r"`spectrain_target` must be one of"),
        (dict(micro_batches=0), ValueError, r"`micro_batches` must be .*micro-batches per"),
        (dict(micro_batches=2.0), TypeError, r"`micro_batches`"),
        (dict(schedule="1f1b"), ValueError, r"`schedule` must be 'gpipe' unless mode='sync'"),
        (dict(recompute="never"), ValueError, r"`recompute` must be one of"),
        (dict(replicas=0), ValueError, r"`replicas` must be .*copies of the pipeline"),
        (dict(replicas=True), TypeError, r"`replicas`"),
    ],
)
def test_each_option_is_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        PipelineOptions(**kwargs)


def test_pass_plans_are_the_modes():
    options = PipelineOptions(mode="spectrain", spectrain_target="consistent")
    assert options.pass_plans(3) == [modes.pass_plan("spectrain", k, 3, "consistent")
                                     for k in range(3)]


def test_given_takes_options_or_keywords_but_not_both():
    options = PipelineOptions(mode="sync", micro_batches=2)
    assert PipelineOptions.given(options) is options
    assert PipelineOptions.given(None, mode="stash") == PipelineOptions(mode="stash")
    with pytest.raises(ValueError, match=r"either as `options` or as keywords"):
        PipelineOptions.given(options, mode="stash")
    with pytest.raises(TypeError, match=r"`options` must be a PipelineOptions"):
        PipelineOptions.given({"mode": "sync"})


def test_planned_leaves_out_replicas():
    planned = PipelineOptions(mode="sync", replicas=2).planned()
    assert planned == dict(mode="sync", spectrain_target="paper", micro_batches=1,
                           schedule="gpipe", recompute="auto", accumulate=None)


def test_it_stands_on_the_schedule_floor_without_tensorflow():
    # `tf_spectrain/__init__` imports TensorFlow: stand in an empty package for it.
    code = (
        "import sys, types\n"
        "package = types.ModuleType('tf_spectrain')\n"
        "package.__path__ = [sys.argv[1]]\n"
        "sys.modules['tf_spectrain'] = package\n"
        "from tf_spectrain.schedule.options import PipelineOptions\n"
        "assert PipelineOptions(mode='sync').pass_plans(2)\n"
        "loaded = {'tensorflow', 'keras', 'numpy'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    package = pathlib.Path(__file__).resolve().parent.parent / "tf_spectrain"
    result = subprocess.run([sys.executable, "-c", code, str(package)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
