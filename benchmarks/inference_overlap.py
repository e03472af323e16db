"""Does pipelined inference keep both stages busy? `evaluate` and `predict`, images/s.

    python -m benchmarks.inference_overlap                    # VGG16, batch 64, 3 rounds
    python -m benchmarks.inference_overlap --rounds 5 --out docs/inference_overlap.md
    python -m benchmarks.inference_overlap --quick            # small_cnn: a smoke run

Issue 13's measurement, set up as issue 7's training overlap (`benchmarks/overlap.py`):
the reference is the wrapped Keras model's own `evaluate` / `predict` on one device with
one intra-op and one inter-op thread (exactly one core); the pipeline has 2 stages with
one intra-op thread (ideal 2.0). In each pipeline process the stages run the same data
both ways, alternating: one after another in one thread ("sequential", what `evaluate`
did before) and as a forward-only pipeline ("pipelined", what it does now).

Each configuration is a fresh process, interleaved over `--rounds` rounds. Every window
is timed from the call to its return, after one untimed pass over the same data (tracing),
and reports images/s and process CPU time / wall time.
"""

import argparse
import json
import os
import sys
import time

from benchmarks import common

REFERENCE = "keras-1core"
PIPELINE = "pipeline"
PATHS = ("sequential", "pipelined")
TASKS = ("evaluate", "predict")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.inference_overlap", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default="vgg16", choices=("vgg16", "small_cnn"))
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    p.add_argument("--batches", type=common.positive_int, default=16,
                   help="batches per window (the last one 24 examples short)")
    p.add_argument("--repeats", type=common.positive_int, default=2,
                   help="windows of each path per pipeline process, alternating")
    p.add_argument("--mode", default="stash", help="the pipeline's mode (its planned cuts)")
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--quick", action="store_true", help="small_cnn, 4 batches, 1 round")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--child", help=argparse.SUPPRESS, choices=(REFERENCE, PIPELINE))
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.batch_size, args.batches, args.rounds, args.repeats = (
            "small_cnn", 32, 4, 1, 1)
    return args


def child(args):
    """One configuration in this fresh process; prints one JSON line."""
    started = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import warnings

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.child == REFERENCE:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import tf_spectrain
    from tf_spectrain.app import trainers
    from tf_spectrain.runtime import inference
    from tf_spectrain.workflow.iterators import without_autotune

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        devices = tf_spectrain.setup_devices(1 if args.child == REFERENCE else 2)
    keras.utils.set_random_seed(0)
    mode = "single" if args.child == REFERENCE else args.mode
    trainer = trainers.build_trainer(
        lambda: tf_spectrain.models.get_model(args.model, (32, 32, 3), 10),
        mode, devices, learning_rate=0.01, momentum=0.9, metrics=["accuracy"],
        batch_size=args.batch_size,
    )
    b = args.batch_size
    n = b * args.batches - 24
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, n).astype("int32")
    labelled = without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).batch(b).prefetch(2))
    inputs = without_autotune(tf.data.Dataset.from_tensor_slices(x).batch(b).prefetch(2))

    if args.child == REFERENCE:
        work = {
            ("evaluate", "keras"): lambda: trainer.evaluate(labelled, verbose=0),
            ("predict", "keras"): lambda: trainer.predict(inputs, verbose=0),
        }
        order = [("evaluate", "keras"), ("predict", "keras")] * args.repeats
    else:
        pipe = trainer
        pipe.copy_weights_to_stages()

        evaluator = inference.Evaluator(pipe.runners, pipe.model, pipe.loss, pipe.metrics)

        def evaluate(pipelined):
            return evaluator(labelled, None, pipelined=pipelined)

        def predict(pipelined):
            return inference.collect_outputs(pipe.runners, inputs, False, pipelined=pipelined)

        work = {}
        for path in PATHS:
            work[("evaluate", path)] = lambda p=path: evaluate(p == "pipelined")
            work[("predict", path)] = lambda p=path: predict(p == "pipelined")
        order = [(task, path) for _ in range(args.repeats) for task in TASKS for path in PATHS]
    for key in dict.fromkeys(order):
        work[key]()  # untimed: tracing
    out = {"config": args.child, "model": args.model, "batch_size": b, "images": n,
           "cuts": getattr(trainer, "cuts", None), "windows": []}
    for task, path in order:
        clock = common.CpuClock()
        with clock:
            work[(task, path)]()
        out["windows"].append({
            "task": task, "path": path, "images_per_second": n / clock.wall,
            "cores": clock.cores, "started_after": clock.started - started,
        })
    print(json.dumps(out))


def _rates(record, task, path):
    """Images/s and CPU/wall of each window of `task` by `path` in one process."""
    windows = [w for w in record["windows"] if w["task"] == task and w["path"] == path]
    return [w["images_per_second"] for w in windows], [w["cores"] for w in windows]


def table(rounds, args, minutes):
    """Markdown: per task and path, medians (range) over rounds of each process' best."""
    lines = [
        "`" + " ".join(["python -m benchmarks.inference_overlap", *sys.argv[1:]]) + "`",
        "",
        f"{args.model}, batch {args.batch_size}, {rounds[0][PIPELINE]['images']} images per "
        f"window, 2 stages ({args.mode}'s planned cuts); {args.rounds} interleaved rounds of "
        f"fresh processes, {args.repeats} window(s) per path per process, {minutes:.1f} min. "
        "Per round: the best window of each path; medians (min-max) over rounds. "
        f"x {REFERENCE} and x sequential are ratios within a round.",
        "",
        "| task | path | images/s | x keras-1core | x sequential | CPU/wall |",
        "|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        for path in ("keras",) + PATHS:
            ips, cores, vs_ref, vs_seq = [], [], [], []
            for r in rounds:
                record = r[REFERENCE] if path == "keras" else r[PIPELINE]
                rates, cpu = _rates(record, task, path)
                best = max(rates)
                ips.append(best)
                cores.append(cpu[rates.index(best)])
                vs_ref.append(best / max(_rates(r[REFERENCE], task, "keras")[0]))
                vs_seq.append(best / max(_rates(r[PIPELINE], task, "sequential")[0])
                              if path != "keras" else float("nan"))
            seq = "-" if path == "keras" else common.spread(vs_seq, ".2f")
            lines.append(f"| {task} | {'keras-1core' if path == 'keras' else path} | "
                         f"{common.spread(ips, '.1f')} | {common.spread(vs_ref, '.2f')} | {seq} | "
                         f"{common.spread(cores, '.2f')} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child(args)
    start = time.perf_counter()
    flags = ["--model", args.model, "--batch-size", str(args.batch_size), "--batches",
             str(args.batches), "--repeats", str(args.repeats), "--mode", args.mode]
    rounds = []
    for r in range(args.rounds):
        record = {}
        for config in (REFERENCE, PIPELINE):
            record[config] = common.run_json_child(
                "benchmarks.inference_overlap", ["--child", config, *flags], config)
            for w in record[config]["windows"]:
                print(f"round {r + 1}: {config} {w['task']} {w['path']}: "
                      f"{w['images_per_second']:.1f} images/s on {w['cores']:.2f} cores",
                      file=sys.stderr, flush=True)
        rounds.append(record)
    text = table(rounds, args, (time.perf_counter() - start) / 60)
    text += "\n\nCuts by round: " + "; ".join(
        ", ".join(r[PIPELINE]["cuts"] or ["-"]) for r in rounds) + "."
    common.publish(text, args.out)
    return None


if __name__ == "__main__":
    main()
