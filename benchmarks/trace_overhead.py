"""What `PipelineTrace` costs: step time with the trace callback on and off, interleaved.

    python -m benchmarks.trace_overhead                        # vgg16_narrow, 4 stages, 3 rounds
    python -m benchmarks.trace_overhead --steps 100 --rounds 5 --out docs/trace_overhead.md
    python -m benchmarks.trace_overhead --quick                # small_cnn, tiny: a smoke run

Issue 32's target: step time with tracing on within 2% of off. The stages time every pass
whether or not a trace is written (`StageRunner.timeline`); the callback reads those times
at each epoch's end. What turning it on changes is therefore measured in two pairs:

- `spe=1 off` / `spe=1 on`: both pass by pass (`steps_per_execution=1`): the cost of the
  callback itself (its per-batch hooks and the epoch-end conversion and JSON write).
- `auto off` / `auto on`: the default `steps_per_execution="auto"` (windows of 8), where
  the trace asks the window graphs to take the time each pass ends
  (`PipelineTrace(pass_times=True)`): the price of per-pass times in windows.

One process builds one pipeline per configuration (same model, cuts and data), then warms
each up with two epoch-long fits, then times one epoch-long `fit` of each configuration per round,
the configurations interleaved so that drift of the machine hits them alike. Each fit
reports seconds per step (wall), process CPU time / wall time, and for the traced ones the
time spent in the callback. The table gives medians with the range over rounds and each
"on"'s ratio to its "off". Run it alone on an idle machine.
"""

import argparse
import statistics
import tempfile
import time

from benchmarks import common

CONFIGS = {  # name: (steps_per_execution, traced)
    "spe=1 off": (1, False),
    "spe=1 on": (1, True),
    "auto off": ("auto", False),
    "auto on": ("auto", True),
}


def build(model_name, num_stages, devices, steps_per_execution):
    """A compiled pipeline of `model_name` in `num_stages` balanced stages."""
    import keras

    import tf_spectrain

    keras.utils.set_random_seed(0)
    model = common.build_model(model_name)
    cuts, _ = common.balanced_cuts(model, num_stages)
    pipe = tf_spectrain.PipelineModel(model, cuts=cuts, devices=devices[:num_stages],
                                      mode="spectrain")
    pipe.compile(tf_spectrain.SpecTrainSGD(0.01, momentum=0.9),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 steps_per_execution=steps_per_execution)
    return pipe


def timed_fit(pipe, data, steps, callback):
    """One epoch; returns `(seconds per step, CPU time / wall time, callback seconds)`."""
    callbacks = [] if callback is None else [callback]
    before = 0.0 if callback is None else callback.overhead_seconds
    wall, cpu = time.perf_counter(), time.process_time()
    pipe.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    spent = 0.0 if callback is None else callback.overhead_seconds - before
    return wall / steps, cpu / wall, spent


def measure(args):
    """Runs the interleaved rounds; returns `{config: [(s/step, cpu/wall, cb s), ...]}`."""
    devices = common.prepare_tensorflow(args.stages)
    from tf_spectrain.callbacks import PipelineTrace

    data = common.synthetic_images(args.batch_size, args.steps)
    folder = tempfile.mkdtemp(prefix="trace_overhead-")
    runs = {}
    for name, (spe, traced) in CONFIGS.items():
        pipe = build(args.model, args.stages, devices, spe)
        callback = PipelineTrace(f"{folder}/{name.replace(' ', '_')}") if traced else None
        runs[name] = (pipe, callback)
    # Warm-ups once every pipeline is built: `build` sets the random seed, which makes
    # TensorFlow trace functions already traced again.
    for _ in range(2):
        for pipe, callback in runs.values():
            timed_fit(pipe, data, args.steps, callback)
    results = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        for name, (pipe, callback) in runs.items():
            results[name].append(timed_fit(pipe, data, args.steps, callback))
            step, share, spent = results[name][-1]
            print(f"round {round_}: {name:10s} {step * 1e3:8.2f} ms/step  CPU/wall "
                  f"{share:.2f}  callback {spent * 1e3:.1f} ms", flush=True)
    return results


def table(results, args):
    """The Markdown table of the medians (ranges over rounds) and on/off ratios."""
    lines = [f"`{args.model}`, {args.stages} stages, batch {args.batch_size}, "
             f"{args.steps} steps per fit, {args.rounds} rounds (medians, range over rounds).",
             "", "| configuration | ms per step | CPU time / wall time | in the callback, "
             "ms per fit | step time / off |", "|---|---|---|---|---|"]
    medians = {name: statistics.median(r[0] for r in rows) for name, rows in results.items()}
    for name, rows in results.items():
        steps = [r[0] * 1e3 for r in rows]
        shares = [r[1] for r in rows]
        spent = statistics.median(r[2] for r in rows) * 1e3
        off = name.replace(" on", " off")
        ratio = medians[name] / medians[off]
        lines.append(f"| {name} | {statistics.median(steps):.2f} ({min(steps):.2f}-"
                     f"{max(steps):.2f}) | {statistics.median(shares):.2f} | {spent:.1f} | "
                     f"{ratio:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vgg", choices=common.MODEL_NAMES[:3])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50, help="mini-batches per timed fit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small_cnn, 8 steps, 1 round")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.steps, args.rounds, args.batch_size = "small_cnn", 8, 1, 16
    text = table(measure(args), args)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
