"""train.py and a stalled pipeline: exit code 1, where each stage is, the last checkpoint
intact and the command that resumes from it; `--stall-timeout` checked before any work.

In process (`cli.main`), as test_checkpointing.py runs train.py: the mlp gets a layer after
`dense1` (so in stage 1 at `--cuts dense1`) that blocks in its forward once epoch 2 has
begun, as a stuck op or device would.
"""

import os
import time

import keras
import pytest
from test_stall import GATES, Blocker, gate, stage_threads

from tf_spectrain import models
from tf_spectrain.app import cli, training
from tf_spectrain.callbacks import Telemetry
from tf_spectrain.checkpoint import store

CLI = ["--model", "mlp", "--gpus", "2", "--cuts", "dense1", "--mode", "sync", "--limit", "64",
       "--batch-size", "16", "--prediction-every", "0"]


def test_a_stall_exits_1_with_where_each_stage_is_and_keeps_the_checkpoint(
        tmp_path, capsys, monkeypatch):
    name = gate(after=10**9)
    built = []
    get_model = models.get_model

    def with_blocker(model_name, input_shape, num_classes, **options):
        plain = get_model(model_name, input_shape, num_classes, **options)
        x = plain.inputs[0]
        h = x
        for layer in plain.layers[1:]:
            h = layer(h)
            if layer.name == "dense1":
                h = Blocker(name, name="blocker")(h)
        built.append(keras.Model(x, h, name=plain.name))
        return built[-1]

    class BlockInEpoch2(Telemetry):
        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            if epoch == 1:  # the third forward of stage 1 in this epoch blocks
                GATES[name]["after"] = GATES[name]["calls"] + 2

    monkeypatch.setattr(models, "get_model", with_blocker)
    monkeypatch.setattr(training, "Telemetry", BlockInEpoch2)
    logdir = tmp_path / "run"
    argv = CLI + ["--epochs", "3", "--stall-timeout", "2", "--logdir", str(logdir)]
    try:
        code = cli.main(argv)
        out = capsys.readouterr()
        assert code == 1, out.err[-3000:]
        assert "train.py: error: No stage of the pipeline finished a pass for 2.0 s in epoch 1 " \
               "(stall_timeout=2)" in out.err
        assert "  stage 0 on /CPU:0: op 8 of 12, the backward of micro-batch 2.0: waiting for " \
               "the gradient of micro-batch 2.0 from stage 1 for " in out.err
        assert "  stage 1 on /CPU:1: op 7 of 12, the forward of micro-batch 2.0: running for " \
               in out.err
        checkpoints = os.path.join(logdir, "checkpoints")
        first = os.path.join(checkpoints, "ckpt-e0001-b000000")
        assert f"The last good checkpoint is {first}; to continue from it (once the cause is " \
               "mended): python train.py " in out.err
        assert "--resume" in out.err and "Traceback" not in out.err
        assert store.list_checkpoints(checkpoints) == [first]
        store.load_checkpoint(first)  # complete and verified
    finally:
        GATES[name]["gate"].set()
    deadline = time.monotonic() + 30
    while stage_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stage_threads() == []


@pytest.mark.parametrize("flags, message", [
    (["--stall-timeout", "-1"], "--stall-timeout must be a finite number >= 0 (seconds; 0: "
                                "never stop). Received: --stall-timeout -1.0"),
    (["--stall-timeout", "5", "--mode", "single"], "--stall-timeout watches the stages of a "
                                                   "pipeline"),
])
def test_bad_stall_timeouts_exit_2_before_any_work(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--model", "mlp", "--gpus", "2", "--epochs", "1"] + flags)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
