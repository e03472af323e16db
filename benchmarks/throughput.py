"""Throughput of every pipeline mode against single-device `model.fit`, measured side by side.

    python -m benchmarks.throughput                      # VGG16, batch 128, 4 stages
    python -m benchmarks.throughput --stages 2,4         # one table per pipeline depth
    python -m benchmarks.throughput --quick              # a small CNN, for a smoke run
    python -m benchmarks.throughput --out docs/THROUGHPUT.md

Besides images/s, each pipeline run reports every stage's utilisation over the timed epoch
(time in its passes / the epoch's wall time), the measured bubble (1 - mean utilisation),
and memory: the peak of each stage's device where TensorFlow can tell it (GPUs), else each
stage's estimate of what it kept alive (`tf_spectrain.runtime.memory`, with the most
weight copies it held for backwards, `peak_weight_copies`), and the process' peak resident
memory.

Each measurement runs in a fresh subprocess (TensorFlow's device and thread settings are
fixed per process) on synthetic 32x32x3 images: one warm-up fit (tracing: a short one for
`model.fit`, the whole epoch for a pipeline, whose windows trace each shape once), then one
timed epoch of `--steps` mini-batches. Configurations are interleaved over `--repeats`
rounds so that load on a shared machine hits them alike; the table reports the median
images/s of each and its ratio to the median of `single` (plain `model.fit` on one device,
default threads). Steady-state throughput is timed from the end of mini-batch `--skip` to
the end of the last one, so pipeline fill and drain are left out; the full-epoch figure
includes them.

On a CPU machine the stages' logical devices share the same cores, so the physical limit of
every ratio is about 1.0: the benchmark shows what the pipeline machinery costs, not
speed-up. On N GPUs the same script measures real pipelines.
"""

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import common

CONFIGS = {
    "single": dict(mode="single"),
    "dp": dict(mode="dp"),
    "sync": dict(mode="sync"),
    "stash": dict(mode="stash"),
    "spectrain-consistent": dict(mode="spectrain", target="consistent"),
    "spectrain-paper": dict(mode="spectrain", target="paper"),
    "vanilla": dict(mode="vanilla"),
    "nesterov": dict(mode="nesterov"),  # stash, each stage's optimizer in its Nesterov form
    "2bw": dict(mode="2bw"),  # PipeDream-2BW: one update per N mini-batches (accumulate=None)
    # The cost of watching: the default telemetry (per-step scalars with log_every="auto",
    # prediction error measured on every 10th mini-batch) on top of spectrain-paper.
    "spectrain-paper+telemetry": dict(mode="spectrain", target="paper", telemetry=True),
}
CUTS = {
    "vgg16": ["block2_pool", "block3_pool", "block4_pool"],
    "small_cnn": ["pool1", "flatten", "fc1"],
}
"""Fixed cuts at N = 4 (`stage_cuts`)."""
CUTS_BY_DEPTH = {
    # small_cnn has 6 layers with weights: stages 2 (relu1, pool1) and 5 (relu2, pool2) have none.
    ("small_cnn", 8): ["conv1", "bn1", "pool1", "conv2", "bn2", "pool2", "fc1"],
}
"""Fixed cuts at other depths, by (model, N)."""


def stage_cuts(model, stages):
    """The fixed cuts of `model` at N = `stages`, or None (planned: cuts="auto")."""
    if stages == 4:
        return CUTS.get(model)
    return CUTS_BY_DEPTH.get((model, stages))


