"""What a user waits for: `compile` to the end of `fit`, graph building included, Keras beside.

    python -m benchmarks.user_clock                        # every case, 3 rounds
    python -m benchmarks.user_clock --cases whole --rounds 5 --out docs/user_clock.md
    python -m benchmarks.user_clock --quick                # small_cnn, 1 round: a smoke run

Steady-state figures (`benchmarks.overlap`) leave out what a short or medium `fit` pays
first: tracing and building graphs. Every run here is a fresh process, timed from before
`compile` (or from before the first `fit` of a case) to the end of `fit`, as a user's
script would be:

- `whole`: one `fit` of `--epochs` epochs of `--steps` mini-batches of VGG16 (batch 64),
  compile to end, with each epoch's wall time apart (the first carries the graph
  building). "extra" is the first epoch's time over the median later epoch.
- `relength`: a `fit` of `--warmup` mini-batches, then a timed `fit` of `--steps-new`: a
  number of mini-batches not seen before (a new window shape for a pipeline; nothing new
  for Keras).
- `main`: the README's main command, `python train.py --model vgg16 --gpus 4` as it is
  (`train-default`: pass by pass on a CPU-only machine, windows of 8 with GPUs), with
  `--steps-per-execution 8` (`train-windows`) and with `--run-eagerly` (pass by pass,
  `train-eager`), each a fresh process: its own summary line (test accuracy, training
  images/s, wall time) and the process' wall time.
- `resnet`: the zoo's `resnet50` at 32 px, batch 16, a first `fit` of `--resnet-steps`,
  a `fit` of `--resnet-steps-new` and the same again: graph building of the first fit is
  its wall time less the third fit's time per mini-batch times its mini-batches, and the
  second's is its time less the third's.

The reference is single-device Keras `model.fit` with one intra-op and one inter-op thread
(exactly one core); the pipelines run 2 stages (4 for `resnet`) with one intra-op thread,
cut at fixed layers (`CUTS`), with the default `steps_per_execution="auto"`. Configurations
are interleaved over `--rounds` rounds; the tables give medians with the range over rounds,
speed-ups per round against the same round's reference, and CPU/wall beside each time.
"""

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import common

CONFIGS = {"keras-1core": "single", "stash": "stash", "spectrain-paper": "spectrain"}
REFERENCE = "keras-1core"
CASES = ("whole", "relength", "resnet", "main")
MAIN = {"train-default": [], "train-windows": ["--steps-per-execution", "8"],
        "train-eager": ["--run-eagerly"]}
