"""Accuracy by mode: the SpecTrain paper's comparison, on the embedded digits set.

    python -m benchmarks.accuracy --quick          # a few minutes: VGG, N=4, lr 0.03, 1 seed
    python -m benchmarks.accuracy                  # the full grid, under an hour on 2 cores
    python -m benchmarks.accuracy --help           # every option

Every configuration (single device, data parallel over 4 replicas, and the pipeline modes
sync, vanilla, stash, SpecTrain with the paper's and the consistent target) trains the same
model from the same initial weights on the same batches (per seed), with momentum SGD at
the same learning rate, and is evaluated on the test set after every epoch. The models are
made for this 2-core CPU (see `common.py`): `vgg` (VGG16's layer pattern, widths / 8) and
`resnet20` (ResNet-20 on inputs halved to 16x16), cut into N = 4 or 8 stages balanced by a
multiply-accumulate estimate. The reference `sync` (sequential SGD, the algorithm of
`single`: a check of the pipeline machinery, not a new data point) runs on the first seed
only unless `--reference-seeds 0`.

Runs are grouped by trainer (model, configuration, N): each group runs in its own process
(`--workers` at a time; 0: all in this process) and reuses its trainer for every seed and
learning rate. Each finished run is appended to `<work-dir>/<group>.jsonl`, so an
interrupted benchmark continues where it stopped (`--fresh` starts over). At the end the
script prints markdown tables (final test accuracy and training loss, mean and spread over
seeds; differences to single-device training), writes them to `<work-dir>/accuracy.md` and
draws the learning curves: test accuracy (`--plot`) and training loss (`--plot-loss`), PNG.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import common

PIPELINES = ("sync", "vanilla", "stash", "spectrain-paper", "spectrain-consistent")
DP_REPLICAS = 4  # the paper's machine: 4 GPUs

# The reference `sync` (sequential SGD, the algorithm of `single`) trains on the first seed
# only: it checks the pipeline machinery, and `single` already gives that algorithm's spread.
# Everything else, `dp` (the paper's baseline) included, trains on every seed.
SETTINGS = {
    "quick": dict(models=["vgg"], stages=[4], seeds=[0], epochs=3, lrs=[0.03],
                  reference_seeds=1, workers=0),
    "full": dict(models=["vgg", "resnet20"], stages=[4, 8], seeds=[0, 1, 2], epochs=4,
                 lrs=[0.01, 0.03], reference_seeds=1, workers=2),
}
REFERENCES = ("sync",)

# Seconds per digits epoch (batch 32, evaluation included) and per group (process start,
# building and tracing), measured on the 2-core development machine while other jobs
# shared it (load average 4-5); only used for the estimate printed before starting.
EPOCH_SECONDS = {
    ("vgg", "single"): 4.0, ("vgg", "dp"): 20.0, ("vgg", 4): 7.0, ("vgg", 8): 7.0,
    ("resnet20", "single"): 6.0, ("resnet20", "dp"): 16.0, ("resnet20", 4): 9.0,
    ("resnet20", 8): 9.0,
    ("small_cnn", "single"): 1.5, ("small_cnn", "dp"): 3.0, ("small_cnn", 4): 2.5,
    ("small_cnn", 8): 3.0,
    ("lm", "single"): 60.0, ("lm", "dp"): 90.0, ("lm", 4): 90.0, ("lm", 8): 90.0,  # guesses
}
# Text classifiers: seconds per 1,000 imdb_reviews training reviews, one process (measured
# 2026-12-02: single, sync and N=4 runs of both classifiers averaged about 21; dp and N=8
# are guesses).
TEXT_SECONDS_PER_1000 = {"single": 20.0, "dp": 30.0, 4: 22.0, 8: 26.0}
GROUP_SECONDS = 20.0
TRAIN_SIZE = 1437  # digits training images
# Two processes at a time on 2 cores did the work of this many (measured: 1.3).
PARALLEL_GAIN = {1: 1.0, 2: 1.3}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.accuracy",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="the few-minute setting")
    p.add_argument("--models", type=common.csv_of(str, common.MODEL_NAMES))
    p.add_argument("--configs", type=common.csv_of(str, list(common.CONFIGS)),
                   default=list(common.CONFIGS), help="configurations to compare")
    p.add_argument("--stages", type=common.csv_of(int, (2, 3, 4, 5, 6, 7, 8)),
                   help="pipeline depths N")
    p.add_argument("--seeds", type=common.csv_of(int))
    p.add_argument("--lrs", type=common.csv_of(float), help="learning rates")
    p.add_argument("--epochs", type=common.positive_int)
    p.add_argument("--limit", type=common.positive_int, help="training examples to use")
    p.add_argument("--batch-size", type=common.positive_int, default=32)
    p.add_argument("--optimizer", choices=common.OPTIMIZERS, default="sgd",
                   help="momentum SGD (0.9) or AdamW; its default weight decay (5e-4, 0.01)")
    p.add_argument("--reference-seeds", type=common.non_negative_int,
                   help="run sync on only the first this many seeds (0: all)")
    p.add_argument("--workers", type=common.non_negative_int,
                   help="groups run at once, each in its own process (0: in this process)")
    p.add_argument("--work-dir", help="results of each run (default runs/benchmarks/accuracy-"
                   "<quick|full>)")
    p.add_argument("--plot", help="learning-curve PNG (default <work-dir>/accuracy.png)")
    p.add_argument("--plot-loss", help="training-loss PNG (default: --plot's name + -loss)")
    p.add_argument("--data-dir", help="tensorflow-datasets dir in which imdb_reviews is prepared "
                   "(models classifier, lstm; see benchmarks/prepare_imdb.py)")
    p.add_argument("--steps-per-execution", type=_window, default="auto",
                   help="the pipelines' steps_per_execution: auto (windows of 8) or an int "
                   "(1: a graph call per mini-batch); the same steps")
    p.add_argument("--fresh", action="store_true", help="ignore earlier results in work-dir")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a group's job file (internal)
    args = p.parse_args(argv)
    setting = "quick" if args.quick else "full"
    for name, value in SETTINGS[setting].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.setting = setting
    suffix = setting if args.optimizer == "sgd" else f"{setting}-{args.optimizer}"
    args.work_dir = args.work_dir or os.path.join("runs", "benchmarks", f"accuracy-{suffix}")
    args.plot = args.plot or os.path.join(args.work_dir, "accuracy.png")
    args.plot_loss = args.plot_loss or os.path.splitext(args.plot)[0] + "-loss.png"
    return args


def _window(text):
    """`--steps-per-execution`: "auto" or an int >= 1."""
    return text if text == "auto" else common.positive_int(text)


def grid(args):
    """The `RunSpec`s of the benchmark: every model, configuration, depth, lr and seed.

    `single` runs once per model, lr and seed (stages 1), `dp` on `DP_REPLICAS` replicas;
    the pipeline configurations once per depth N; `sync` on the first `reference_seeds`
    seeds (0: all).
    """
    specs = []
    for model in args.models:
        for config in args.configs:
            if config == "single":
                depths = [1]
            elif config == "dp":
                depths = [DP_REPLICAS]
            else:
                depths = args.stages
            for n in depths:
                seeds = args.seeds
                if config in REFERENCES and args.reference_seeds:
                    seeds = args.seeds[: args.reference_seeds]
                for lr in args.lrs:
                    for seed in seeds:
                        specs.append(common.RunSpec(
                            model, config, n, lr, seed, args.epochs,
                            batch_size=args.batch_size, limit=args.limit,
                            **common.optimizer_settings(args.optimizer),
                        ))
    return specs


def _kind(spec):
    return spec.config if spec.config in common.BASELINES else spec.stages


def estimate_seconds(specs, workers):
    """Wall time the runs `specs` should take (see `EPOCH_SECONDS`)."""
    seconds = GROUP_SECONDS * len({s.trainer_key for s in specs})
    for spec in specs:
        if spec.model in common.TEXT_MODELS:
            per_1000 = TEXT_SECONDS_PER_1000.get(_kind(spec), 22.0)
            seconds += spec.epochs * (spec.limit or 25_000) / 1000 * per_1000
            continue
        fraction = min(spec.limit or TRAIN_SIZE, TRAIN_SIZE) / TRAIN_SIZE
        seconds += spec.epochs * fraction * EPOCH_SECONDS.get((spec.model, _kind(spec)), 6.0)
    return seconds / PARALLEL_GAIN.get(workers, 1.0)


def _group_file(work_dir, key):
    return os.path.join(work_dir, "-".join(str(part) for part in key) + ".jsonl")


def _done(work_dir, specs):
    """The records already in `work_dir` for `specs`, by spec."""
    wanted = {json.dumps(s.as_dict(), sort_keys=True): s for s in specs}
    found = {}
    for key in {s.trainer_key for s in specs}:
        for record in common.read_jsonl(_group_file(work_dir, key)):
            name = json.dumps(record["spec"], sort_keys=True)
            if name in wanted:
                found[wanted[name]] = record["result"]
    return found


def run_group(runner, specs, path):
    """Runs `specs` (one trainer) with `runner`, appending each result to `path`."""
    for spec in specs:
        result = runner.run(spec)
        common.append_jsonl(path, {"spec": spec.as_dict(), "result": result})
        acc = result["test_accuracy"][-1]
        print(f"  {spec.model} {spec.config} N={spec.stages} lr={spec.lr:g} seed={spec.seed}: "
              f"test accuracy {acc:.3f}, {result['seconds']:.0f} s on "
              f"{result.get('cores', float('nan')):.2f} cores (CPU/wall)", flush=True)


def child(job_file):
    """Runs one group in this process (the `--child` entry point)."""
    with open(job_file, encoding="utf-8") as f:
        job = json.load(f)
    specs = [common.RunSpec(**s) for s in job["specs"]]
    devices = common.prepare_tensorflow(max(s.stages for s in specs))
    run_group(common.Runner(devices, job.get("data_dir"), job.get("steps_per_execution", "auto")),
              specs, job["path"])


def run_all(specs, args):
    """Runs the specs not yet done, grouped by trainer; returns {spec: result}."""
    if args.fresh:
        for key in {s.trainer_key for s in specs}:
            if os.path.exists(_group_file(args.work_dir, key)):
                os.remove(_group_file(args.work_dir, key))
    done = _done(args.work_dir, specs)
    todo = [s for s in specs if s not in done]
    groups = {}
    for spec in todo:
        groups.setdefault(spec.trainer_key, []).append(spec)
    # Longest groups first, so that parallel workers finish together.
    order = sorted(groups.values(), key=lambda g: -estimate_seconds(g, 1))
    estimate = estimate_seconds(todo, max(args.workers, 1))
    print(f"{len(specs)} runs, {len(done)} already done; {len(todo)} to run in "
          f"{len(groups)} groups with --workers {args.workers}: estimated "
          f"{estimate / 60:.0f} min on the 2-core development machine (see EPOCH_SECONDS).",
          flush=True)
    started = time.perf_counter()
    if not todo:
        pass
    elif args.workers == 0:
        runner = common.Runner(
            common.prepare_tensorflow(max(s.stages for s in todo)), args.data_dir,
            args.steps_per_execution,
        )
        for group in order:
            run_group(runner, group, _group_file(args.work_dir, group[0].trainer_key))
    else:
        _run_processes(order, args, started)
    print(f"Done in {(time.perf_counter() - started) / 60:.1f} min.", flush=True)
    return _done(args.work_dir, specs)


def _run_processes(order, args, started):
    os.makedirs(args.work_dir, exist_ok=True)
    pending, running, finished = list(order), [], 0
    while pending or running:
        while pending and len(running) < args.workers:
            group = pending.pop(0)
            fd, job_file = tempfile.mkstemp(suffix=".json", dir=args.work_dir)
            with os.fdopen(fd, "w") as f:
                json.dump({"specs": [s.as_dict() for s in group],
                           "path": _group_file(args.work_dir, group[0].trainer_key),
                           "data_dir": args.data_dir,
                           "steps_per_execution": args.steps_per_execution}, f)
            cmd, env = common.child_command("benchmarks.accuracy", ["--child", job_file])
            running.append((subprocess.Popen(cmd, env=env), group, job_file))
        time.sleep(1.0)
        for entry in list(running):
            proc, group, job_file = entry
            if proc.poll() is None:
                continue
            running.remove(entry)
            os.remove(job_file)
            finished += 1
            model, config, stages = group[0].trainer_key[:3]
            if proc.returncode != 0:
                raise SystemExit(f"The group {model} {config} N={stages} failed (exit status "
                                 f"{proc.returncode}); its finished runs are kept.")
            print(f"[{finished}/{len(order)}] {model} {config} N={stages} done; "
                  f"{(time.perf_counter() - started) / 60:.1f} min so far.", flush=True)


# --- tables and plot -----------------------------------------------------------------------


def _pct(summary, diverged, seeds):
    if summary["n"] == 0:
        return "n/a"
    if summary["n"] == 1:
        return f"{100 * summary['mean']:.1f} (1 seed)" + (" (diverged)" if diverged else "")
    text = f"{100 * summary['mean']:.1f} ± {100 * summary['std']:.1f}"
    return text + (f" ({diverged} diverged)" if diverged else "")


def _final(results, spec_filter):
    runs = [r for s, r in results.items() if spec_filter(s)]
    acc = common.summarise([r["test_accuracy"][-1] for r in runs])
    loss = common.summarise([r["train_loss"][-1] for r in runs])
    return acc, loss, sum(r["diverged"] for r in runs), runs


def _matcher(model, config, lr, n):
    """A predicate: is a run spec of this model, configuration, lr and depth?"""

    def matches(spec):
        if spec.model != model or spec.config != config or spec.lr != lr:
            return False
        return config in common.BASELINES or spec.stages == n

    return matches


def tables(results, args):
    """Markdown: per model, final accuracy and loss by configuration, and differences."""
    out = []
    columns = [(lr, n) for lr in args.lrs for n in args.stages]
    heads = [f"lr {lr:g}, N={n}" for lr, n in columns]
    for model in args.models:
        acc_rows, loss_rows = [], []
        for config in args.configs:
            acc_row, loss_row = [config], [config]
            for lr, n in columns:
                acc, loss, diverged, _ = _final(results, _matcher(model, config, lr, n))
                acc_row.append(_pct(acc, diverged, len(args.seeds)))
                loss_row.append("n/a" if loss["n"] == 0 else f"{loss['mean']:.3f}")
            acc_rows.append(acc_row)
            loss_rows.append(loss_row)
        what = "token accuracy" if model == "lm" else "test accuracy"
        out += [f"**{model}: final {what}, % (mean ± std over seeds)**", "",
                common.markdown_table(["configuration"] + heads, acc_rows), "",
                f"**{model}: final training loss (mean over seeds)**", "",
                common.markdown_table(["configuration"] + heads, loss_rows), ""]
        if model == "lm":
            out += _test_loss_table(results, args, model, columns, heads)
        out += _difference_table(results, args, model, columns, heads)
    out += paired_table(results, args)
    return "\n".join(out)


def _test_loss_table(results, args, model, columns, heads):
    """Markdown: the language model's final test loss per token and perplexity, by mode."""
    rows = []
    for config in args.configs:
        row = [config]
        for lr, n in columns:
            runs = [r for s, r in results.items() if _matcher(model, config, lr, n)(s)]
            losses = common.summarise([r["test_loss"][-1] for r in runs if r.get("test_loss")])
            if losses["n"] == 0:
                row.append("n/a")
                continue
            spread = f" ± {losses['std']:.3f}" if losses["n"] > 1 else ""
            row.append(f"{losses['mean']:.3f}{spread} ({math.exp(losses['mean']):.1f})")
        rows.append(row)
    return [f"**{model}: final test loss per token (mean ± std over seeds; perplexity "
            "exp(mean) in brackets)**", "",
            common.markdown_table(["configuration"] + heads, rows), ""]