def child(args):
    """One measurement in this process; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import warnings

    import tensorflow as tf

    if args.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    import tf_spectrain
    from tf_spectrain.app import trainers

    n = 1 if args.mode == "single" else args.stages
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        devices = tf_spectrain.setup_devices(n)
    import keras

    keras.utils.set_random_seed(0)
    full = common.synthetic_images(args.batch_size, args.steps)
    warm = full.take(args.warmup)
    trainer = trainers.build_trainer(
        lambda: tf_spectrain.models.get_model(args.model, (32, 32, 3), 10),
        args.mode,
        devices,
        learning_rate=0.01,
        momentum=0.9,
        cuts=stage_cuts(args.model, args.stages),
        spectrain_target=args.target,
        **pipeline_options(args),
    )

    clock = common.batch_clock()
    callbacks = [clock]
    if args.telemetry:
        import tempfile

        callbacks.append(tf_spectrain.callbacks.Telemetry(tempfile.mkdtemp(), prediction_every=10))
    # A pipeline in windows (steps_per_execution "auto") traces one graph per window shape:
    # its warm-up is the timed epoch itself, so that no tracing falls into the timing.
    pipeline_run = args.mode not in common.BASELINES
    trainer.fit(full if pipeline_run else warm, epochs=1, verbose=0)
    for device in devices:
        _reset_peak_memory(tf, device)
    with common.CpuClock() as cpu:
        trainer.fit(full, epochs=1, verbose=0, callbacks=callbacks)
    steady = clock.steady(args.batch_size, args.skip)
    # The whole epoch: for a pipeline the executor's wall time, which includes the drain
    # (the backward passes still running after the last mini-batch's loss, which the batch
    # callbacks report); for model.fit the first callback to the last.
    pipeline = trainer.state if isinstance(trainer, tf_spectrain.PipelineModel) else None
    seconds = pipeline.epoch_seconds if pipeline is not None else None
    whole = args.steps * args.batch_size / seconds if seconds else clock.whole(args.batch_size)
    out = {"steady": steady, "epoch": whole, "rss_mb": _peak_rss_mb(), "cores": cpu.cores}
    out["device_peak_mb"] = [_peak_memory_mb(tf, d) for d in devices]
    if pipeline is not None:
        wall = pipeline.epoch_seconds  # the whole epoch, drain included
        if any(pipeline.timelines):  # windows (steps_per_execution > 1) time no passes
            busy = [sum(e - s for _, _, s, e in timeline) for timeline in pipeline.timelines]
            out["utilisation"] = [b / wall for b in busy]
            out["bubble"] = 1 - sum(out["utilisation"]) / len(busy)
        # What each stage kept alive in the timed epoch (runtime.memory): an estimate from
        # the tensors kept, the per-stage figure a CPU run can give; `weight_copies`: the
        # most copies of its weights it held for backwards beside the current weights.
        out["stage_memory"] = [
            {"weights": m.weights, "slots": m.slots, "in_flight": m.peak_in_flight,
             "micro_batches": m.peak_micro_batches, "peak": m.peak,
             "weight_copies": m.peak_weight_copies}
            for m in pipeline.memory
        ]
    print(json.dumps(out))


def pipeline_options(args):
    """The `build_trainer` options of a pipeline child: micro-batches, schedule, recompute."""
    if args.mode in common.BASELINES:
        return {}
    return dict(micro_batches=args.micro_batches, schedule=args.schedule,
                recompute=args.recompute)


def child_flags(micro_batches=1, schedule="gpipe", recompute="auto"):
    """The child flags that set a pipeline's micro-batches, schedule and recompute."""
    return ["--micro-batches", str(micro_batches), "--schedule", schedule,
            "--recompute", recompute]


def _reset_peak_memory(tf, device):
    try:
        tf.config.experimental.reset_memory_stats(device)
    except (ValueError, RuntimeError, AttributeError):
        pass  # CPU devices keep no statistics


def _peak_memory_mb(tf, device):
    """The device's peak allocated memory in MB, or None where TensorFlow does not track it."""
    try:
        return tf.config.experimental.get_memory_info(device)["peak"] / 2**20
    except (ValueError, RuntimeError, AttributeError):
        return None


def _peak_rss_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def measure(name, args, stages):
    config = CONFIGS[name]
    flags = [
        "--child", "--model", args.model, "--mode", config["mode"],
        "--target", config.get("target", "paper"),
        "--stages", str(stages), "--batch-size", str(args.batch_size),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--skip", str(args.skip),
    ]
    if config.get("telemetry"):
        flags.append("--telemetry")
    if args.pipeline_intra_op and config["mode"] not in common.BASELINES:
        flags += ["--intra-op", str(args.pipeline_intra_op)]
    return common.run_json_child("benchmarks.throughput", flags, name)


