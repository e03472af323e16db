"""Prediction quality: how close SpecTrain's predicted weights come to the weights aimed at.

    python -m benchmarks.prediction --quick        # a few minutes: VGG, N=4, lr 0.01
    python -m benchmarks.prediction                # VGG, N=4 and 8, lr 0.01 and 0.03
    python -m benchmarks.prediction --help

Each configuration trains on digits with `tf_spectrain.callbacks.Telemetry` measuring, on
every `--every`-th mini-batch and every stage, the distance between the weights a pass used
and the weights the stage really holds once it has applied the updates the pass aimed at
(`tf_spectrain.runtime.probe`):

    ratio = |W_used - W_target| / |W_stale - W_target|

`W_stale` is the stage's weights when the pass ran, what naive pipelining uses; below 1 the
prediction beats stale weights. SpecTrain is measured with the paper's target (forward and
backward predictions) and the consistent one (one forward prediction, reused). For vanilla
and stash, which do not predict, `W_used = W_stale` and the distance is the staleness
itself, against the version SpecTrain's paper rule aims at: the error SpecTrain corrects.

The script prints three tables (mean ratio per stage; ratio by horizon, i.e. how many
updates ahead a prediction looks; mean distance per stage), writes them to
`<work-dir>/prediction.md` with every measurement in `<work-dir>/prediction.jsonl`, and
draws the ratio per stage over epochs (`--plot`) and the distances (`--plot-distance`).
`--report-only` redoes the tables and plots from the records without training.
"""

import argparse
import math
import os
import statistics
import sys
import tempfile

from benchmarks import common