def paired_wins(results, a, b):
    """How often configuration `a` ends with a lower training loss than `b` on the same runs.

    Two runs pair up when they share model, learning rate and seed (so initial weights and
    batches), and N unless one of them is a baseline (`single`, `dp`), which has no N. A
    diverged run (NaN loss) loses to a finite one; two diverged runs count for neither.

    Returns:
        `(wins, pairs)`.
    """
    def key(spec, with_n):
        return (spec.model, spec.lr, spec.seed) + ((spec.stages,) if with_n else ())

    with_n = a not in common.BASELINES and b not in common.BASELINES
    of_b = {}
    for spec, run in results.items():
        if spec.config == b:
            of_b.setdefault(key(spec, with_n), []).append(run)
    wins = pairs = 0
    for spec, run in results.items():
        if spec.config != a:
            continue
        for other in of_b.get(key(spec, with_n), []):
            pairs += 1
            mine, theirs = run["train_loss"][-1], other["train_loss"][-1]
            if math.isfinite(mine) and (not math.isfinite(theirs) or mine < theirs):
                wins += 1
    return wins, pairs


def paired_table(results, args):
    """Markdown: for each pair of configurations, paired wins on final training loss."""
    configs = [c for c in args.configs if any(s.config == c for s in results)]
    if len(configs) < 2:
        return []
    rows = []
    for a in configs:
        row = [a]
        for b in configs:
            wins, pairs = paired_wins(results, a, b) if a != b else (0, 0)
            row.append(f"{wins}/{pairs}" if pairs else "-")
        rows.append(row)
    return ["**Paired comparison, all models, learning rates and N: runs where the row ends "
            "with a lower final training loss than the column, on the same seed (initial "
            "weights and batches)**", "",
            common.markdown_table(["row lower than column"] + configs, rows), ""]


