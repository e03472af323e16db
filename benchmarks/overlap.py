"""Do the stages of a 2-stage pipeline run at once? Images/s and CPU/wall of every mode.

    python -m benchmarks.overlap                         # VGG16, batch 64, 3 rounds
    python -m benchmarks.overlap --rounds 5 --out docs/overlap.md
    python -m benchmarks.overlap --quick                 # small_cnn, 1 round: a smoke run

The CPU stand-in for "two GPUs beat one" (issues 11 and 12). The reference is
single-device Keras `model.fit` with one intra-op and one inter-op thread: it uses exactly
one core. Every pipeline runs 2 stages with one intra-op thread, so each stage can use one
core of two and the ideal speed-up is 2.0. With `--cuts auto` (the default) every pipeline
process plans its own cuts (`PipelineModel(cuts="auto")`, profiled at the batch size in
that process, so the plan knows the mode: stages that recompute their forward, as in
vanilla and paper SpecTrain, get less of the model); `--cuts fixed` cuts VGG16 at
`block3_relu2` as issue 11 did (recomputing modes are then bounded near 1.5x).

Each run is a fresh process: a warm-up fit of `--warmup` mini-batches (tracing; pipelines in
windows, `--steps-per-execution` above 1 or "auto", also warm up on fits as long as the
timed ones, since each window shape is traced once), then a
short timed fit of `--short` mini-batches and a long one of `--long`, each timed from the
call of `fit` to its return (pipeline fill and drain included). Every window reports
images/s, process CPU time / wall time (about 2 when both stages compute at once, 1 when
they take turns) and how many seconds into the process it started. Configurations are
interleaved over `--rounds` rounds, so that drift of the machine hits them alike; the
table gives medians with the range over rounds, and ratios to the one-core single.
Every configuration gets the same batches, from a `tf.data` dataset without autotuning
(see `tf_spectrain.workflow.iterators` for why).
"""

import argparse
import json
import os
import sys
import time

from benchmarks import common

CONFIGS = {  # name: (mode, extra options); "single-1core" is the reference
    "single-1core": ("single", {}),
    "keras-default-threads": ("single", {}),
    "stash": ("stash", {}),
    "vanilla": ("vanilla", {}),
    "spectrain-paper": ("spectrain", {"spectrain_target": "paper"}),
    "spectrain-consistent": ("spectrain", {"spectrain_target": "consistent"}),
    "sync-M1": ("sync", {"micro_batches": 1}),
    "sync-M4": ("sync", {"micro_batches": 4}),
}
REFERENCE = "single-1core"
CUT_KINDS = ("auto", "fixed")
CUTS = {"vgg16": ["block3_relu2"], "small_cnn": ["pool1"]}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.overlap", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default="vgg16", choices=sorted(CUTS))
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    p.add_argument("--warmup", type=common.positive_int, default=3)
    p.add_argument("--short", type=common.positive_int, default=8, help="mini-batches")
    p.add_argument("--long", type=common.positive_int, default=32, help="mini-batches")
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--steps-per-execution", default="auto",
                   help="pipelines: mini-batches per graph call ('auto' or an int; 1: pass "
                   "by pass from the stage threads)")
    p.add_argument("--cuts", type=common.csv_of(str, CUT_KINDS), default=["auto"],
                   help="auto: each pipeline plans its cuts; fixed: the cut of issue 11; "
                   "auto,fixed: every pipeline both ways, interleaved")
    p.add_argument("--configs", type=common.csv_of(str, tuple(CONFIGS)), default=list(CONFIGS))
    p.add_argument("--quick", action="store_true", help="small_cnn, short windows, 1 round")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--jsonl", help="also append every run to this JSON-lines file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a configuration, in a fresh process
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.batch_size, args.short, args.long, args.rounds = (
            "small_cnn", 32, 4, 8, 1)
    if REFERENCE not in args.configs:
        p.error(f"--configs must include {REFERENCE!r} (the reference); got {args.configs}")
    return args


def child(args):
    """One configuration in this fresh process; prints one JSON line."""
    started = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import warnings

    import tensorflow as tf

    name = args.child
    mode, options = CONFIGS[name]
    if name != "keras-default-threads":
        tf.config.threading.set_intra_op_parallelism_threads(1)
    if name == REFERENCE:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import tf_spectrain
    from tf_spectrain.app import trainers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        devices = tf_spectrain.setup_devices(1 if mode == "single" else 2)
    keras.utils.set_random_seed(0)
    trainer = trainers.build_trainer(
        lambda: tf_spectrain.models.get_model(args.model, (32, 32, 3), 10),
        mode, devices, learning_rate=0.01, momentum=0.9,
        cuts=None if mode == "single" else ("auto" if args.cuts == ["auto"] else CUTS[args.model]),
        batch_size=args.batch_size,
        steps_per_execution=(args.steps_per_execution if args.steps_per_execution == "auto"
                             else int(args.steps_per_execution)),
        **options,
    )
    b = args.batch_size
    batches = common.window_batches(b, (args.warmup, args.short, args.long))

    trainer.fit(batches(args.warmup), epochs=1, verbose=0)
    if mode != "single" and args.steps_per_execution != "1":
        for steps in (args.short, args.long):  # every window shape of the timed fits
            trainer.fit(batches(steps), epochs=1, verbose=0)
    out = {"config": name, "model": args.model, "batch_size": b,
           "cuts": getattr(trainer, "cuts", None)}
    plan = getattr(trainer, "partition_plan", None)
    if plan is not None:
        out["predicted_balance"] = plan.balance
        out["planning_seconds"] = plan.profile_seconds
    for window in ("short", "long"):
        steps = getattr(args, window)
        data = batches(steps)
        clock = common.CpuClock()
        with clock:
            trainer.fit(data, epochs=1, verbose=0)
        out[window] = {
            "steps": steps, "images_per_second": steps * b / clock.wall,
            "cores": clock.cores, "wall": clock.wall,
            "started_after": clock.started - started,
        }
    print(json.dumps(out))


