"""Smoke tests of `benchmarks.accuracy` and `benchmarks.prediction` on a tiny setting.

Both scripts run in this process (conftest's 4 logical devices) on the zoo's `small_cnn`, 64
digits and 2 epochs. Their outputs are checked against independent computations: the
tables against statistics recomputed with NumPy from the raw JSON-lines records, the `sync`
pipeline against single-device `model.fit` (both are sequential SGD), a reused trainer
against a fresh one, and the measured prediction horizons against SpecTrain's version-gap
formula written out here.
"""

import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import accuracy, common, prediction
from tf_spectrain import checkpoint

N = 4
LR = 0.01
TINY = [
    "--models", "small_cnn", "--stages", str(N), "--lrs", str(LR), "--epochs", "2",
    "--limit", "64", "--batch-size", "16",
]
ACCURACY_CONFIGS = ["single", "sync", "spectrain-paper"]
SEEDS = [0, 1]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def accuracy_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("accuracy")
    argv = TINY + [
        "--configs", ",".join(ACCURACY_CONFIGS), "--seeds", ",".join(map(str, SEEDS)),
        "--reference-seeds", "0", "--workers", "0", "--work-dir", str(work),
    ]
    results = accuracy.main(argv)
    return work, argv, results


@pytest.fixture(scope="module")
def prediction_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("prediction")
    prediction.main(TINY + ["--every", "1", "--work-dir", str(work)])
    return work, common.read_jsonl(str(work / "prediction.jsonl"))


def records(work):
    out = []
    for path in sorted(work.glob("*.jsonl")):
        out += common.read_jsonl(str(path))
    return out


def table_after(text, title):
    """The rows (lists of cells) of the first markdown table after a line holding `title`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    return rows[0], rows[2:]  # header, body (without the |---| line)


# --- accuracy.py -------------------------------------------------------------------------


def test_accuracy_table_has_a_row_per_configuration(accuracy_run):
    work, _, _ = accuracy_run
    text = (work / "accuracy.md").read_text()
    for title in ("final test accuracy", "final training loss", "minus single-device"):
        header, body = table_after(text, title)
        assert header == ["configuration", f"lr {LR:g}, N={N}"]
        expected = [c for c in ACCURACY_CONFIGS if title != "minus single-device" or c != "single"]
        assert [row[0] for row in body] == expected


def test_accuracy_table_matches_the_records(accuracy_run):
    work, _, _ = accuracy_run
    _, body = table_after((work / "accuracy.md").read_text(), "final test accuracy")
    found = records(work)
    assert len(found) == len(ACCURACY_CONFIGS) * len(SEEDS)
    for row in body:
        finals = [r["result"]["test_accuracy"][-1] for r in found if r["spec"]["config"] == row[0]]
        assert len(finals) == len(SEEDS)
        mean, std = re.match(r"([\d.]+) ± ([\d.]+)", row[1]).groups()
        assert float(mean) == pytest.approx(100 * np.mean(finals), abs=0.051)
        assert float(std) == pytest.approx(100 * np.std(finals, ddof=1), abs=0.051)


def test_accuracy_numbers_are_plausible(accuracy_run):
    work, _, _ = accuracy_run
    for record in records(work):
        result = record["result"]
        assert len(result["test_accuracy"]) == len(result["train_loss"]) == 2
        assert all(0.0 <= a <= 1.0 for a in result["test_accuracy"])
        # Cross-entropy over 10 classes: positive, and from near log(10) at the start.
        assert all(0.0 < v < 3 * math.log(10) for v in result["train_loss"])
        assert not result["diverged"]
        assert (result["cuts"] is None) == (record["spec"]["config"] == "single")


def test_accuracy_plot_is_a_png(accuracy_run):
    work, _, _ = accuracy_run
    for name in ("accuracy.png", "accuracy-loss.png"):
        assert (work / name).read_bytes()[:8] == PNG


def test_sync_pipeline_trains_like_single_device_fit(accuracy_run):
    """`sync` is sequential SGD: the same curve as plain Keras `model.fit`."""
    work, _, _ = accuracy_run
    by = {(r["spec"]["config"], r["spec"]["seed"]): r["result"] for r in records(work)}
    for seed in SEEDS:
        single, sync = by[("single", seed)], by[("sync", seed)]
        np.testing.assert_allclose(sync["train_loss"], single["train_loss"], rtol=1e-4)
        np.testing.assert_allclose(sync["test_accuracy"], single["test_accuracy"], atol=1e-6)


def test_reused_trainer_trains_like_a_fresh_one(accuracy_run):
    """Seed 1 ran on the trainer that had trained seed 0: a new trainer must agree."""
    work, _, results = accuracy_run
    spec = next(s for s in results if s.config == "spectrain-paper" and s.seed == SEEDS[-1])
    fresh = common.Runner(common.prepare_tensorflow(N)).run(spec)
    np.testing.assert_allclose(fresh["train_loss"], results[spec]["train_loss"], rtol=1e-6)
    np.testing.assert_allclose(fresh["test_accuracy"], results[spec]["test_accuracy"])


def test_accuracy_resumes_without_rerunning(accuracy_run, capsys):
    work, argv, results = accuracy_run
    before = len(records(work))
    again = accuracy.main(argv)
    assert len(records(work)) == before
    assert f"{before} already done; 0 to run" in capsys.readouterr().out
    assert {s: r["test_accuracy"] for s, r in again.items()} == {
        s: r["test_accuracy"] for s, r in results.items()
    }


# --- prediction.py -----------------------------------------------------------------------


def paper_gaps(k, n):
    """SpecTrain's version gaps (SPECTRAIN.md section 4), written out independently."""
    return k // 2 + n - 1 - k, k // 2