def _median_list(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return None
    columns = [[v for v in column if v is not None] for column in zip(*values)]
    # A device TensorFlow keeps no statistics for (a CPU) gives None in every repeat.
    return [statistics.median(column) if column else None for column in columns]


def _memory(runs):
    devices = _median_list(runs, "device_peak_mb")
    rss = statistics.median(r["rss_mb"] for r in runs)
    if devices and all(d is not None for d in devices):
        return " / ".join(f"{d:.0f}" for d in devices) + f" (process {rss:.0f})"
    stages = runs[0].get("stage_memory")
    if stages:  # CPU devices: the stages' own estimates (the same in every repeat)
        estimate = " / ".join(f"{m['peak'] / 2**20:.0f}" for m in stages)
        return f"estimated {estimate} (process {rss:.0f})"
    return f"process {rss:.0f}"


def table(results, args, seconds):
    """Markdown: one row per configuration and depth, ratios to `single` of the same run."""
    base_runs = results[("single", 1)]
    base = statistics.median(r["steady"] for r in base_runs)
    base_epoch = statistics.median(r["epoch"] for r in base_runs)
    command = " ".join(["python", "-m", "benchmarks.throughput"] + sys.argv[1:])
    lines = [
        f"`{command}`: {args.model}, batch {args.batch_size}, "
        f"{args.steps} steps/epoch, median of {args.repeats} interleaved repeats, "
        f"{seconds / 60:.1f} min.",
        "",
        "| configuration | N | images/s (steady) | ratio to single | images/s (whole epoch) | "
        "ratio | CPU/wall | utilisation per stage | bubble | peak memory (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, n), runs in results.items():
        steady = statistics.median(r["steady"] for r in runs)
        epoch = statistics.median(r["epoch"] for r in runs)
        util = _median_list(runs, "utilisation")
        util_text = " / ".join(f"{u:.2f}" for u in util) if util else "-"
        bubbles = [r["bubble"] for r in runs if "bubble" in r]
        bubble = f"{statistics.median(bubbles):.2f}" if bubbles else "-"
        lines.append(
            f"| {name} | {n} | {steady:.1f} | {steady / base:.2f} | {epoch:.1f} | "
            f"{epoch / base_epoch:.2f} | {statistics.median(r['cores'] for r in runs):.2f} | "
            f"{util_text} | {bubble} | {_memory(runs)} |"
        )
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", default="vgg16")
    p.add_argument(
        "--stages", default="4", help="pipeline depth(s), e.g. 4 or 2,4 (dp uses as many devices)"
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=16, help="mini-batches in the timed epoch")
    p.add_argument("--warmup", type=int, default=3, help="mini-batches of the warm-up fit")
    p.add_argument("--skip", type=int, default=4, help="first mini-batches left out (fill)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--configs", default=",".join(c for c in CONFIGS if "+" not in c),
        help=f"comma-separated subset of {list(CONFIGS)}",
    )
    p.add_argument(
        "--pipeline-intra-op", type=int, default=0,
        help="intra-op threads for pipeline runs (0: TensorFlow's default)",
    )
    p.add_argument("--quick", action="store_true", help="small_cnn, batch 64, 8 steps, 1 repeat")
    p.add_argument("--out", default=None, help="also write the table to this file")
    # Child-only flags.
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="single", help=argparse.SUPPRESS)
    p.add_argument("--target", default="paper", help=argparse.SUPPRESS)
    p.add_argument("--intra-op", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--telemetry", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--micro-batches", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--schedule", default="gpipe", help=argparse.SUPPRESS)
    p.add_argument("--recompute", default="auto", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.stages = int(args.stages)
        return child(args)
    try:
        depths = [int(n) for n in args.stages.split(",")]
    except ValueError:
        p.error(f"--stages must be comma-separated integers such as 4 or 2,4; got {args.stages}")
    if any(n < 1 for n in depths):
        p.error(f"--stages must be integers >= 1; got {args.stages}")
    if args.quick:
        args.model, args.batch_size, args.steps, args.repeats = "small_cnn", 64, 8, 1
        args.skip = 2
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or "single" not in names:
        p.error(f"--configs must include 'single' and name only {list(CONFIGS)}; got {names}")
    if args.skip + 2 > args.steps:
        p.error(f"--steps must exceed --skip + 1; got --steps {args.steps} --skip {args.skip}")
    start = time.perf_counter()
    runs = [(n, 1) if n == "single" else (n, d) for d in depths for n in names]
    runs = list(dict.fromkeys(runs))  # single once
    results = {run: [] for run in runs}
    for r in range(args.repeats):
        for name, depth in runs:
            results[(name, depth)].append(measure(name, args, depth))
            print(f"round {r + 1}: {name} N={depth}: {results[(name, depth)][-1]}",
                  file=sys.stderr, flush=True)
    text = table(results, args, time.perf_counter() - start)
    common.publish(text, args.out)


if __name__ == "__main__":
    main()
