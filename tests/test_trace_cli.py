"""`train.py --trace`: VGG16 in 4 stages writes a trace per epoch whose busy fractions are
the TensorBoard utilisation; the flag is refused where there is no pipeline to draw."""

import json
import os

import pytest

from tf_spectrain.app import cli

VGG16 = ["--model", "vgg16", "--gpus", "4", "--epochs", "1", "--limit", "96",
         "--batch-size", "32", "--cuts", "block2_pool,block3_pool,block4_pool",
         "--export", "none", "--keep-checkpoints", "0"]


def _scalars(logdir, tag):
    """{step: value} of a TensorBoard scalar written as a tensor summary under `logdir`."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}


def test_vgg16_trace_parses_and_its_busy_fractions_are_the_tensorboard_utilisation(
        tmp_path, capsys):
    logdir = tmp_path / "run"
    assert cli.main(VGG16 + ["--trace", "--logdir", str(logdir)]) == 0
    capsys.readouterr()
    with open(logdir / "trace" / "trace_epoch_0.json", encoding="utf-8") as f:
        trace = json.load(f)  # valid JSON: what Perfetto and chrome://tracing open
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in slices} == {0, 1, 2, 3}
    for e in slices:
        assert e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["name"], str)
    forwards = {(e["tid"], e["name"]) for e in slices if e["name"].startswith("forward")}
    assert len(forwards) == 4 * 3  # 3 mini-batches through each of the 4 stages
    stages = trace["otherData"]["stages"]
    for k, stage in enumerate(stages):
        busy = sum(e["dur"] for e in slices if e["tid"] == k and not e["name"].startswith(
            ("wait", "host", "idle"))) / 1e6
        assert busy == pytest.approx(stage["busy_seconds"], rel=1e-3, abs=1e-4)
        utilisation = _scalars(logdir, f"pipeline/stage_{k}/utilisation")
        assert len(utilisation) == 1  # one epoch
        assert abs(stage["busy_fraction"] - next(iter(utilisation.values()))) <= 0.02


@pytest.mark.parametrize("mode", ["single", "dp"])
def test_trace_needs_a_pipeline(mode, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--model", "mlp", "--mode", mode, "--trace"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--trace draws the stages of a pipeline" in err and f"--mode {mode}" in err
    assert not os.path.exists("runs")
