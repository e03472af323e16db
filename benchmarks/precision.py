"""Accuracy and speed of `mixed_bfloat16` against float32, on the digits benchmark models.

    python -m benchmarks.precision               # vgg and resnet20, N = 4, 3 seeds (~25 min)
    python -m benchmarks.precision --quick       # vgg, seed 0, 2 epochs
    python -m benchmarks.precision --out docs/PRECISION.md

Each model (`common.build_model`: `vgg`, `resnet20`) trains with plain Keras `model.fit` on
one device (`single`, the reference for what the precision itself does) and as a 4-stage
pipeline in `sync` and in paper SpecTrain (`spectrain-paper`), from the same initial weights
on the same batches per seed (as `benchmarks.accuracy`), once with float32 and once built
under the Keras dtype
policy `mixed_bfloat16` (layers compute in bfloat16, variables, momentum and the predicted
weights stay float32; no loss scaling, as in Keras). The two precisions of a seed run one
after the other in this process, so their epoch times are measured side by side. The
report gives the final test accuracy of each (mean and range over seeds), the paired
difference, and the ratio of the epoch times (median and range over seeds; evaluation
included, the first epoch, which traces, left out) with the process' CPU time / wall time
of each.

bfloat16 is a GPU and TPU format: this CPU may run it no faster than float32, or slower.
"""

import argparse
import statistics
import sys
import time

from benchmarks import common

CONFIGS = ("single", "sync", "spectrain-paper")
PRECISIONS = ("float32", "mixed_bfloat16")


def specs(args):
    """The `RunSpec`s, each float32 run followed by its bfloat16 twin."""
    out = []
    for model in args.models:
        for config in CONFIGS:
            for seed in args.seeds:
                for precision in PRECISIONS:
                    out.append(common.RunSpec(model, config, args.stages, args.lr, seed,
                                              args.epochs, precision=precision))
    return out


def _steady_seconds(result):
    """Median epoch seconds after the first (which traces); the first if it is the only."""
    seconds = result["epoch_seconds"]
    return statistics.median(seconds[1:] if len(seconds) > 1 else seconds)


def _mean_range(values, fmt):
    """`"mean (min to max)"` of `values` (one value: itself)."""
    mean = format(statistics.fmean(values), fmt)
    if len(values) == 1:
        return mean
    return f"{mean} ({format(min(values), fmt)} to {format(max(values), fmt)})"


def table(results):
    """Markdown: one row per model and configuration; `results` maps spec -> result."""
    lines = [
        "| model | configuration | seeds | float32 accuracy | mixed_bfloat16 accuracy | "
        "difference (bf16 - f32) | epoch time bf16 / f32 | CPU/wall f32, bf16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = {}
    for spec, result in results.items():
        rows.setdefault((spec.model, spec.config), {}).setdefault(spec.seed, {})[
            spec.precision] = result
    for (model, config), seeds in rows.items():
        pairs = [s for s in seeds.values() if all(p in s for p in PRECISIONS)]
        acc = {p: [s[p]["test_accuracy"][-1] for s in pairs] for p in PRECISIONS}
        diffs = [b - a for a, b in zip(acc["float32"], acc["mixed_bfloat16"])]
        ratios = [_steady_seconds(s["mixed_bfloat16"]) / _steady_seconds(s["float32"])
                  for s in pairs]
        cores = {p: statistics.median(s[p]["cores"] for s in pairs) for p in PRECISIONS}

        lines.append(
            f"| {model} | {config} | {len(pairs)} | {_mean_range(acc['float32'], '.3f')} | "
            f"{_mean_range(acc['mixed_bfloat16'], '.3f')} | {_mean_range(diffs, '+.3f')} | "
            f"{common.spread(ratios, '.2f')} | {cores['float32']:.2f}, "
            f"{cores['mixed_bfloat16']:.2f} |"
        )
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision",
                                description=__doc__.split("\n")[0])
    p.add_argument("--models", type=common.csv_of(str, common.MODEL_NAMES),
                   default=["vgg", "resnet20"])
    p.add_argument("--seeds", type=common.csv_of(int), default=[0, 1, 2])
    p.add_argument("--epochs", type=common.positive_int, default=4)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--stages", type=common.positive_int, default=4)
    p.add_argument("--quick", action="store_true", help="vgg, seed 0, 2 epochs")
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args()
    if args.quick:
        args.models, args.seeds, args.epochs = ["vgg"], [0], 2
    devices = common.prepare_tensorflow(args.stages)
    runner = common.Runner(devices)
    start = time.perf_counter()
    results = {}
    for spec in specs(args):
        results[spec] = result = runner.run(spec)
        print(f"{spec.model} {spec.config} seed {spec.seed} {spec.precision}: test accuracy "
              f"{result['test_accuracy'][-1]:.3f}, epoch {_steady_seconds(result):.1f} s, "
              f"{result['cores']:.2f} cores", file=sys.stderr, flush=True)
    command = " ".join(["python", "-m", "benchmarks.precision"] + sys.argv[1:])
    text = (f"`{command}`: N = {args.stages}, lr {args.lr:g}, {args.epochs} epochs, batch 32, "
            f"seeds {', '.join(map(str, args.seeds))}, {(time.perf_counter() - start) / 60:.1f} "
            f"min.\n\n{table(results)}\n")
    common.publish(text, args.out)


if __name__ == "__main__":
    main()
