"""What the stall watch costs: step time of this checkout against a revision without it.

    git worktree add /tmp/base 4ff6981                  # the last commit before the watch
    python benchmarks/stall_overhead.py --base /tmp/base --out docs/stall_overhead.md
    python benchmarks/stall_overhead.py --base /tmp/base --quick     # a smoke run

The watch (`tf_spectrain.runtime.stall`) adds to every pass a note of where the stage is
(pass by pass), and to every window a pass counter per stage inside the graph, a read of
those counters, and a helper thread that runs the window's reads and graph call; a watch
thread wakes once a second. None of it can be switched off alone (`stall_timeout=None`
stops only the watch thread), so this compares whole checkouts: each configuration runs
in a fresh process whose `tf_spectrain` comes from `--base` or from this checkout, the
processes interleaved (base, this, base, this, ...) so that drift hits both alike. Each
process builds the pipeline (`vgg16_narrow` in 4 balanced stages, spectrain), warms it up
with two epoch-long fits and times `--fits` more; it reports seconds per step and process
CPU time / wall time. Run it alone on an idle machine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = (1, "auto")  # steps_per_execution


def child(args):
    """One process: builds, warms up, times; prints a JSON line."""
    from benchmarks import common

    devices = common.prepare_tensorflow(args.stages)
    import keras

    import tf_spectrain

    keras.utils.set_random_seed(0)
    model = common.build_model(args.model)
    cuts, _ = common.balanced_cuts(model, args.stages)
    pipe = tf_spectrain.PipelineModel(model, cuts=cuts, devices=devices[:args.stages],
                                      mode="spectrain")
    spe = args.spe if args.spe == "auto" else int(args.spe)
    pipe.compile(tf_spectrain.SpecTrainSGD(0.01, momentum=0.9),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 steps_per_execution=spe)
    data = common.synthetic_images(args.batch_size, args.steps)
    for _ in range(2):
        pipe.fit(data, epochs=1, verbose=0)
    fits = []
    for _ in range(args.fits):
        wall, cpu = time.perf_counter(), time.process_time()
        pipe.fit(data, epochs=1, verbose=0)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        fits.append((wall / args.steps, cpu / wall))
    print(json.dumps({"source": os.path.dirname(os.path.dirname(tf_spectrain.__file__)),
                      "fits": fits}))


def run_child(root, spe, args):
    """Runs `child` with `tf_spectrain` (and `benchmarks.common`) from `root`."""
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--spe", str(spe),
           "--model", args.model, "--stages", str(args.stages), "--batch-size",
           str(args.batch_size), "--steps", str(args.steps), "--fits", str(args.fits)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, check=False,
                         timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{root} spe={spe} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if os.path.realpath(result["source"]) != os.path.realpath(root):
        raise RuntimeError(f"the child imported tf_spectrain from {result['source']}, not {root}")
    return result["fits"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="a checkout (git worktree) without the watch")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spe", default="auto")
    parser.add_argument("--model", default="vgg")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50, help="mini-batches per timed fit")
    parser.add_argument("--fits", type=int, default=2, help="timed fits per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small_cnn, 8 steps, 1 round")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.base is None:
        parser.error("--base (a checkout without the watch) is required")
    if args.quick:
        args.model, args.steps, args.rounds, args.batch_size = "small_cnn", 8, 1, 16
    results = {(name, spe): [] for name in ("base", "this") for spe in CONFIGS}
    for round_ in range(args.rounds):
        for spe in CONFIGS:
            for name, root in (("base", args.base), ("this", HERE)):
                fits = run_child(root, spe, args)
                results[(name, spe)].extend(fits)
                print(f"round {round_} spe={spe} {name}: " + ", ".join(
                    f"{s * 1e3:.2f} ms/step (CPU/wall {c:.2f})" for s, c in fits), flush=True)
    lines = [f"`{args.model}`, {args.stages} stages, spectrain, batch {args.batch_size}, "
             f"{args.steps} steps per fit, {args.fits} timed fits per process, {args.rounds} "
             "rounds of processes interleaved (medians, range).", "",
             "| steps_per_execution | checkout | ms per step | CPU time / wall time | "
             "this / base |", "|---|---|---|---|---|"]
    for spe in CONFIGS:
        base = statistics.median(s for s, _ in results[("base", spe)])
        for name in ("base", "this"):
            steps = [s * 1e3 for s, _ in results[(name, spe)]]
            shares = [c for _, c in results[(name, spe)]]
            ratio = statistics.median(steps) / (base * 1e3)
            lines.append(f"| {spe} | {name} | {statistics.median(steps):.2f} ({min(steps):.2f}-"
                         f"{max(steps):.2f}) | {statistics.median(shares):.2f} | "
                         f"{ratio:.3f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    return None


if __name__ == "__main__":
    main()