def runs(args):
    """`(label, configuration, cut kind)` of every run in a round, in order."""
    out = []
    for name in args.configs:
        if CONFIGS[name][0] == "single":
            out.append((name, name, args.cuts[0]))
            continue
        for kind in args.cuts:
            out.append((name if len(args.cuts) == 1 else f"{name} ({kind})", name, kind))
    return out


def measure(name, kind, args):
    flags = ["--child", name, "--model", args.model, "--batch-size", str(args.batch_size),
             "--cuts", kind, "--steps-per-execution", args.steps_per_execution,
             "--warmup", str(args.warmup), "--short", str(args.short), "--long", str(args.long)]
    return common.run_json_child("benchmarks.overlap", flags, name)


def table(results, args, minutes):
    """Markdown: per configuration and window, medians (range) over rounds."""
    where = (
        "with planned cuts (each run its own: see below)"
        if args.cuts == ["auto"]
        else f"at {CUTS[args.model][0]}"
        if args.cuts == ["fixed"]
        else f"with planned cuts (auto, each run its own) and at {CUTS[args.model][0]} (fixed)"
    )
    lines = [
        "`" + " ".join(["python -m benchmarks.overlap", *sys.argv[1:]]) + "`",
        "",
        f"{args.model}, batch {args.batch_size}, 2 stages {where}, a warm-up "
        f"fit of {args.warmup}, steps_per_execution={args.steps_per_execution} for pipelines, "
        f"then windows of {args.short} (short) and {args.long} (long) "
        f"mini-batches; {args.rounds} interleaved rounds of fresh processes, {minutes:.1f} "
        "min. Medians, (min-max) over rounds; speed-up = images/s / the same round's "
        f"{REFERENCE} images/s.",
        "",
        "| configuration | window | images/s | speed-up | CPU/wall | starts after (s) |",
        "|---|---|---|---|---|---|",
    ]
    reference = results[REFERENCE]
    for name, runs in results.items():
        for window in ("short", "long"):
            ips = [r[window]["images_per_second"] for r in runs]
            ratios = [r[window]["images_per_second"] / ref[window]["images_per_second"]
                      for r, ref in zip(runs, reference)]
            lines.append(
                f"| {name} | {window} ({args.short if window == 'short' else args.long}) | "
                f"{common.spread(ips, '.1f')} | {common.spread(ratios, '.2f')} | "
                f"{common.spread([r[window]['cores'] for r in runs], '.2f')} | "
                f"{common.spread([r[window]['started_after'] for r in runs], '.0f')} |"
            )
    return "\n".join(lines)


def runs_table(results):
    """Markdown: every run of every configuration, round by round (images/s and CPU/wall)."""
    lines = [
        "| configuration | round | cut | short: images/s | short: CPU/wall | long: images/s "
        "| long: CPU/wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        for r, run in enumerate(runs, 1):
            cut = ", ".join(run.get("cuts") or []) or "-"
            lines.append(
                f"| {name} | {r} | {cut} | {run['short']['images_per_second']:.1f} | "
                f"{run['short']['cores']:.2f} | {run['long']['images_per_second']:.1f} | "
                f"{run['long']['cores']:.2f} |"
            )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child(args)
    start = time.perf_counter()
    results = {label: [] for label, _, _ in runs(args)}
    for r in range(args.rounds):
        for label, name, kind in runs(args):
            record = measure(name, kind, args)
            results[label].append(record)
            if args.jsonl:
                common.append_jsonl(args.jsonl, dict(record, round=r, cut_kind=kind))
            print(f"round {r + 1}: {label}: short {record['short']['images_per_second']:.1f} "
                  f"images/s on {record['short']['cores']:.2f} cores, long "
                  f"{record['long']['images_per_second']:.1f} on "
                  f"{record['long']['cores']:.2f}", file=sys.stderr, flush=True)
    text = table(results, args, (time.perf_counter() - start) / 60)
    text += "\n\nEvery run:\n\n" + runs_table(results)
    common.publish(text, args.out)
    return None


if __name__ == "__main__":
    main()