CONFIGS = ("spectrain-paper", "spectrain-consistent", "vanilla", "stash")
SETTINGS = {
    "quick": dict(models=["vgg"], stages=[4], lrs=[0.01], epochs=3),
    "full": dict(models=["vgg"], stages=[4, 8], lrs=[0.01, 0.03], epochs=4),
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.prediction",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="the few-minute setting")
    p.add_argument("--models", type=common.csv_of(str, common.MODEL_NAMES))
    p.add_argument("--configs", type=common.csv_of(str, CONFIGS), default=list(CONFIGS))
    p.add_argument("--stages", type=common.csv_of(int, (2, 3, 4, 5, 6, 7, 8)))
    p.add_argument("--lrs", type=common.csv_of(float), help="learning rates")
    p.add_argument("--epochs", type=common.positive_int)
    p.add_argument("--seed", type=common.non_negative_int, default=0)
    p.add_argument("--every", type=common.positive_int, default=2,
                   help="measure every this many mini-batches (Telemetry prediction_every)")
    p.add_argument("--limit", type=common.positive_int, help="training examples to use")
    p.add_argument("--batch-size", type=common.positive_int, default=32)
    p.add_argument("--optimizer", choices=common.OPTIMIZERS, default="sgd",
                   help="momentum SGD (0.9) or AdamW; its default weight decay (5e-4, 0.01)")
    p.add_argument("--work-dir", help="default runs/benchmarks/prediction-<quick|full>")
    p.add_argument("--plot", help="ratio PNG (default <work-dir>/prediction.png)")
    p.add_argument("--plot-distance", help="distance PNG (default <work-dir>/staleness.png)")
    p.add_argument("--report-only", action="store_true",
                   help="redo the tables and plots from <work-dir>/prediction.jsonl")
    args = p.parse_args(argv)
    setting = "quick" if args.quick else "full"
    for name, value in SETTINGS[setting].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    suffix = setting if args.optimizer == "sgd" else f"{setting}-{args.optimizer}"
    args.work_dir = args.work_dir or os.path.join("runs", "benchmarks", f"prediction-{suffix}")
    args.plot = args.plot or os.path.join(args.work_dir, "prediction.png")
    args.plot_distance = args.plot_distance or os.path.join(args.work_dir, "staleness.png")
    return args


def measure(runner, spec, every, logdir):
    """Trains `spec` with telemetry; returns (result, measurements).

    Each measurement is a dict of `tf_spectrain.runtime.probe.WeightProbe.take_results`
    (`stage`, `pass`, `epoch`, `batch`, `used_version`, `target_version`, `error`,
    `baseline`, `ratio`).
    """
    import tf_spectrain

    telemetry = tf_spectrain.callbacks.Telemetry(logdir, prediction_every=every)
    result = runner.run(spec, callbacks=[telemetry])
    return result, list(telemetry.predictions)


def run_all(args):
    """Runs every configuration; returns a list of `(spec, result, measurements)`."""
    devices = common.prepare_tensorflow(max(args.stages))
    runner = common.Runner(devices)
    path = os.path.join(args.work_dir, "prediction.jsonl")
    os.makedirs(args.work_dir, exist_ok=True)
    if os.path.exists(path):
        os.remove(path)
    runs = []
    for model in args.models:
        for lr in args.lrs:
            for n in args.stages:
                for config in args.configs:
                    spec = common.RunSpec(model, config, n, lr, args.seed, args.epochs,
                                          batch_size=args.batch_size, limit=args.limit,
                                          **common.optimizer_settings(args.optimizer))
                    with tempfile.TemporaryDirectory() as logdir:
                        result, found = measure(runner, spec, args.every, logdir)
                    common.append_jsonl(path, {"spec": spec.as_dict(), "result": result,
                                               "measurements": found})
                    runs.append((spec, result, found))
                    print(f"  {model} {config} N={n} lr={lr:g}: {len(found)} measurements, "
                          f"test accuracy {result['test_accuracy'][-1]:.3f}, "
                          f"{result['seconds']:.0f} s", flush=True)
    return runs


def read_runs(args):
    """The runs recorded in `<work-dir>/prediction.jsonl` (for `--report-only`)."""
    path = os.path.join(args.work_dir, "prediction.jsonl")
    records = common.read_jsonl(path)
    if not records:
        raise SystemExit(f"--report-only needs the records of an earlier run; {path} "
                         "is missing or empty.")
    return [(common.RunSpec(**r["spec"]), r["result"], r["measurements"]) for r in records]


def mean_by(measurements, value, *keys):
    """Means of `value` over the measurements grouped by `keys` (finite values only).

    Returns:
        A dict from the tuple of key values to `(mean, count)`.
    """
    groups = {}
    for m in measurements:
        if math.isfinite(m[value]):
            groups.setdefault(tuple(m[k] for k in keys), []).append(m[value])
    return {k: (sum(v) / len(v), len(v)) for k, v in groups.items()}


def _label(spec):
    label = f"{spec.config}, N={spec.stages}, lr {spec.lr:g}"
    if spec.optimizer != "sgd":
        label += f", {spec.optimizer}"
    return label + (f" ({spec.model})" if spec.model != "vgg" else "")


def ratio_table(runs):
    """Mean ratio per stage and pass, for the predicting configurations."""
    width = max(s.stages for s, _, _ in runs)
    rows = []
    for spec, _, found in runs:
        if not spec.config.startswith("spectrain"):
            continue
        means = mean_by(found, "ratio", "stage", "pass")
        for kind in ("forward", "backward"):
            cells = [f"{means[(k, kind)][0]:.3f}" if (k, kind) in means else "-"
                     for k in range(width)]
            if any(c != "-" for c in cells):
                rows.append([_label(spec), kind] + cells)
    head = ["setting", "pass"] + [f"stage {k}" for k in range(width)]
    return common.markdown_table(head, rows)


def distance_table(runs):
    """Mean |W_used - W_target| of forward passes per stage (vanilla, stash: staleness)."""
    width = max(s.stages for s, _, _ in runs)
    rows = []
    for spec, _, found in runs:
        forward = [m for m in found if m["pass"] == "forward"]
        error = mean_by(forward, "error", "stage")
        stale = mean_by(forward, "baseline", "stage")
        cells = []
        for k in range(width):
            if (k,) not in error:
                cells.append("-")
            elif spec.config.startswith("spectrain"):
                cells.append(f"{error[(k,)][0]:.4f} ({stale[(k,)][0]:.4f})")
            else:
                cells.append(f"{error[(k,)][0]:.4f}")
        rows.append([_label(spec)] + cells)
    head = ["setting"] + [f"stage {k}" for k in range(width)]
    return common.markdown_table(head, rows)


def horizon_table(runs):
    """The ratio by how far ahead the prediction looks, over every predicting run.

    The horizon of a measurement is `target_version - used_version`: SpecTrain's version
    gap (`s_f(k)` or `s_b(k)` for the paper's target, `N - 1 - k` for the consistent one).
    """
    groups = {}
    for spec, _, found in runs:
        if not spec.config.startswith("spectrain"):
            continue
        for m in found:
            if math.isfinite(m["ratio"]):
                key = (m["pass"], m["target_version"] - m["used_version"])
                groups.setdefault(key, []).append(m["ratio"])
    rows = []
    for (kind, h), ratios in sorted(groups.items()):
        below = sum(r < 1 for r in ratios) / len(ratios)
        rows.append([kind, h, len(ratios), f"{statistics.fmean(ratios):.3f}",
                     f"{statistics.median(ratios):.3f}", f"{100 * below:.0f}%"])
    head = ["pass", "horizon (updates ahead)", "measurements", "mean ratio", "median ratio",
            "prediction better than stale"]
    return common.markdown_table(head, rows)


def _epoch_curve(found, stage, kind, value="ratio"):
    means = mean_by([m for m in found if m["stage"] == stage and m["pass"] == kind],
                    value, "epoch")
    epochs = sorted(e for (e,) in means)
    return [e + 1 for e in epochs], [means[(e,)][0] for e in epochs]


def _plot_panels(runs, path, title, draw, sharey=False):
    """One panel per run, 4 to a row, each drawn by `draw(ax, spec, found, colour)`.

    Every panel gets the run's label as title, integer epochs on the x axis, a grid and a
    legend; panels left over in the last row are blanked. `colour(k)` gives stage k of
    the run its colour. The figure is written to `path`.
    """
    plt = common.pyplot()
    from matplotlib.ticker import MaxNLocator

    cols = min(4, len(runs))
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False,
                             sharey=sharey)
    viridis = plt.get_cmap("viridis")
    for ax, (spec, _, found) in zip(axes.flat, runs):
        draw(ax, spec, found, lambda k, n=spec.stages: viridis(k / max(n - 1, 1)))
        ax.set_title(_label(spec), fontsize=9)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_ratios(runs, path):
    """Ratio per stage over epochs: one panel per predicting configuration and setting."""
    runs = [r for r in runs if r[0].config.startswith("spectrain")]
    if not runs:
        return

    def draw(ax, spec, found, colour):
        for k in range(spec.stages):
            for kind, style in (("forward", "-"), ("backward", "--")):
                x, y = _epoch_curve(found, k, kind)
                if x:
                    label = f"stage {k}" if kind == "forward" else None
                    ax.plot(x, y, style, marker=".", color=colour(k), label=label)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel("|W_hat - W_target| / |W_stale - W_target|", fontsize=7)
        ax.set_ylim(bottom=0)

    _plot_panels(runs, path, "prediction error ratio per stage (solid: forward, dashed: "
                 "backward); below 1 the prediction beats stale weights", draw)