CUTS = {
    ("vgg16", 2): ["block3_relu2"],
    ("small_cnn", 2): ["pool1"],
    ("resnet50", 4): ["conv3_block1_out", "conv4_block1_out", "conv5_block1_out"],
    ("small_cnn", 4): ["pool1", "flatten", "fc1"],
}
CASE_CONFIGS = {"whole": tuple(CONFIGS), "relength": tuple(CONFIGS),
                "resnet": ("keras-1core", "stash"), "main": tuple(MAIN)}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.user_clock",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=common.csv_of(str, CASES), default=list(CASES))
    p.add_argument("--epochs", type=common.positive_int, default=3)
    p.add_argument("--steps", type=common.positive_int, default=24, help="whole: mini-batches")
    p.add_argument("--warmup", type=common.positive_int, default=3, help="relength: first fit")
    p.add_argument("--steps-new", type=common.positive_int, default=8, help="relength: timed fit")
    p.add_argument("--resnet-steps", type=common.positive_int, default=16)
    p.add_argument("--resnet-steps-new", type=common.positive_int, default=21)
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--quick", action="store_true", help="small_cnn, 1 round, short fits")
    p.add_argument("--out", help="also write the tables to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # "case:config", in a fresh process
    args = p.parse_args(argv)
    args.model, args.resnet_model = "vgg16", "resnet50"
    if args.quick:
        args.model = args.resnet_model = "small_cnn"
        args.rounds, args.epochs, args.steps, args.resnet_steps = 1, 2, 6, 4
        args.resnet_steps_new = 5
    return args


def _trainer(model, mode, stages, batch):
    """A compiled trainer: one-core Keras for "single", else a pipeline of `stages`."""
    import keras

    import tf_spectrain
    from tf_spectrain.app import trainers

    devices = [f"/CPU:{k}" for k in range(1 if mode == "single" else stages)]
    keras.utils.set_random_seed(0)
    return trainers.build_trainer(
        lambda: tf_spectrain.models.get_model(model, (32, 32, 3), 10), mode, devices,
        learning_rate=0.01, momentum=0.9, batch_size=batch,
        cuts=None if mode == "single" else CUTS[(model, stages)],
    )


def _timed(fn):
    clock = common.CpuClock()
    with clock:
        fn()
    return {"wall": clock.wall, "cores": clock.cores}


def child(args):
    """One case and configuration in this fresh process; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import warnings

    import keras
    import tensorflow as tf

    case, name = args.child.split(":")
    mode = CONFIGS[name]
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if mode == "single":
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import tf_spectrain

    stages = 4 if case == "resnet" else 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf_spectrain.setup_devices(1 if mode == "single" else stages)
    out = {"case": case, "config": name}
    if case == "whole":
        batches = common.window_batches(64, (args.steps,))
        ends = []

        class Ends(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                ends.append(time.perf_counter())

        def run():
            trainer = _trainer(args.model, mode, 2, 64)
            out["compiled_after"] = time.perf_counter() - begun
            trainer.fit(batches(args.steps), epochs=args.epochs, verbose=0, callbacks=[Ends()])

        begun = time.perf_counter()
        out["total"] = _timed(run)
        out["epochs"] = [b - a for a, b in zip([begun + out["compiled_after"]] + ends, ends)]
    elif case == "relength":
        batches = common.window_batches(64, (args.warmup, args.steps_new))
        trainer = _trainer(args.model, mode, 2, 64)
        trainer.fit(batches(args.warmup), epochs=1, verbose=0)
        out["steps"] = args.steps_new
        out["timed"] = _timed(lambda: trainer.fit(batches(args.steps_new), epochs=1, verbose=0))
    else:
        counts = (args.resnet_steps, args.resnet_steps_new)
        batches = common.window_batches(16, counts)
        trainer = _trainer(args.resnet_model, mode, 4, 16)
        fits = [_timed(lambda n=n: trainer.fit(batches(n), epochs=1, verbose=0))
                for n in counts + counts[1:]]
        per_batch = fits[2]["wall"] / counts[1]
        out["fits"] = fits
        out["build_first"] = fits[0]["wall"] - per_batch * counts[0]
        out["build_new_length"] = fits[1]["wall"] - fits[2]["wall"]
    print(json.dumps(out))


def run_main(name, args):
    """`train.py` as a user runs it (`MAIN[name]` added), in a fresh process; its record."""
    import re
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as logdir:
        extra = ["--limit", "256", "--epochs", "1"] if args.quick else []
        cmd = [sys.executable, os.path.join(common.ROOT, "train.py"), "--model", "vgg16",
               "--gpus", "4", "--logdir", logdir, *extra, *MAIN[name]]
        clock = common.CpuClock()
        with clock:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                                 check=False)
    if out.returncode != 0:
        raise RuntimeError(f"train.py {MAIN[name]} failed:\n{out.stderr[-3000:]}")
    last = [line for line in out.stdout.splitlines() if "test accuracy" in line][-1]
    numbers = re.search(r"test accuracy ([\d.]+) \| ([\d.]+) images/s \| wall time ([\d.]+)",
                        last)
    accuracy, images, wall = (float(v) for v in numbers.groups())
    return {"case": "main", "config": name, "test_accuracy": accuracy,
            "images_per_second": images, "wall_time": wall,
            "process": {"wall": clock.wall}}


def measure(case, name, args):
    """Runs one case and configuration in a fresh process; returns its record."""
    if case == "main":
        return run_main(name, args)
    flags = ["--child", f"{case}:{name}", "--epochs", str(args.epochs), "--steps",
             str(args.steps), "--warmup", str(args.warmup), "--steps-new", str(args.steps_new),
             "--resnet-steps", str(args.resnet_steps),
             "--resnet-steps-new", str(args.resnet_steps_new)] + (["--quick"] if args.quick else [])
    return common.run_json_child("benchmarks.user_clock", flags, f"{case} {name}")


def _ratio(results, name, key):
    """Per round: the reference's figure over this configuration's (a speed-up)."""
    return [key(r) / key(c) for r, c in zip(results[REFERENCE], results[name])]


def tables(results):
    """The markdown tables of `results`: `{case: {config: [record per round]}}`."""
    parts = []
    whole = results.get("whole")
    if whole:
        rows = []
        for name, runs in whole.items():
            extra = [r["epochs"][0] - statistics.median(r["epochs"][1:] or r["epochs"][:1])
                     for r in runs]
            rows.append([
                name, common.spread([r["total"]["wall"] for r in runs], ".1f"),
                common.spread([r["total"]["cores"] for r in runs], ".2f"),
                common.spread([r["epochs"][0] for r in runs], ".1f"),
                common.spread([statistics.median(r["epochs"][1:] or r["epochs"]) for r in runs],
                              ".1f"),
                common.spread(extra, ".1f"),
                common.spread(_ratio(whole, name, lambda r: r["total"]["wall"]), ".2f"),
            ])
        parts.append("Whole fit, compile to end (s)\n\n" + common.markdown_table(
            ["configuration", "total", "CPU/wall", "first epoch", "later epoch", "extra",
             "speed-up"], rows))
    relength = results.get("relength")
    if relength:
        rows = [[name, common.spread([r["timed"]["wall"] for r in runs], ".2f"),
                 common.spread([r["timed"]["cores"] for r in runs], ".2f"),
                 common.spread(_ratio(relength, name, lambda r: r["timed"]["wall"]), ".2f")]
                for name, runs in relength.items()]
        parts.append("A fit of a new number of mini-batches (s)\n\n" + common.markdown_table(
            ["configuration", "wall", "CPU/wall", "speed-up"], rows))
    resnet = results.get("resnet")
    if resnet:
        rows = [[name, common.spread([r["build_first"] for r in runs], ".1f"),
                 common.spread([r["build_new_length"] for r in runs], ".1f"),
                 common.spread([r["fits"][0]["cores"] for r in runs], ".2f"),
                 common.spread([r["build_first"] / k["build_first"]
                                for r, k in zip(runs, resnet[REFERENCE])], ".2f")]
                for name, runs in resnet.items()]
        parts.append("ResNet-50 graph building (s)\n\n" + common.markdown_table(
            ["configuration", "first fit", "fit of another length", "CPU/wall (first)",
             "first / Keras'"], rows))
    main = results.get("main")
    if main:
        base = main["train-default"]
        rows = [[name, common.spread([r["test_accuracy"] for r in runs], ".4f"),
                 common.spread([r["images_per_second"] for r in runs], ".1f"),
                 common.spread([r["wall_time"] for r in runs], ".1f"),
                 common.spread([r["process"]["wall"] for r in runs], ".1f"),
                 common.spread([b["wall_time"] / r["wall_time"] for r, b in zip(runs, base)],
                               ".2f")]
                for name, runs in main.items()]
        parts.append("`python train.py --model vgg16 --gpus 4`\n\n" + common.markdown_table(
            ["configuration", "test accuracy", "training images/s", "wall time (s)",
             "process (s)", "default / this"], rows))
    return "\n\n".join(parts)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        child(args)
        return
    results = {case: {name: [] for name in CASE_CONFIGS[case]} for case in args.cases}
    started = time.perf_counter()
    for _ in range(args.rounds):
        for case in args.cases:
            for name in CASE_CONFIGS[case]:
                record = measure(case, name, args)
                results[case][name].append(record)
                print(json.dumps(record), file=sys.stderr, flush=True)
    minutes = (time.perf_counter() - started) / 60
    common.publish(f"{tables(results)}\n\n({args.rounds} rounds, {minutes:.0f} min)", args.out)


if __name__ == "__main__":
    main()
