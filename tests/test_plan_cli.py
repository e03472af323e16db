"""`train.py --plan` and `costmodel.plan_pipeline`: the plan, time and memory, no training."""

import dataclasses
import os
import re

import pytest

from tf_spectrain import costmodel, devices, models
from tf_spectrain.app import cli, planning, training
from tf_spectrain.costmodel.run_plan import RunPlan, parse_memory_size
from tf_spectrain.costmodel.stage_terms import StageEstimate

MiB = 2**20
README_EXAMPLE = ["--model", "small_cnn", "--gpus", "2", "--plan", "--memory-limit", "8MiB"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --plan must write nothing here


@pytest.fixture
def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("--plan must not train")

    monkeypatch.setattr(training, "train", refuse)


@pytest.mark.parametrize("text, expected", [
    ("16GiB", 16 * 2**30), ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000),
    ("1024", 1024), (" 2 kib ", 2048), ("3TB", 3 * 10**12), (4096, 4096), (1e9, 10**9),
])
def test_memory_sizes_parse(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "16GiBs", "-1GiB", "0", "0.1", "16 Gi B",
                                  "1e9", "nan", "inf", "16G", "GiB"])
def test_bad_memory_sizes_are_refused(text):
    with pytest.raises(ValueError, match=r"`memory_limit` must be .*Received: memory_limit="):
        parse_memory_size(text)