def test_prediction_horizons_follow_the_version_gaps(prediction_run):
    _, runs = prediction_run
    assert [r["spec"]["config"] for r in runs] == list(prediction.CONFIGS)
    for run in runs:
        config = run["spec"]["config"]
        measured = run["measurements"]
        assert measured, config
        for m in measured:
            s_f, s_b = paper_gaps(m["stage"], N)
            if config == "spectrain-consistent":
                expected = {"forward": N - 1 - m["stage"]}
            else:  # paper, and the staleness SpecTrain's paper rule corrects
                expected = {"forward": s_f, "backward": s_b}
            assert m["target_version"] - m["used_version"] == expected[m["pass"]]
            assert expected[m["pass"]] > 0


def test_vanilla_and_stash_measure_the_staleness_itself(prediction_run):
    """Without prediction a forward uses the stage's current weights, so the distance is
    the staleness (ratio 1); so does vanilla's backward. Stash's backward uses the
    forward's older weights: not the current ones.

    The probe computes the two distances separately, and float32 sums in TensorFlow may
    round differently (one ulp) from one computation to the other: compared to 1e-6."""
    _, runs = prediction_run
    by_config = {run["spec"]["config"]: run["measurements"] for run in runs}
    for config in ("vanilla", "stash"):
        for m in by_config[config]:
            if config == "vanilla" or m["pass"] == "forward":
                assert m["baseline"] > 0
                assert m["error"] == pytest.approx(m["baseline"], rel=1e-6)
                assert m["ratio"] == pytest.approx(1.0, rel=1e-6)
    stash_backward = [m for m in by_config["stash"] if m["pass"] == "backward"]
    assert stash_backward
    assert any(m["error"] != pytest.approx(m["baseline"], rel=1e-5) for m in stash_backward)


def test_prediction_tables_match_the_records(prediction_run):
    work, runs = prediction_run
    text = (work / "prediction.md").read_text()
    header, body = table_after(text, "Mean prediction error ratio per stage")
    assert header == ["setting", "pass"] + [f"stage {k}" for k in range(N)]
    rows = {(row[0], row[1]): row[2:] for row in body}
    for run in runs:
        config = run["spec"]["config"]
        if not config.startswith("spectrain"):
            continue
        for kind in ("forward", "backward"):
            label = (f"{config}, N={N}, lr {LR:g} (small_cnn)", kind)
            for k in range(N):
                ratios = [m["ratio"] for m in run["measurements"]
                          if m["stage"] == k and m["pass"] == kind and math.isfinite(m["ratio"])]
                if not ratios:
                    assert label not in rows or rows[label][k] == "-"
                    continue
                assert float(rows[label][k]) == pytest.approx(np.mean(ratios), abs=5e-4)
    header, body = table_after(text, "Mean forward distance")
    assert [row[0].split(",")[0] for row in body] == list(prediction.CONFIGS)


