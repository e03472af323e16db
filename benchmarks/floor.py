"""The runtime's fixed cost per mini-batch ("the floor"), side by side with Keras' own.

    python -m benchmarks.floor                                   # every mode, N = 1, 2, 4, 8
    python -m benchmarks.floor --stages 4 --modes stash,spectrain-paper --rounds 5
    python -m benchmarks.floor --model conv --steps-per-execution eager,1,auto,32
    python -m benchmarks.floor --profile stash --stages 4 --steps-per-execution eager
    python -m benchmarks.floor --stages 4 --modes stash --steps-per-execution auto --xla off,on
    python -m benchmarks.floor --out docs/data/issue17/floor-dense.md \\
        --json docs/data/issue17/floor-dense.jsonl

A model whose layers compute almost nothing, so that a mini-batch costs only the machinery:
`dense` is `Input(16)` -> 8 x `Dense(16, tanh)` -> `Dense(4)` at batch 8, `conv` is
`Input(8, 8, 4)` -> 8 x `Conv2D(4, 3)` -> pooling -> `Dense(4)` at batch 8 (`--layers`
changes the 8, to see what each layer adds). Pipelines of N
stages cut it evenly (N = 1: one stage, no cut) on N logical CPU devices, TensorFlow's
default threads. Every trainer is built first (seeding clears TensorFlow's caches), then each
runs one untimed `fit` of the timed data (tracing every window shape), then the trainers are
timed in turn, `--rounds` times: `--batches` mini-batches per timed `fit`, this process' CPU
time / wall time beside each. The table gives the median mini-batches per second (and the
range over the rounds), and each pipeline's time per mini-batch over Keras' `fit` with the
same `steps_per_execution` (Keras' default 1 for the pipeline's "auto" and for "eager",
`compile(run_eagerly=True)`: pass by pass) in the same round.

`--xla off,on` builds every trainer both without and with `compile(jit_compile=True)` (each
stage's passes, and Keras' step, compiled with XLA), interleaved.

`--profile CONFIG` instead runs one trainer under yappi (CPU time, every thread) and prints
where the CPU time per mini-batch goes, by kind of work.
"""

import argparse
import json
import statistics
import sys
import warnings

from benchmarks import common

MODES = {
    "sync": ("sync", "paper"),
    "vanilla": ("vanilla", "paper"),
    "stash": ("stash", "paper"),
    "spectrain-paper": ("spectrain", "paper"),
    "spectrain-consistent": ("spectrain", "consistent"),
}
LAYERS = 8
BATCH = 8
EAGER = "eager"  # a --steps-per-execution value: compile(run_eagerly=True), pass by pass
# Kinds of work for --profile: the first match (module part, function part) wins.
KINDS = [
    ("TensorFlow executes graphs (C++)", ("", "TFE_Py_Execute")),
    ("eager ops", ("", "TFE_Py_FastPathExecute")),
    ("host reads (.numpy)", ("", "_numpy_internal")),
    ("gradient tape", ("eager/backprop", ""), ("eager/imperative_grad", ""),
     ("eager/tape", ""), ("TFE_Py_TapeGradient", "")),
    ("graph function dispatch (Python)", ("polymorphic_function", ""), ("core/function", ""),
     ("eager/execute", ""), ("eager/context", ""), ("trace_type", "")),
    ("hand-offs and threads", ("runtime/handoff", ""), ("threading", ""), ("queue", "")),
    ("callbacks", ("keras/src/callbacks", ""), ("utils/progbar", "")),
    ("telemetry", ("tf_spectrain/callbacks/telemetry", ""), ("tensorboard", ""),
     ("summary", "")),
    ("metrics and logs", ("keras/src/metrics", ""), ("runtime/bookkeeping", "")),
    ("pipeline runtime (Python)", ("tf_spectrain/runtime", ""), ("tf_spectrain/schedule", "")),
    ("optimizers (Python)", ("keras/src/optimizers", ""), ("tf_spectrain/prediction", "")),
    ("TensorFlow Python (ops, tensors)", ("tensorflow/", "")),
    ("Keras Python", ("keras/", "")),
    ("Python builtins (mostly called by TensorFlow's Python)", ("builtins", "")),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("dense", "conv"), default="dense")
    p.add_argument("--layers", type=common.positive_int, default=LAYERS,
                   help="hidden layers (a multiple of the largest --stages)")
    p.add_argument("--stages", type=common.csv_of(int), default=[1, 2, 4, 8])
    p.add_argument("--modes", type=common.csv_of(str, MODES), default=list(MODES))
    p.add_argument("--steps-per-execution", type=common.csv_of(str), default=["eager", "1", "auto"],
                   help="the pipelines' values: an int K (a graph call per K mini-batches), "
                   "'auto', or 'eager' (compile(run_eagerly=True): pass by pass)")
    p.add_argument("--xla", type=common.csv_of(str, ("off", "on")), default=["off"],
                   help="trainers without and/or with compile(jit_compile=True)")
    p.add_argument("--batches", type=common.positive_int, default=300)
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--profile", choices=list(MODES) + ["keras"], default=None)
    p.add_argument("--telemetry", action="store_true",
                   help="with --profile: also run the Telemetry callback (per-step scalars "
                   "with log_every='auto', no prediction errors)")
    p.add_argument("--out", default=None, help="also write the table here")
    p.add_argument("--json", default=None, help="append one JSON line per timed fit here")
    return p.parse_args(argv)