def plot_distances(runs, path):
    """Forward-pass distance to the target per stage over epochs, every configuration."""

    def draw(ax, spec, found, colour):
        for k in range(spec.stages):
            x, y = _epoch_curve(found, k, "forward", "error")
            if x:
                ax.plot(x, y, marker=".", color=colour(k), label=f"stage {k}")
        ax.set_yscale("log")
        ax.set_ylabel("|W_used - W_target|", fontsize=8)

    _plot_panels(runs, path, "forward pass: distance of the weights used to the weights "
                 "aimed at (vanilla, stash: the staleness)", draw, sharey=True)


def report(runs, args):
    """The markdown of the three tables, with the command."""
    command = " ".join(["python", "-m", "benchmarks.prediction"] + sys.argv[1:])
    return "\n".join([
        f"`{command}`: digits, batch {args.batch_size}, {args.epochs} epochs, "
        f"{common.describe_optimizer(args.optimizer)}, "
        f"seed {args.seed}; measured on mini-batches 0, {args.every}, {2 * args.every}, ... "
        "of every epoch, on every stage.", "",
        "**Mean prediction error ratio per stage** (`|W_hat - W_target| / "
        "|W_stale - W_target|`; below 1: better than stale weights)", "",
        ratio_table(runs), "",
        "**Ratio by horizon**: all predicting runs above, pooled by pass and by how many "
        "updates ahead the prediction looks", "",
        horizon_table(runs), "",
        "**Mean forward distance `|W_used - W_target|` per stage** (SpecTrain: its error, "
        "with the stale weights' distance in brackets; vanilla, stash: the staleness)", "",
        distance_table(runs),
    ])


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    runs = read_runs(args) if args.report_only else run_all(args)
    text = report(runs, args)
    for path in (args.plot, args.plot_distance):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    plot_ratios(runs, args.plot)
    plot_distances(runs, args.plot_distance)
    out = os.path.join(args.work_dir, "prediction.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    print(f"\nWrote {out}, {args.plot} and {args.plot_distance}.")
    return runs


if __name__ == "__main__":
    main()