def test_prediction_plots_are_pngs(prediction_run):
    work, _ = prediction_run
    for name in ("prediction.png", "staleness.png"):
        assert (work / name).read_bytes()[:8] == PNG


# --- pure helpers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [[0.5], [0.9, 0.95, 0.97], [0.1, float("nan"), 0.3], [2.0, 2.0, 2.0, 5.0]],
)
def test_summarise_matches_numpy(values):
    finite = np.array([v for v in values if math.isfinite(v)])
    got = common.summarise(values)
    assert got["mean"] == pytest.approx(finite.mean())
    assert got["std"] == pytest.approx(finite.std(ddof=1) if len(finite) > 1 else 0.0)
    assert (got["min"], got["max"]) == (finite.min(), finite.max())
    assert got["n_nan"] == len(values) - len(finite)


def test_summarise_of_nothing_finite_is_nan():
    got = common.summarise([float("nan")])
    assert math.isnan(got["mean"]) and got["n"] == 0 and got["n_nan"] == 1


@pytest.mark.parametrize(
    "kind, choices, text, message",
    [
        (float, None, "0.01,abc", "not a valid float"),
        (float, None, "0.01,-1", "finite number > 0"),
        (float, None, "0.01,inf", "finite number > 0"),
        (int, None, "0,0", "twice"),
        (int, None, "-1", ">= 0"),
        (str, ("vgg", "resnet20"), "vgg,resnet2", "did you mean 'resnet20'"),
        (str, ("vgg",), " , ", "at least one"),
    ],
)
def test_list_arguments_reject_bad_values(kind, choices, text, message):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=message):
        common.csv_of(kind, choices)(text)


@pytest.mark.parametrize("text, expected", [("0.01,0.03", [0.01, 0.03]), ("1e-2", [0.01])])
def test_list_arguments_parse(text, expected):
    assert common.csv_of(float)(text) == expected


def test_child_processes_run_the_benchmarks_as_modules_from_anywhere(tmp_path):
    """Children start as `python -m benchmarks.<name>` with the repository first on their
    PYTHONPATH, so they find the package whatever the working directory."""
    import subprocess

    cmd, env = common.child_command("benchmarks.accuracy", ["--help"], {"PYTHONPATH": "/x"})
    assert cmd[1:] == ["-m", "benchmarks.accuracy", "--help"]
    assert env["PYTHONPATH"].split(os.pathsep) == [common.ROOT, "/x"]
    assert os.path.isfile(os.path.join(common.ROOT, "benchmarks", "__init__.py"))
    cmd, env = common.child_command("benchmarks.accuracy", ["--help"])
    out = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage: python -m benchmarks.accuracy")


def test_markdown_table_rejects_ragged_rows():
    with pytest.raises(ValueError, match="Every row must have 2 cells"):
        common.markdown_table(["a", "b"], [["1", "2"], ["3"]])


@pytest.mark.parametrize(
    "configs, stages, lrs, seeds, reference_seeds",
    [
        ("single", "4,8", "0.01", "0,1,2", "0"),
        ("dp,sync", "4", "0.01,0.03", "0", "0"),
        ("sync,vanilla", "4,8", "0.01", "0,1,2", "1"),
        ("single,dp,vanilla,spectrain-paper", "4,8", "0.01,0.03", "0,1,2", "2"),
    ],
)
def test_grid_runs_baselines_once_and_pipelines_per_depth(configs, stages, lrs, seeds,
                                                           reference_seeds):
    args = accuracy.parse_args(["--models", "vgg", "--configs", configs, "--stages", stages,
                                "--lrs", lrs, "--seeds", seeds,
                                "--reference-seeds", reference_seeds])
    specs = accuracy.grid(args)
    n_seeds = len(seeds.split(","))
    n_reference = min(int(reference_seeds), n_seeds) or n_seeds
    expected = 0
    for c in configs.split(","):
        depths = 1 if c in ("single", "dp") else len(stages.split(","))
        seeds_of_c = n_reference if c == "sync" else n_seeds
        expected += depths * len(lrs.split(",")) * seeds_of_c
    assert len(specs) == len(set(specs)) == expected
    for spec in specs:
        want = {"single": {1}, "dp": {accuracy.DP_REPLICAS}}.get(
            spec.config, {int(n) for n in stages.split(",")})
        assert spec.stages in want