def build(keras, kind, layers=LAYERS):
    """The near-zero-compute model: its layers are named l0 .. l{layers - 1}, then `out`."""
    if kind == "dense":
        h = inputs = keras.Input((16,))
        for n in range(layers):
            h = keras.layers.Dense(16, activation="tanh", name=f"l{n}")(h)
    else:
        h = inputs = keras.Input((8, 8, 4))
        for n in range(layers):
            h = keras.layers.Conv2D(4, 3, padding="same", activation="tanh", name=f"l{n}")(h)
        h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    return keras.Model(inputs, keras.layers.Dense(4, name="out")(h))


def cuts(num_stages, layers=LAYERS):
    """Even cuts of the layers (of 8, the issue's: N = 2 after l3, N = 4 after l1, l3, l5)."""
    per = layers // num_stages
    return [f"l{per * (k + 1) - 1}" for k in range(num_stages - 1)]


def spe(text):
    """A `steps_per_execution` flag value: "auto" or an int."""
    return text if text == "auto" else int(text)


def compile_options(value):
    """A pipeline's `compile` arguments for a `--steps-per-execution` value: "eager" is
    `run_eagerly=True` (pass by pass, each pass its own call), the others are K."""
    if value == EAGER:
        return {"run_eagerly": True}
    return {"steps_per_execution": spe(value)}


def keras_value(value):
    """The Keras `steps_per_execution` a pipeline's value is compared with."""
    return 1 if value in ("auto", EAGER) else int(value)


def make_trainers(args, devices):
    """Every trainer of the run: `{label: (trainer, keras steps_per_execution)}`.

    Keras' fit is built with every `steps_per_execution` asked for ("auto" is Keras' 1) and
    with 1; each pipeline's keras value is its own (1 for "auto").
    """
    import keras

    import tf_spectrain

    keras.utils.set_random_seed(0)  # once: seeding clears TensorFlow's kernel caches
    trainers = {}
    keras_values = sorted({1} | {keras_value(v) for v in args.steps_per_execution})
    for xla in getattr(args, "xla", ["off"]):
        jit, suffix = xla == "on", ", XLA" if xla == "on" else ""
        for keras_spe in keras_values:
            model = build(keras, args.model, args.layers)
            model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                          "sparse_categorical_crossentropy", steps_per_execution=keras_spe,
                          jit_compile=jit)
            trainers[f"keras fit, spe={keras_spe}{suffix}"] = (model, keras_spe)
        for value in args.steps_per_execution:
            for n in args.stages:
                for name in args.modes:
                    mode, target = MODES[name]
                    pipe = tf_spectrain.PipelineModel(
                        build(keras, args.model, args.layers), cuts=cuts(n, args.layers),
                        devices=devices[:n], mode=mode, spectrain_target=target)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # run_eagerly's
                        pipe.compile(tf_spectrain.SpecTrainSGD(0.01, momentum=0.9),
                                     "sparse_categorical_crossentropy", jit_compile=jit,
                                     **compile_options(value))
                    trainers[f"{name}, N={n}, spe={value}{suffix}"] = (pipe, keras_value(value))
    return trainers


def data(args):
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (16,) if args.model == "dense" else (8, 8, 4)
    x = rng.normal(size=(args.batches * BATCH, *shape)).astype("float32")
    return x, rng.integers(0, 4, len(x)).astype("int32")


def timed_fit(trainer, x, y, callbacks=None):
    with common.CpuClock() as clock:
        trainer.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                    callbacks=callbacks)
    return clock


def run(args):
    devices = common.prepare_tensorflow(max(args.stages), intra_op_threads=0)
    trainers = make_trainers(args, devices)
    x, y = data(args)
    for trainer, _ in trainers.values():
        trainer.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # tracing
    results = {label: [] for label in trainers}
    for r in range(args.rounds):
        for label, (trainer, keras_spe) in trainers.items():
            clock = timed_fit(trainer, x, y)
            record = {"round": r, "trainer": label, "model": args.model, "layers": args.layers,
                      "batches_per_second": args.batches / clock.wall,
                      "ms_per_batch": 1e3 * clock.wall / args.batches, "cores": clock.cores,
                      "keras_spe": keras_spe}
            results[label].append(record)
            print(json.dumps(record), flush=True)
            if args.json:
                common.append_jsonl(args.json, record)
    common.publish(table(results, args), args.out)