def test_bad_memory_limit_fails_before_any_work(capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no devices before the flags are checked")

    monkeypatch.setattr(devices, "setup_devices", refuse)
    with pytest.raises(SystemExit) as stop:
        cli.main(["--model", "mlp", "--gpus", "2", "--plan", "--memory-limit", "16Gigs"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "`--memory-limit` must be a size such as" in err and "16Gigs" in err


def test_logical_gpu_memory_follows_tensorflows_order():
    # Two physical GPUs: the first split in 3 logical devices, the second whole.
    assert devices.logical_gpu_memory_mb([[100, 100, 200], []], [16000, 8000]) == [
        100, 100, 200, 8000]
    assert devices.logical_gpu_memory_mb([[], []], [None, 8000]) == [None, 8000]
    assert devices.device_memory_bytes("/CPU:0") is None


def _estimate(k, memory_mib):
    return StageEstimate(k, k, k, 0.001, 0.002, 0.0, 0.0, 0.0, 0.0, memory_mib * MiB, 0.0, 0.0)


def test_run_plan_sets_each_stage_against_the_smaller_limit():
    plan = costmodel.PartitionPlan(names=("a", "b", "c"), stages=[_estimate(k, m) for k, m in
                                   enumerate([5, 9, 9])], batch_size=8, mode="sync",
                                   devices=("/GPU:0", "/GPU:1", "/CPU:0"))
    run = RunPlan(plan, device_memory=(8 * MiB, 16 * MiB, None), memory_limit=(None, 8 * MiB,
                                                                                None))
    assert [run.limit(k) for k in range(3)] == [8 * MiB, 8 * MiB, None]
    assert run.over == [1] and not run.fits
    (problem,) = run.problems()
    assert problem.startswith("stage 1 (/GPU:1, layers b .. b) would not fit: it needs 9.0 MiB")
    assert "the memory_limit is 8.0 MiB" in problem and "more stages" in problem


def plan_lines(out):
    """The per-stage rows of the memory table: {stage: (device, total MiB, fits)}."""
    table = out.split("Predicted memory per stage")[1].splitlines()[2:]
    rows = {}
    for line in table:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[int(cells[0])] = (cells[1], float(cells[6]), cells[-1])
    return rows


@pytest.mark.parametrize("model, extra", [
    ("mlp", ["--mode", "sync", "--micro-batches", "4", "--schedule", "1f1b"]),
    ("small_cnn", ["--cuts", "relu1", "--recompute", "always"]),
])
def test_plan_prints_each_stage_and_trains_nothing(model, extra, capsys, tmp_path,
                                                   no_training):
    code = cli.main(["--model", model, "--gpus", "2", "--plan", "--logdir", "runs/x"] + extra)
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"Partition plan of .*: 2 stages", out)
    assert "ms per mini-batch" in out and "planned in" in out
    rows = plan_lines(out)
    assert [d for d, _, _ in rows.values()] == ["/CPU:0", "/CPU:1"]
    assert all(total > 0 for _, total, _ in rows.values())
    assert "cannot measure" in out  # CPU devices report no memory and no peak
    assert os.listdir(tmp_path) == []  # no logs, checkpoints or exported model
    assert "epoch" not in out.lower()


def test_too_small_memory_limit_exits_3_naming_the_stage(capsys, no_training):
    code = cli.main(["--model", "small_cnn", "--gpus", "2", "--plan", "--cuts", "conv1",
                     "--memory-limit", "8MiB"])
    captured = capsys.readouterr()
    assert code == planning.DOES_NOT_FIT == 3
    assert re.search(r"stage 1 \(/CPU:1, layers \w+ \.\. predictions\) would not fit: it "
                     r"needs [\d.]+ MiB .* but the --memory-limit is 8.0 MiB", captured.err)
    assert "--cuts auto --memory-limit" in captured.err and "--gpus 3" in captured.err
    rows = plan_lines(captured.out)
    assert rows[1][2] == "NO" and rows[1][1] > 8


def test_memory_limit_makes_auto_cuts_that_fit(capsys, no_training):
    code = cli.main(README_EXAMPLE)
    out = capsys.readouterr().out
    assert code == 0
    rows = plan_lines(out)
    assert all(fits == "yes" and total <= 8 for _, total, fits in rows.values())
    (cut,) = re.search(r"To train with these cuts: --cuts (\S+)", out).groups()
    assert cut != "conv1"


@pytest.fixture(scope="module")
def small_cnn():
    model = models.get_model("small_cnn", (32, 32, 3), 10)
    return model, costmodel.profile_model(model, 16, repeats=1, warmup=1)


@pytest.mark.parametrize("options", [
    dict(mode="spectrain", spectrain_target="consistent"),
    dict(mode="stash", micro_batches=2),
    dict(mode="sync", micro_batches=4, schedule="1f1b", recompute="always"),
])
def test_plan_pipeline_gives_stage_terms_numbers(small_cnn, options):
    model, profile = small_cnn
    cuts = ["relu1", "pool2"]
    run = costmodel.plan_pipeline(model, ["/CPU:0", "/CPU:1", "/CPU:2"], 16, cuts=cuts,
                                  profile=profile, optimizer_slots=2, memory_limit="1GiB",
                                  **options)
    terms = costmodel.StageTerms(profile, 16, 3, optimizer_slots=2, **options)
    ends = [profile.names.index(c) for c in cuts]
    bounds = [(0, ends[0]), (ends[0] + 1, ends[1]), (ends[1] + 1, len(profile) - 1)]
    assert list(run.plan.stages) == [terms.estimate(a, b, k) for k, (a, b) in enumerate(bounds)]
    assert run.cuts == cuts and run.fits and run.memory_limit == (2**30,) * 3


def _slow_after(profile, end):
    """`profile` with fixed times: fast layers up to index `end`, slow ones after it."""
    layers = [dataclasses.replace(layer, forward_time=1e-4 if i <= end else 1e-2,
                                  backward_time=2e-4 if i <= end else 2e-2)
              for i, layer in enumerate(profile.layers)]
    return costmodel.ModelProfile(layers, profile.batch_size, profile.name,
                                  profile.input_bytes)


def test_plan_pipeline_auto_plans_the_fastest_cuts_that_fit(small_cnn):
    model, measured = small_cnn
    devices_ = ["/CPU:0", "/CPU:1"]
    last = len(measured) - 1
    sizes = costmodel.StageTerms(measured, 16, 2)
    least = min(range(last), key=lambda e: max(sizes.memory_bytes(0, e, 0),
                                               sizes.memory_bytes(e + 1, last, 1)))
    # Fixed times (measured ones vary): the cut that needs least memory is not the fastest.
    profile = _slow_after(measured, least)
    terms = costmodel.StageTerms(profile, 16, 2)
    # Every one-cut plan, brute force: (slowest stage, its cut, its largest stage memory).
    every = [(max(terms.seconds(0, e, 0), terms.seconds(e + 1, last, 1)), e,
              max(terms.memory_bytes(0, e, 0), terms.memory_bytes(e + 1, last, 1)))
             for e in range(last)]
    fastest = min(every)
    limit = fastest[2] - 1  # the fastest plan does not fit
    fitting = [t for t in every if t[2] <= limit]
    assert fitting and fastest[1] != least  # the premise of the test
    run = costmodel.plan_pipeline(model, devices_, 16, memory_limit=limit, profile=profile)
    assert run.fits and run.cuts == [profile.names[min(fitting)[1]]]
    assert run.cuts != [profile.names[fastest[1]]]
    free = costmodel.plan_pipeline(model, devices_, 16, profile=profile)
    assert free.cuts == [profile.names[fastest[1]]]
    with pytest.raises(costmodel.MemoryLimitError, match="No cuts of model 'small_cnn'"):
        costmodel.plan_pipeline(model, devices_, 16, memory_limit=min(t[2] for t in every) - 1,
                                profile=profile)


def test_plan_pipeline_refuses_bad_cuts_before_profiling(small_cnn):
    model, _ = small_cnn
    with pytest.raises(TypeError, match="`cuts` must be 'auto' or a list"):
        costmodel.plan_pipeline(model, ["/CPU:0", "/CPU:1"], 16, cuts="relu1")
    with pytest.raises(ValueError, match="`cuts` must name 1 layers"):
        costmodel.plan_pipeline(model, ["/CPU:0", "/CPU:1"], 16, cuts=["relu1", "pool1"])
    with pytest.raises(ValueError, match="`memory_limit` must be"):
        costmodel.plan_pipeline(model, ["/CPU:0", "/CPU:1"], 16, memory_limit="lots")


def test_the_readme_example_is_the_one_tested_here():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    section = readme.split("### Know before you run")[1]
    command = re.search(r"```bash\n(python train.py [^\n]*)\n```", section).group(1)
    assert command.split()[2:] == README_EXAMPLE


@pytest.mark.parametrize("argv, message", [
    (["--memory-limit", "1GiB", "--gpus", "2", "--cuts", "relu1"],
     "--memory-limit steers the planned cuts .*add --plan"),
    (["--memory-limit", "1GiB", "--mode", "dp"], "to check --mode dp against it, add --plan"),
    (["--plan", "--cluster", "127.0.0.1:1,127.0.0.1:2"], "--plan prices the stages on this"),
])
def test_memory_limit_and_plan_flag_conflicts_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["--model", "small_cnn"] + argv)
    assert stop.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_training_plans_within_the_memory_limit():
    from tf_spectrain.app import trainers

    def build():
        return models.get_model("mlp", (8, 8, 1), 10)

    with pytest.raises(costmodel.MemoryLimitError, match="No cuts of model"):
        trainers.build_trainer(build, "sync", ["/CPU:0", "/CPU:1"], learning_rate=0.1,
                               memory_limit="1KiB", batch_size=8)


def test_peaks_are_read_where_devices_report_them(small_cnn, monkeypatch):
    # No GPU here: fake one that reports memory, to check what the plan does with it.
    from tf_spectrain.costmodel import preflight

    model, profile = small_cnn
    peaks = {"/GPU:0": 3 * MiB, "/GPU:1": 5 * MiB}
    calls = []
    monkeypatch.setattr(preflight, "_kind", lambda d: "GPU")
    monkeypatch.setattr(devices, "device_memory_bytes", lambda d: 4 * MiB)
    monkeypatch.setattr(preflight.tf.config.experimental, "reset_memory_stats", calls.append)
    monkeypatch.setattr(preflight.tf.config.experimental, "get_memory_info",
                        lambda d: {"current": 0, "peak": peaks[d]})
    monkeypatch.setattr(preflight.measure, "measure_stages",
                        lambda *args, **kwargs: calls.append(kwargs["device"]))
    run = costmodel.plan_pipeline(model, ["/GPU:0", "/GPU:1"], 16, cuts=["pool2"],
                                  profile=profile)
    assert calls == ["/GPU:0", "/GPU:1", ["/GPU:0", "/GPU:1"]]
    assert run.peaks == (3 * MiB, 5 * MiB) and run.device_memory == (4 * MiB,) * 2
    assert run.over == [k for k, s in enumerate(run.plan.stages) if s.memory_bytes > 4 * MiB]
    text = str(run)
    assert "one mini-batch in flight and no optimizer slots" in text
    assert [line.split()[7] for line in text.split("Predicted memory")[1].splitlines()[2:4]] == [
        "3.00", "5.00"]