@pytest.mark.parametrize("model", ["vgg", "resnet20"])
def test_balanced_cuts_give_every_stage_weights(model):
    import tf_spectrain

    built = common.build_model(model)
    for n in range(2, 9):
        cuts, shares = common.balanced_cuts(built, n)
        assert len(cuts) == n - 1
        assert sum(shares) == pytest.approx(1.0)
        for stage in tf_spectrain.partition.split_model(built, cuts):
            assert stage.count_params() > 0, (model, n, cuts)


def test_paired_table_counts_wins_on_the_same_seed(accuracy_run):
    """Recounts the paired table from the raw records, matching runs by seed."""
    work, _, _ = accuracy_run
    header, body = table_after((work / "accuracy.md").read_text(), "Paired comparison")
    assert header[1:] == ACCURACY_CONFIGS
    final = {(r["spec"]["config"], r["spec"]["seed"]): r["result"]["train_loss"][-1]
             for r in records(work)}
    for row in body:
        for b, cell in zip(header[1:], row[1:]):
            if b == row[0]:
                assert cell == "-"
                continue
            wins = sum(final[(row[0], s)] < final[(b, s)] for s in SEEDS)
            assert cell == f"{wins}/{len(SEEDS)}"
    # The table is not trivially zero: single-device SGD and spectrain differ somewhere.
    assert any(cell not in ("-", "0/2") for row in body for cell in row[1:])


def test_data_parallel_baseline_is_large_batch_sgd():
    """The benchmarks' `dp` (Keras fit under MirroredStrategy) takes the same steps as
    single-device SGD on the whole batch: the gradients of the replicas' shares of the
    batch are averaged, not summed. Checked on a model without BatchNorm (with BatchNorm
    each replica normalises its own share, the one intended difference).

    The gradients are reduced on one device here, not with collective ops: TensorFlow's
    collective group and instance keys are shared by every MirroredStrategy in a process,
    and a second strategy on the same devices (test_cli's `dp` run) then fails with
    "joining a group with size 2, but that group has size 4" or a shape mismatch. How
    the sum is formed does not change whether the replicas' gradients are averaged."""
    import keras
    import tensorflow as tf
    from conftest import DEVICES

    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.integers(0, 3, 64).astype("int32")

    def train(scope):
        with scope:
            keras.utils.set_random_seed(5)
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, "tanh"),
                                      keras.layers.Dense(3)])
            model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        start = model.get_weights()
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return start, model.get_weights()

    start, single = train(tf.device(DEVICES[0]))
    strategy = tf.distribute.MirroredStrategy(
        DEVICES[:4], cross_device_ops=tf.distribute.ReductionToOneDevice())
    dp_start, dp = train(strategy.scope())
    for a, b in zip(dp_start, start):
        np.testing.assert_array_equal(a, b)
    # Training moved the weights far more than the tolerance below.
    assert max(np.abs(w - w0).max() for w, w0 in zip(single, start)) > 0.05
    for a, b in zip(dp, single):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_horizon_table_pools_ratios_by_version_gap(prediction_run):
    """Recomputes the ratio-by-horizon table from the records, with the horizon taken from
    SpecTrain's version-gap formula (not from the recorded versions)."""
    work, runs = prediction_run
    header, body = table_after((work / "prediction.md").read_text(), "Ratio by horizon")
    assert header[:3] == ["pass", "horizon (updates ahead)", "measurements"]
    expected = {}
    for run in runs:
        config = run["spec"]["config"]
        if not config.startswith("spectrain"):
            continue
        for m in run["measurements"]:
            s_f, s_b = paper_gaps(m["stage"], N)
            if config == "spectrain-consistent":
                h = N - 1 - m["stage"]
            else:
                h = s_f if m["pass"] == "forward" else s_b
            expected.setdefault((m["pass"], h), []).append(m["ratio"])
    assert len(body) == len(expected) >= 3
    for row in body:
        ratios = np.array(expected[(row[0], int(row[1]))])
        assert int(row[2]) == len(ratios)
        assert float(row[3]) == pytest.approx(ratios.mean(), abs=5e-4)
        assert float(row[4]) == pytest.approx(np.median(ratios), abs=5e-4)
        assert row[5] == f"{100 * np.mean(ratios < 1):.0f}%"


