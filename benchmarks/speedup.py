"""Predicted speedup of the SpecTrain pipeline over data parallelism on 4 GPUs, and a check
of the cost model against what this machine can measure.

    python -m benchmarks.speedup --quick                    # a smoke run of a few minutes
    python -m benchmarks.speedup --out docs/speedup.md      # the full setting

1. Profiles VGG16 and ResNet-50 (32x32x3 inputs, 10 classes, from the zoo) and a
   transformer-sized text classifier (6 encoder layers, d_model 512, 8 heads, feed-forward
   2048, sequence 128) layer by layer on this CPU (`tf_spectrain.costmodel.profile_model`),
   each in its own process, which also measures the CPU's float32 matrix-product rate.
2. Predicts images/s on 4 GPUs over PCIe 3.0 x16 and over NVLink for one GPU, data
   parallelism (ring all-reduce every step; without and with overlap of the backward) and
   the asynchronous pipeline (cuts chosen by `costmodel.best_cuts`; without recomputation,
   as stashing and consistent SpecTrain run, and with it, as paper SpecTrain runs), and the
   pipeline's speedup over data parallelism next to the paper's 8.91x. The profiled CPU
   times stand in for GPU times, divided by `relative_speed = --gpu-tflops / CPU rate`.
3. Validates the model here: the 4 logical CPU devices of this machine share 2 cores, so
   their hardware description is measured (copy bandwidth and latency between two logical
   devices, and how much the 4 devices compute at once: the concurrency), then single-device
   `model.fit`, MirroredStrategy data parallelism and 4-stage pipelines are measured, each in
   a fresh process, next to the model's prediction for the same cuts and batch.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

from benchmarks import common

PAPER_SPEEDUP = 8.91
# A 2017-2018 GPU (P100 / GTX 1080 Ti class) runs float32 matrix products at about 10 TFLOP/s.
DEFAULT_GPU_TFLOPS = 10.0
MODELS = ("vgg16", "resnet50", "transformer")
CLASSES = {"vgg16": 10, "resnet50": 10, "transformer": 2}
VALIDATION_CONFIGS = {
    "single": dict(mode="single"),
    "data parallel": dict(mode="dp"),
    "pipeline, stash": dict(mode="stash", recompute=False),
    "pipeline, spectrain (paper)": dict(mode="spectrain", recompute=True),
}


# --- models -------------------------------------------------------------------------------


def transformer_classifier(seq_len=128, d_model=512, heads=8, ff=2048, depth=6, vocab=20000):
    """A text classifier with a transformer encoder of realistic per-layer sizes.

    Token and learned position embeddings, `depth` post-norm encoder layers
    (`enc{i}_attention`, `enc{i}_add1`, `enc{i}_norm1`, `enc{i}_ff1`, `enc{i}_ff2`,
    `enc{i}_add2`, `enc{i}_norm2`), mean pooling and a 2-class head: about 29M weights.
    """
    import keras
    from keras import layers

    class PositionEmbedding(layers.Layer):
        """Adds a learned embedding of each position."""

        def build(self, input_shape):
            self.table = self.add_weight(
                shape=tuple(input_shape[1:]), initializer="random_normal", name="table"
            )

        def call(self, x):
            return x + self.table

    tokens = keras.Input(shape=(seq_len,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, d_model, name="token_embedding")(tokens)
    x = PositionEmbedding(name="position_embedding")(x)
    for i in range(1, depth + 1):
        attention = layers.MultiHeadAttention(heads, d_model // heads, name=f"enc{i}_attention")
        attended = attention(x, x)
        x = layers.Add(name=f"enc{i}_add1")([x, attended])
        x = layers.LayerNormalization(name=f"enc{i}_norm1")(x)
        h = layers.Dense(ff, activation="relu", name=f"enc{i}_ff1")(x)
        h = layers.Dense(d_model, name=f"enc{i}_ff2")(h)
        x = layers.Add(name=f"enc{i}_add2")([x, h])
        x = layers.LayerNormalization(name=f"enc{i}_norm2")(x)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(2, name="predictions")(x)
    return keras.Model(tokens, outputs, name="transformer")


def build_model(name):
    if name == "transformer":
        return transformer_classifier()
    import tf_spectrain

    return tf_spectrain.models.get_model(name, (32, 32, 3), CLASSES[name])


# --- children: one measurement per process ------------------------------------------------


def matmul_flops(size=1024, repeats=10):
    """Float32 matrix-product rate of this process's default device, in FLOP/s."""
    import tensorflow as tf

    a = tf.random.normal([size, size])
    product = tf.function(lambda: tf.reduce_sum(tf.matmul(a, a)))
    product()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product().numpy()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times)