def _difference_table(results, args, model, columns, heads):
    """Mean accuracy difference to `single` (points) ± its standard error."""
    if "single" not in args.configs:
        return []
    rows = []
    for config in [c for c in args.configs if c != "single"]:
        row = [config]
        for lr, n in columns:
            a, _, _, _ = _final(results, _matcher(model, config, lr, n))
            b, _, _, _ = _final(results, _matcher(model, "single", lr, n))
            if a["n"] == 0 or b["n"] == 0:
                row.append("n/a")
                continue
            # Diverged runs count at chance accuracy here, as in the accuracy table.
            mean_a, mean_b = a["mean"], b["mean"]
            if min(a["n"], b["n"]) < 2:  # no spread to estimate an error from
                row.append(f"{100 * (mean_a - mean_b):+.1f} (1 seed)")
                continue
            se = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
            row.append(f"{100 * (mean_a - mean_b):+.1f} ± {100 * se:.1f}")
        rows.append(row)
    return [f"**{model}: test accuracy minus single-device, points (± standard error)**", "",
            common.markdown_table(["configuration"] + heads, rows), ""]


def plot(results, args, path, key="test_accuracy"):
    """A learning curve per configuration: one panel per model, lr and N.

    Args:
        results: {RunSpec: result} from `run_all`.
        args: the parsed arguments (models, lrs, stages, configs, epochs).
        path: the PNG to write.
        key: `"test_accuracy"` (linear axis, 0 to 1) or `"train_loss"` (log axis;
            diverged epochs, recorded as NaN, are left out).
    """
    plt = common.pyplot()
    from matplotlib.ticker import MaxNLocator

    panels = [(m, lr, n) for m in args.models for lr in args.lrs for n in args.stages]
    cols = len(args.stages)
    rows = len(args.models) * len(args.lrs)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    colours = plt.get_cmap("tab10")
    epochs = range(1, args.epochs + 1)
    for ax, (model, lr, n) in zip(axes.flat, panels):
        for c, config in enumerate(args.configs):
            runs = [r for s, r in results.items() if _matcher(model, config, lr, n)(s)]
            if not runs:
                continue
            per_epoch = [common.summarise(v) for v in zip(*(r[key] for r in runs))]
            mean = [e["mean"] for e in per_epoch]  # NaN (not drawn) if every run diverged
            low = [e["min"] for e in per_epoch]
            high = [e["max"] for e in per_epoch]
            label = f"dp ({DP_REPLICAS} replicas)" if config == "dp" else config
            style = "--" if config in common.BASELINES else "-"
            ax.plot(epochs, mean, style, color=colours(c), label=label, linewidth=1.5)
            ax.fill_between(epochs, low, high, color=colours(c), alpha=0.12)
        ax.set_title(f"{model}, N={n}, lr {lr:g}", fontsize=10)
        ax.set_xlabel("epoch")
        if key == "test_accuracy":
            ax.set_ylabel("test accuracy")
            ax.set_ylim(0, 1)
        else:
            ax.set_ylabel("training loss (epoch mean)")
            ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"batch {args.batch_size}, {args.optimizer}; mean over seeds "
                 f"{','.join(map(str, args.seeds))}, band: min-max", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def describe(args):
    """The setting in one paragraph, with each model's cuts and stage shares."""
    import tf_spectrain  # noqa: F401 - TensorFlow is already set up here

    data_text = " ".join(sorted({common.dataset_of(m) for m in args.models})) + " "
    lines = [f"`{' '.join(['python', '-m', 'benchmarks.accuracy'] + sys.argv[1:])}`: "
             f"{data_text}({args.limit or 'all'} training examples), batch {args.batch_size}, "
             f"{args.epochs} epochs, {common.describe_optimizer(args.optimizer)}, seeds "
             f"{', '.join(map(str, args.seeds))}"
             + (f" (sync: the first {args.reference_seeds})"
                if 0 < args.reference_seeds < len(args.seeds) else "")
             + f"; dp on {DP_REPLICAS} replicas."]
    for model in args.models:
        m = common.build_model(model)
        for n in args.stages:
            cuts, shares = common.balanced_cuts(m, n)
            lines.append(f"- {model} ({m.count_params():,} weights), N={n}: cuts "
                         f"{', '.join(cuts)}; stage shares of the compute "
                         f"{', '.join(f'{100 * s:.0f}%' for s in shares)}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        child(args.child)
        return None
    specs = grid(args)
    results = run_all(specs, args)
    if args.workers != 0:  # the parent has not started TensorFlow yet
        common.prepare_tensorflow(1)
    report = "\n".join([describe(args), "", tables(results, args)])
    plot(results, args, args.plot)
    plot(results, args, args.plot_loss, key="train_loss")
    path = os.path.join(args.work_dir, "accuracy.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(report + f"\n\nLearning curves: {args.plot}, {args.plot_loss}\n")
    print(report)
    print(f"\nWrote {path}, {args.plot} and {args.plot_loss}.")
    return results


if __name__ == "__main__":
    main()