def table(results, args):
    """The markdown table of `run`'s results: medians, ranges, ratios to Keras per round."""
    rows = []
    for label, records in results.items():
        rate = [r["batches_per_second"] for r in records]
        ms = [r["ms_per_batch"] for r in records]
        ratios = []
        suffix = ", XLA" if label.endswith(", XLA") else ""
        for keras_spe in sorted({1, records[0]["keras_spe"]}):
            keras_runs = results[f"keras fit, spe={keras_spe}{suffix}"]
            ratios.append("" if label.startswith("keras") else common.spread(
                [r["ms_per_batch"] / k["ms_per_batch"] for r, k in zip(records, keras_runs)],
                ".2f") + "x")
        same = ratios[-1]
        rows.append([label, common.spread(rate, ".0f"), f"{statistics.median(ms):.2f}",
                     ratios[0], same, common.spread([r["cores"] for r in records], ".2f")])
    header = ["trainer", "mini-batches/s (range)", "ms per mini-batch",
              "/ Keras fit spe=1", "/ Keras fit, same spe", "CPU/wall"]
    note = (f"Model `{args.model}` ({args.layers} layers), batch {BATCH}, {args.batches} "
            f"mini-batches per timed fit, {args.rounds} rounds interleaved, medians (ranges "
            "over rounds); ratios are times per mini-batch over Keras' `fit` in the same "
            "round (its default `steps_per_execution=1`, and the pipeline's own value; "
            "\"auto\" is Keras' 1).")
    return note + "\n\n" + common.markdown_table(header, rows)


def categorise(module, name):
    """The kind of work (`KINDS`) of a profiled function."""
    for kind, *patterns in KINDS:
        for part, function in patterns:
            if (not part or part in module) and (not function or function in name):
                return kind
    return "other Python"


# The runtime's entry points for --profile's second table: (label, module part, function).
ENTRIES = [
    ("stage forward passes", "runtime/stage", "StageRunner.forward"),
    ("stage backward passes", "runtime/stage", "StageRunner.backward"),
    ("stage updates", "runtime/stage", "StageRunner.update"),
    ("windows: one graph call each", "runtime/window_epoch", "WindowedEpoch._call"),
    ("windows: feeding inputs", "runtime/window_epoch", "WindowedEpoch._feed"),
    ("windows: flags, memory, counts", "runtime/window_epoch", "WindowedEpoch._note"),
    ("losses and metrics (host side)", "runtime/bookkeeping", "TrainLogs.record"),
    ("losses and metrics (host side)", "runtime/bookkeeping", "TrainLogs.record_window"),
    ("callbacks (progress, history)", "keras/src/callbacks/callback_list", "CallbackList.on_"),
    ("telemetry (inside the callbacks)", "callbacks/telemetry", "Telemetry.on_"),
    ("hand-offs: waiting on a queue", "runtime/handoff", "Channel.get"),
    ("keras fit: train function calls", "backend/tensorflow/trainer", "function"),
]


def profile(args):
    """Runs one trainer under yappi (CPU time, every thread) and prints two tables."""
    import yappi

    devices = common.prepare_tensorflow(max(args.stages), intra_op_threads=0)
    args.modes = [] if args.profile == "keras" else [args.profile]
    args.stages = args.stages[:1]
    args.steps_per_execution = args.steps_per_execution[:1]
    trainers = make_trainers(args, devices)
    if args.profile == "keras":
        value = args.steps_per_execution[0]
        label = f"keras fit, spe={keras_value(value)}"
    else:
        label = next(k for k in trainers if not k.startswith("keras"))
    trainer = trainers[label][0]
    x, y = data(args)
    callbacks = None
    if args.telemetry:
        import tempfile

        import tf_spectrain

        callbacks = [tf_spectrain.callbacks.Telemetry(tempfile.mkdtemp(), prediction_every=0)]
    trainer.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                callbacks=callbacks)
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    clock = timed_fit(trainer, x, y, callbacks)
    yappi.stop()
    stats = list(yappi.get_func_stats())
    per_batch = 1e3 / args.batches
    kinds = {}
    for stat in stats:
        kind = categorise(stat.module or "", stat.name or "")
        kinds[kind] = kinds.get(kind, 0.0) + stat.tsub
    total = sum(kinds.values())
    print(f"{label}: {per_batch * clock.wall:.2f} ms per mini-batch (wall, under the profiler, "
          f"which slows Python down), {clock.cores:.2f} cores; CPU {per_batch * total:.2f} ms "
          "per mini-batch in Python threads")
    rows = [[kind, f"{per_batch * seconds:.3f}", f"{seconds / total:.0%}"]
            for kind, seconds in sorted(kinds.items(), key=lambda item: -item[1])]
    print(common.markdown_table(["kind of work (own time)", "CPU ms per mini-batch", "share"],
                                rows))
    entries = {}
    for title, part, function in ENTRIES:
        for stat in stats:
            if part in (stat.module or "") and (stat.name or "").startswith(function):
                entries[title] = entries.get(title, 0.0) + stat.ttot
    rows = [[title, f"{per_batch * seconds:.3f}"] for title, seconds in entries.items()]
    print()
    print(common.markdown_table(["where (time inside, callees included)",
                                 "CPU ms per mini-batch"], rows))


def main(argv=None):
    args = parse_args(argv)
    if args.profile:
        profile(args)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