def child_profile(args):
    """Profiles one model on one device (default threads); prints the profile as JSON.

    Also reports the CPU's matrix-product rate and, for comparison with the sum of the
    layers, the median time of the whole model's Keras training step (`train_on_batch`).
    """
    from tf_spectrain import costmodel

    model = build_model(args.model)
    with common.CpuClock() as cpu:
        profile = costmodel.profile_model(model, args.batch_size, repeats=args.repeats)
    step = train_step_workload(args.model, args.batch_size, keras_step=True)(None)
    step()
    whole = statistics.median(_seconds(step) for _ in range(3))
    import tensorflow as tf

    device = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    print(json.dumps({
        "profile": profile.to_dict(), "cpu_flops": matmul_flops(), "whole_step": whole,
        "device": device, "profile_cores": cpu.cores,
    }))


def _seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def train_step_workload(model_name, batch_size, keras_step=False):
    """`workload(device)`: a fresh model's training step on one batch, placed on `device`."""
    import keras
    import numpy as np
    import tensorflow as tf

    def workload(device):
        rng = np.random.default_rng(0)
        shape = (batch_size, 128) if model_name == "transformer" else (batch_size, 32, 32, 3)
        x = np.zeros(shape, "int32") if model_name == "transformer" else rng.normal(size=shape)
        y = np.zeros(batch_size, "int32")
        with tf.device(device) if device else contextlib.nullcontext():
            model = build_model(model_name)
            model.compile(
                keras.optimizers.SGD(0.01, momentum=0.9),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        if keras_step:
            return lambda: model.train_on_batch(x, y)
        with tf.device(device):
            x, y = tf.constant(x, tf.float32), tf.constant(y)

        @tf.function
        def step():
            with tf.device(device):
                with tf.GradientTape() as tape:
                    loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                return tf.add_n([tf.reduce_sum(g) for g in grads])

        return lambda: step().numpy()

    return workload


def child_machine(args):
    """Measures the logical CPU devices' links and concurrency; prints JSON.

    The concurrency is measured twice: for matrix products, and for the model's own
    training step (which is what the stages run).
    """
    import tf_spectrain
    from tf_spectrain import costmodel

    devices = tf_spectrain.setup_devices(args.stages)
    kind = "GPU" if "GPU" in devices[0] else "CPU"
    bandwidth, latency = costmodel.measure_link(devices[0], devices[1])
    matmul = costmodel.measure_concurrency(devices)
    model = costmodel.measure_concurrency(
        devices, train_step_workload(args.model, args.batch_size), repeats=3
    )
    print(json.dumps({
        "bandwidth": bandwidth, "latency": latency,
        "concurrency_matmul": matmul, "concurrency": model, "kind": kind,
    }))


def child_train(args):
    """Times one epoch of training in one configuration; prints images/s as JSON."""
    import tf_spectrain
    from tf_spectrain.app import trainers

    if args.mode == "single":  # the first device, GPUs first, with TensorFlow's defaults
        devices = tf_spectrain.devices.existing_devices()[:1]
    else:
        devices = tf_spectrain.setup_devices(args.stages)
    import keras

    keras.utils.set_random_seed(0)
    data = common.synthetic_images(args.batch_size, args.steps)
    trainer = trainers.build_trainer(
        lambda: build_model(args.model),
        args.mode,
        devices,
        learning_rate=0.01,
        momentum=0.9,
        cuts=args.cuts.split(","),
    )
    clock = common.batch_clock()
    trainer.fit(data.take(2), epochs=1, verbose=0)  # tracing
    with common.CpuClock() as cpu:
        trainer.fit(data, epochs=1, verbose=0, callbacks=[clock])
    steady = clock.steady(args.batch_size, args.skip)
    print(json.dumps({"steady": steady, "epoch": clock.whole(args.batch_size),
                      "cores": cpu.cores}))


def run_child(kind, **flags):
    """Runs this script as a child measurement and returns its JSON result."""
    args = ["--child", kind]
    for key, value in flags.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return common.run_json_child(
        "benchmarks.speedup", args, f"child {kind} {flags}",
        dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


# --- predictions for 4 GPUs ---------------------------------------------------------------


def gpu_predictions(profile, hardware, args):
    """Images/s of every way to train, on `hardware`, for one model."""
    from tf_spectrain import costmodel

    batch, epoch = args.gpu_batch, args.batches_per_epoch
    row = {
        "single": costmodel.predict_single(profile, hardware, batch),
        "dp": costmodel.predict_data_parallel(profile, hardware, batch),
        "dp, overlap": costmodel.predict_data_parallel(profile, hardware, batch, overlap=True),
    }
    for label, recompute in (("pipeline", False), ("pipeline, recompute", True)):
        cuts = costmodel.best_cuts(profile, hardware, batch, recompute=recompute)
        row[label] = costmodel.predict_pipeline(
            profile, hardware, batch, cuts, num_batches=epoch, recompute=recompute
        )
        row[label + " cuts"] = cuts
    return row


def relative_speed(args, flops, device, tflops=None):
    """How much faster the assumed GPU is than the profiling device.

    A profile measured on a GPU is used as it is (1.0) unless a GPU rate is asked for;
    a CPU profile is scaled by the ratio of `--gpu-tflops` to the CPU's matrix-product rate.
    """
    tflops = args.gpu_tflops if tflops is None else tflops
    if tflops is None:
        return 1.0 if device == "GPU" else DEFAULT_GPU_TFLOPS * 1e12 / flops
    return tflops * 1e12 / flops


def speedup_table(profiles, args):
    """Predicted images/s and speedups on 4 GPUs over PCIe and NVLink, with notes."""
    from tf_spectrain import costmodel

    lines = [
        "| model | link | single | data parallel | dp, overlap | pipeline | pipeline, recompute "
        "| **pipeline / dp** | pipeline / dp, overlap | recompute / dp | paper |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name, (profile, flops, device) in profiles.items():
        speed = relative_speed(args, flops, device)
        for preset in (costmodel.PCIE3_X16, costmodel.NVLINK):
            hw = preset.replace(relative_speed=speed)
            row = gpu_predictions(profile, hw, args)
            ips = {k: v.images_per_second for k, v in row.items() if not k.endswith("cuts")}
            pipe, dp = ips["pipeline"], ips["dp"]
            lines.append(
                f"| {name} | {hw.name} | {ips['single']:.0f} | {dp:.0f} "
                f"| {ips['dp, overlap']:.0f} | {pipe:.0f} | {ips['pipeline, recompute']:.0f} "
                f"| **{pipe / dp:.2f}x** | {pipe / ips['dp, overlap']:.2f}x "
                f"| {ips['pipeline, recompute'] / dp:.2f}x | {PAPER_SPEEDUP}x |"
            )
            notes.append(_note(name, hw, row, profile))
    return lines + [""] + notes


def _note(name, hw, row, profile):
    """One line on where the time goes: all-reduce share, pipeline cuts and bounding stage."""
    dp, pipe = row["dp"], row["pipeline"]
    share = 100 * dp.communication_seconds / dp.seconds_per_batch
    return (
        f"- {name}, {hw.name}: relative_speed {hw.relative_speed:.0f}; weights "
        f"{profile.weight_bytes / 1e6:.1f} MB; dp all-reduce "
        f"{dp.communication_seconds * 1e3:.1f} ms of {dp.seconds_per_batch * 1e3:.1f} ms per "
        f"step ({share:.0f}%); pipeline cuts {row['pipeline cuts']}, bounding stage "
        f"{pipe.compute_seconds * 1e3:.1f} ms compute + "
        f"{pipe.communication_seconds * 1e3:.2f} ms hand-offs"
    )


def sensitivity_table(profiles, args):
    """Pipeline / data-parallel speedup as the assumed GPU speed varies (PCIe and NVLink)."""
    from tf_spectrain import costmodel

    rates = (2.5, 10.0, 40.0)
    lines = [
        "| model | link | " + " | ".join(f"{r:g} TFLOP/s" for r in rates) + " |",
        "|---|---|" + "---|" * len(rates),
    ]
    for name, (profile, flops, device) in profiles.items():
        for preset in (costmodel.PCIE3_X16, costmodel.NVLINK):
            cells = []
            for rate in rates:
                hw = preset.replace(relative_speed=relative_speed(args, flops, device, rate))
                row = gpu_predictions(profile, hw, args)
                ratio = row["pipeline"].images_per_second / row["dp"].images_per_second
                cells.append(f"{ratio:.2f}x")
            lines.append(f"| {name} | {preset.name} | " + " | ".join(cells) + " |")
    return lines


# --- validation on this machine -----------------------------------------------------------


def validate(args, log):
    """Measures training here and predicts it; returns the table's lines."""
    from tf_spectrain import costmodel

    names = ["single", "pipeline, stash"] if args.quick else list(VALIDATION_CONFIGS)
    machine = run_child("machine", stages=4, model="vgg16", batch_size=args.batch_size)
    log(f"validation machine: {machine}")
    hw = costmodel.Hardware(
        num_gpus=4, relative_speed=1.0, bandwidth=machine["bandwidth"],
        latency=machine["latency"], concurrency=machine["concurrency"],
        name=f"4 {machine['kind']} devices as measured",
    )
    # Each round profiles the model again, so that the profile sees the same load on this
    # shared machine as the measurements around it; the per-layer medians count.
    profiles, whole, measured, loads, cuts = [], [], {n: [] for n in names}, [], None
    for r in range(args.rounds):
        result = run_child(
            "profile", model="vgg16", batch_size=args.batch_size, repeats=args.repeats
        )
        profiles.append(costmodel.ModelProfile.from_dict(result["profile"]))
        whole.append(result["whole_step"])
        log(f"round {r + 1}: profile {profiles[-1].forward_time:.3f} s forward, "
            f"{profiles[-1].backward_time:.3f} s backward, on {result['profile_cores']:.2f} "
            "cores (CPU/wall)")
        # The cuts come from the first profile and stay fixed for every measurement.
        cuts = cuts or costmodel.best_cuts(profiles[0], hw, args.batch_size)
        for name in names:
            config = VALIDATION_CONFIGS[name]
            loads.append(os.getloadavg()[0])
            measured[name].append(run_child(
                "train", model="vgg16", mode=config["mode"], stages=4, cuts=",".join(cuts),
                batch_size=args.batch_size, steps=args.steps, skip=args.skip,
            ))
            log(f"round {r + 1}: {name}: {measured[name][-1]}")
    profile = median_profile(profiles)
    predicted = {n: _predict_here(n, profile, hw, cuts, args) for n in names}
    lines = [
        f"Hardware model of the 4 {machine['kind']} devices (measured): "
        f"bandwidth {hw.bandwidth / 1e9:.0f} GB/s, "
        f"latency {hw.latency * 1e6:.0f} us, concurrency {hw.concurrency:.2f} of 4 devices "
        f"for VGG16's training step ({machine['concurrency_matmul']:.2f} for matrix "
        "products). "
        f"VGG16, batch {args.batch_size}, {args.steps} mini-batches per epoch, cuts {cuts}; "
        f"profiled forward {profile.forward_time:.3f} s + backward {profile.backward_time:.3f} s "
        f"per batch (median of {args.rounds} profiles; Keras' whole-model step took "
        f"{statistics.median(whole):.3f} s in the same processes); {args.rounds} interleaved "
        "rounds, "
        f"medians; 1-minute load average {min(loads):.1f}-{max(loads):.1f} on 2 cores.",
        "",
        "| configuration | predicted steady | measured steady | error | predicted epoch "
        "| measured epoch | error | CPU/wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        steady = statistics.median(m["steady"] for m in measured[name])
        epoch = statistics.median(m["epoch"] for m in measured[name])
        p_steady, p_epoch = predicted[name]
        lines.append(
            f"| {name} | {p_steady:.1f} | {steady:.1f} | {_error(p_steady, steady)} "
            f"| {p_epoch:.1f} | {epoch:.1f} | {_error(p_epoch, epoch)} "
            f"| {statistics.median(m['cores'] for m in measured[name]):.2f} |"
        )
    return lines


def _predict_here(name, profile, hw, cuts, args):
    """Predicted (steady, whole-epoch) images/s of one validation configuration."""
    from tf_spectrain import costmodel

    config = VALIDATION_CONFIGS[name]
    batch = args.batch_size
    if config["mode"] == "single":
        ips = costmodel.predict_single(profile, hw, batch).images_per_second
        return ips, ips
    if config["mode"] == "dp":
        ips = costmodel.predict_data_parallel(profile, hw, batch).images_per_second
        return ips, ips
    recompute = config["recompute"]
    steady = costmodel.predict_pipeline(profile, hw, batch, cuts, recompute=recompute)
    epoch = costmodel.predict_pipeline(
        profile, hw, batch, cuts, num_batches=args.steps, recompute=recompute
    )
    return steady.images_per_second, epoch.images_per_second


def _error(predicted, measured):
    return f"{100 * (predicted - measured) / measured:+.0f}%"


def median_profile(profiles):
    """Per-layer medians of several profiles of the same model (measured between runs)."""
    from tf_spectrain import costmodel

    layers = [
        costmodel.LayerProfile(
            name=parts[0].name,
            forward_time=statistics.median(p.forward_time for p in parts),
            backward_time=statistics.median(p.backward_time for p in parts),
            output_bytes=parts[0].output_bytes,
            weight_bytes=parts[0].weight_bytes,
        )
        for parts in zip(*(p.layers for p in profiles))
    ]
    return costmodel.ModelProfile(layers, profiles[0].batch_size, profiles[0].name)


def with_backward_ratio(profile, ratio):
    """The profile with every layer's backward set to `ratio` times its forward."""
    from tf_spectrain import costmodel

    layers = [
        costmodel.LayerProfile(
            layer.name, layer.forward_time, ratio * layer.forward_time,
            layer.output_bytes, layer.weight_bytes,
        )
        for layer in profile.layers
    ]
    return costmodel.ModelProfile(layers, profile.batch_size, profile.name)


# --- main ---------------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.speedup", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true",
                   help="batch 8, 3 repeats, one short validation round (single and stash)")
    p.add_argument("--out", default=None, help="also write the tables to this markdown file")
    p.add_argument("--batch-size", type=int, default=32,
                   help="profiling and validation batch size")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per layer function")
    p.add_argument("--gpu-batch", type=int, default=128, help="global batch on the 4 GPUs")
    p.add_argument("--batches-per-epoch", type=int, default=391,
                   help="mini-batches per epoch for the pipeline's fill and drain (CIFAR-10)")
    p.add_argument("--gpu-tflops", type=float, default=None,
                   help="float32 matrix-product rate assumed for one GPU, in TFLOP/s "
                   f"(default: {DEFAULT_GPU_TFLOPS:g} for a CPU profile; a GPU profile is "
                   "used as measured)")
    p.add_argument("--steps", type=int, default=10, help="mini-batches per validation epoch")
    p.add_argument("--skip", type=int, default=4, help="first mini-batches left out (fill)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved validation repeats")
    p.add_argument("--skip-validation", action="store_true")
    # Child-only flags.
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default="vgg16", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="single", help=argparse.SUPPRESS)
    p.add_argument("--stages", type=int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--cuts", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.batch_size, args.repeats, args.steps, args.skip, args.rounds = 8, 3, 8, 3, 1
    if args.steps < args.skip + 2:
        p.error(f"--steps must exceed --skip + 1; got --steps {args.steps} --skip {args.skip}")
    return args


def main():
    args = parse_args()
    if args.child:
        return {"profile": child_profile, "machine": child_machine, "train": child_train}[
            args.child
        ](args)

    from tf_spectrain import costmodel

    start = time.perf_counter()

    def log(message):
        print(f"[{time.perf_counter() - start:6.0f} s] {message}", file=sys.stderr, flush=True)

    profiles = {}
    for name in MODELS:
        result = run_child("profile", model=name, batch_size=args.batch_size, repeats=args.repeats)
        profile = costmodel.ModelProfile.from_dict(result["profile"])
        profiles[name] = (profile, result["cpu_flops"], result["device"])
        log(f"profiled {name} on {result['device']}: {profile}, "
            f"{result['cpu_flops'] / 1e9:.0f} GFLOP/s, on {result['profile_cores']:.2f} cores "
            "(CPU/wall)")
    command = " ".join(["python", "-m", "benchmarks.speedup"] + sys.argv[1:])
    text = [
        f"`{command}`",
        "",
        f"Predicted images/s on 4 GPUs, global batch {args.gpu_batch}, pipeline epochs of "
        f"{args.batches_per_epoch} mini-batches (fill and drain included); GPU at "
        f"{args.gpu_tflops or DEFAULT_GPU_TFLOPS:g} TFLOP/s (float32 matrix products) for CPU "
        f"profiles, profiled at batch {args.batch_size}:",
        "",
    ]
    text += speedup_table(profiles, args)
    text += [
        "",
        "The same with every layer's backward set to twice its profiled forward (the FLOP "
        "ratio of convolutions and dense layers, roughly what GPUs show; this CPU's backward "
        "of small convolutions is far slower than that):",
        "",
    ]
    text += speedup_table(
        {n: (with_backward_ratio(p, 2.0), f, d) for n, (p, f, d) in profiles.items()}, args
    )
    text += ["", "Pipeline / data parallel (no overlap) for other GPU speeds:", ""]
    text += sensitivity_table(profiles, args)
    if not args.skip_validation:
        text += ["", "Validation on this machine (images/s):", ""]
        text += validate(args, log)
    text += ["", f"Total {(time.perf_counter() - start) / 60:.1f} min."]
    common.publish("\n".join(text), args.out)


if __name__ == "__main__":
    main()