def test_prediction_report_only_redoes_the_tables_without_training(prediction_run, tmp_path):
    work, _ = prediction_run
    before = (work / "prediction.md").read_text()
    runs = prediction.main(TINY + ["--work-dir", str(work), "--report-only",
                                   "--plot", str(tmp_path / "p.png"),
                                   "--plot-distance", str(tmp_path / "d.png")])
    assert len(runs) == len(prediction.CONFIGS)
    after = (work / "prediction.md").read_text()
    # The same tables; only the command line in the first line differs.
    assert after.splitlines()[1:] == before.splitlines()[1:]
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG
    with pytest.raises(SystemExit, match="--report-only needs"):
        prediction.main(TINY + ["--work-dir", str(tmp_path / "empty"), "--report-only"])


def test_the_benchmarks_take_the_library_modes():
    from tf_spectrain.schedule import modes

    assert common.BASELINES == modes.BASELINES
    assert {mode for mode, _ in common.CONFIGS.values()} == set(modes.ALL_MODES)


def test_run_json_child_names_a_failed_child_and_shows_its_stderr():
    with pytest.raises(RuntimeError, match=r"(?s)overlap smoke failed:\n.*--bogus"):
        common.run_json_child("benchmarks.overlap", ["--bogus"], "overlap smoke")


def test_synthetic_images_are_fixed_batches_without_an_autotuner():
    ds = common.synthetic_images(batch_size=4, steps=3)
    assert ds.options().autotune.enabled is False
    batches = [(x.numpy(), y.numpy()) for x, y in ds]
    assert [x.shape for x, _ in batches] == [(4, 32, 32, 3)] * 3
    again = [x.numpy() for x, _ in common.synthetic_images(batch_size=4, steps=3)]
    np.testing.assert_array_equal(batches[0][0], again[0])  # the same data in every process
    assert all(0 <= y.min() and y.max() < 10 for _, y in batches)


def test_benchmark_optimizers_are_the_trainers():
    from tf_spectrain.app import trainers

    assert common.OPTIMIZERS == trainers.OPTIMIZERS
    for name in common.OPTIMIZERS:
        settings = common.optimizer_settings(name)
        assert settings == dict(optimizer=name, weight_decay=trainers.DEFAULT_WEIGHT_DECAY[name])


def test_the_language_models_test_loss_table_gives_mean_spread_and_perplexity():
    import argparse

    specs = [common.RunSpec("lm", c, 4, 1e-3, seed, 1, optimizer="adamw", weight_decay=0.01)
             for c in ("sync", "stash") for seed in (0, 1)]
    losses = {("sync", 0): 2.0, ("sync", 1): 2.2, ("stash", 0): 3.0, ("stash", 1): 3.0}
    results = {s: {"test_loss": [9.0, losses[(s.config, s.seed)]]} for s in specs}
    args = argparse.Namespace(configs=["sync", "stash", "vanilla"])
    text = "\n".join(accuracy._test_loss_table(results, args, "lm", [(1e-3, 4)], ["h"]))
    assert "| sync | 2.100 ± 0.141 (8.2) |" in text  # exp(2.1) = 8.17
    assert "| stash | 3.000 ± 0.000 (20.1) |" in text
    assert "| vanilla | n/a |" in text


def test_a_reused_trainer_gets_its_optimizers_fresh_values_back():
    # NAdam (mode nesterov with AdamW) keeps a running product that starts at 1, not 0.
    spec = common.RunSpec("small_cnn", "nesterov", 2, 0.001, 0, 1, optimizer="adamw",
                          weight_decay=0.01)
    runner = common.Runner(common.prepare_tensorflow(2))
    trainer, _ = runner.trainer(spec)
    optimizers = checkpoint.trainer_optimizers(trainer)
    fresh = [[v.numpy() for v in o.variables] for o in optimizers]
    assert any(np.any(value == 1.0) for values in fresh for value in values)
    for optimizer in optimizers:
        for variable in optimizer.variables:
            variable.assign(variable + tf.ones_like(variable))
    runner.trainer(spec)
    for optimizer, values in zip(optimizers, fresh):
        for variable, value in zip(optimizer.variables, values):
            np.testing.assert_array_equal(variable.numpy(), value)
