"""What the cost model predicts `mixed_bfloat16` changes for training on 4 GPUs.

    python -m benchmarks.precision_predict --profiles /tmp/precision_profiles.json
    python -m benchmarks.precision_predict --bf16-speedups 1,2,4 --out FILE

1. Profiles VGG16 and ResNet-50 (the zoo's, 32x32x3 inputs, 10 classes, as
   `benchmarks/speedup.py` builds them) on this CPU twice, each in its own process: built
   under float32, and built under the Keras policy `mixed_bfloat16`. `profile_model` reads
   the sizes from the real tensors, so the second profile has 2-byte activations and
   hand-offs, while the weights (and so the gradients and optimizer slots) stay float32.
   The bfloat16 profile is timed once: only its bytes are used.
2. Predicts both precisions on 4 GPUs over PCIe 3.0 x16 with the float32 profile's
   per-layer times (this CPU's bfloat16 kernels say nothing about a GPU's), scaled to the
   GPU as speedup.py does (`--gpu-tflops` over the CPU's float32 matrix-product rate). For
   bfloat16 every layer's times are divided by an assumed compute speedup (`--bf16-speedups`:
   1 is the memory traffic alone, 2 and 4 tensor-core bfloat16 over float32 / TF32) and the
   bytes are the bfloat16 profile's (`combine`). Configurations: the 4-stage asynchronous
   pipeline in paper SpecTrain mode, the synchronous pipeline (GPipe, M micro-batches),
   each with the cuts `costmodel.best_cuts` chooses for that profile, and data parallelism.
3. Gives each stage's memory as the planner prices it (`StageTerms`, sync 1F1B-flush, N = 4,
   M micro-batches) for float32 and bfloat16 at the same cuts.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import time

from benchmarks import common, speedup

MODELS = ("vgg16", "resnet50")
POLICIES = ("float32", "mixed_bfloat16")
DEFAULT_SPEEDUPS = (1.0, 2.0, 4.0)
NUM_STAGES = 4  # costmodel.PCIE3_X16's GPUs
SPECTRAIN = "spectrain (paper), 4 stages"
DATA_PARALLEL = "data parallel, 4 GPUs"


def sync_label(micro_batches):
    """The synchronous pipeline's configuration label."""
    return f"sync gpipe M={micro_batches}, 4 stages"


# --- combining one profile's times with another's bytes ------------------------------------


def combine(times, sizes, compute_speedup=1.0):
    """A profile with the per-layer times of one profile and the bytes of another.

    Args:
        times: the `ModelProfile` whose forward and backward times count (the float32 one),
            each divided by `compute_speedup`; its batch size is the new profile's.
        sizes: a `ModelProfile` of the same layers whose output, activation, weight and
            input bytes count (the one built under `mixed_bfloat16`).
        compute_speedup: how many times faster every layer computes, a finite number > 0.

    Returns:
        A `ModelProfile` named after `sizes`.

    Raises:
        TypeError: if `times` or `sizes` is not a `ModelProfile`.
        ValueError: if their layers differ, or for a bad `compute_speedup`.
    """
    from tf_spectrain import checks, costmodel

    checks.check_instance("times", times, costmodel.ModelProfile)
    checks.check_instance("sizes", sizes, costmodel.ModelProfile)
    if times.names != sizes.names:
        where = next(
            (p for p, (a, b) in enumerate(zip(times.names, sizes.names)) if a != b),
            min(len(times), len(sizes)),
        )
        raise ValueError(
            f"`times` and `sizes` must profile the same layers in the same order, but "
            f"'{times.name}' has {len(times)} layers and '{sizes.name}' {len(sizes)}, first "
            f"differing at position {where}: "
            f"{times.names[where:where + 1]} against {sizes.names[where:where + 1]}."
        )
    ratio = checks.check_number(
        "compute_speedup", compute_speedup, 0.0, strict=True, meaning="how many times faster"
    )
    layers = [
        dataclasses.replace(
            s, forward_time=t.forward_time / ratio, backward_time=t.backward_time / ratio
        )
        for t, s in zip(times.layers, sizes.layers)
    ]
    return costmodel.ModelProfile(
        layers, times.batch_size, name=sizes.name, input_bytes=sizes.input_bytes
    )


# --- predictions ---------------------------------------------------------------------------


def predict_configs(profile, hardware, batch_size, micro_batches, num_batches=None):
    """`{label: (Estimate, cuts)}` of the three configurations for one profile.

    The pipelines take the cuts `best_cuts` chooses for this profile (with recomputation
    for paper SpecTrain, without for sync); data parallelism has no cuts (None).
    `num_batches` (None: the steady state) is the epoch of the pipelines' fill and drain.
    """
    from tf_spectrain import costmodel

    paper = costmodel.best_cuts(profile, hardware, batch_size, recompute=True)
    sync = costmodel.best_cuts(profile, hardware, batch_size, recompute=False)
    return {
        SPECTRAIN: (
            costmodel.predict_pipeline(
                profile, hardware, batch_size, paper, num_batches=num_batches, recompute=True
            ),
            paper,
        ),
        sync_label(micro_batches): (
            costmodel.predict_sync(
                profile, hardware, batch_size, sync, micro_batches=micro_batches,
                schedule="gpipe", num_batches=num_batches,
            ),
            sync,
        ),
        DATA_PARALLEL: (costmodel.predict_data_parallel(profile, hardware, batch_size), None),
    }


def predict_precisions(fp32, bf16, hardware, batch_size, speedups, micro_batches,
                       num_batches=None):
    """Every configuration for float32 and for bfloat16 at each assumed compute speedup.

    Args:
        fp32: the float32 `ModelProfile` (its times count for both precisions).
        bf16: the `ModelProfile` of the model built under `mixed_bfloat16` (its bytes).
        hardware: the GPUs, a `costmodel.Hardware` (its `relative_speed` already set).
        batch_size: the global mini-batch.
        speedups: the assumed bfloat16 compute speedups (numbers > 0).
        micro_batches: `M` of the sync pipeline.
        num_batches: as `predict_configs`.

    Returns:
        `{"fp32": predict_configs(fp32), s: predict_configs(combine(fp32, bf16, s)), ...}`.
    """
    results = {"fp32": predict_configs(fp32, hardware, batch_size, micro_batches, num_batches)}
    for s in speedups:
        results[s] = predict_configs(
            combine(fp32, bf16, s), hardware, batch_size, micro_batches, num_batches
        )
    return results


def _ips(value):
    return f"{value:.0f}"


def throughput_table(results):
    """Markdown: images/s of each model and configuration, fp32 and bf16 per speedup.

    Args:
        results: `{model: predict_precisions(...)}`.
    """
    speedups = [s for s in next(iter(results.values())) if s != "fp32"]
    header = ["model", "configuration", "fp32 images/s"]
    for s in speedups:
        header += [f"bf16 x{s:g} images/s", f"bf16 x{s:g} / fp32"]
    rows = []
    for model, by_precision in results.items():
        for label, (fp32, _) in by_precision["fp32"].items():
            row = [model, label, _ips(fp32.images_per_second)]
            for s in speedups:
                bf16 = by_precision[s][label][0].images_per_second
                row += [_ips(bf16), f"{bf16 / fp32.images_per_second:.2f}x"]
            rows.append(row)
    return common.markdown_table(header, rows)


def cuts_notes(results):
    """One line per model and pipeline: the cuts `best_cuts` chose for each precision."""
    lines = []
    for model, by_precision in results.items():
        for label, (_, cuts) in by_precision["fp32"].items():
            if cuts is None:
                continue
            parts = [f"fp32 {cuts}"]
            for s, configs in by_precision.items():
                if s != "fp32":
                    other = configs[label][1]
                    parts.append(f"bf16 x{s:g} " + ("the same" if other == cuts else str(other)))
            lines.append(f"- {model}, {label}: cuts " + "; ".join(parts))
    return lines


# --- memory per stage ----------------------------------------------------------------------


def stage_memory(profile, hardware, batch_size, cuts, micro_batches):
    """The planner's `StageEstimate` of each stage: sync 1F1B-flush, momentum SGD (1 slot).

    Args:
        profile: a `ModelProfile` (its bytes count).
        hardware: a `costmodel.Hardware` (its link and speed price the times).
        batch_size: the mini-batch.
        cuts: the cut layer names (`len(cuts) + 1` stages).
        micro_batches: `M`.

    Returns:
        A list of `StageEstimate`, stage 0 first.
    """
    from tf_spectrain import costmodel

    terms = costmodel.StageTerms(
        profile, batch_size, len(cuts) + 1, mode="sync", micro_batches=micro_batches,
        schedule="1f1b", bandwidth=hardware.bandwidth, latency=hardware.latency,
        relative_speed=hardware.relative_speed, optimizer_slots=1,
    )
    bounds = [-1] + profile.cut_positions(cuts) + [len(profile) - 1]
    return [terms.estimate(a + 1, b, k) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def _mb(num_bytes):
    return f"{num_bytes / 1e6:.1f}"


def memory_table(memory):
    """Markdown: each stage's activation and total bytes (MB) for fp32 and bf16.

    Args:
        memory: `{model: (names, fp32 estimates, bf16 estimates)}`, the estimates of
            `stage_memory` at the same cuts and `names` the profile's layer names.
    """
    rows = []
    for model, (names, fp32, bf16) in memory.items():
        for a, b in zip(fp32, bf16):
            share = b.activation_bytes / a.activation_bytes if a.activation_bytes else math.nan
            rows.append([
                model, a.index, f"{names[a.first]} .. {names[a.last]}",
                _mb(a.activation_bytes), _mb(b.activation_bytes), f"{share:.2f}",
                _mb(a.memory_bytes), _mb(b.memory_bytes),
            ])
    return common.markdown_table(
        ["model", "stage", "layers", "fp32 activations MB", "bf16 activations MB",
         "bf16 / fp32", "fp32 total MB", "bf16 total MB"], rows,
    )


# --- profiles ------------------------------------------------------------------------------


def load_profiles(path, models, batch_size, repeats, profile=None):
    """`{(model, policy): entry}` for every model and policy, read from `path` or profiled.

    An entry is what the profiling child prints: `{"profile": ModelProfile.to_dict(),
    "cpu_flops": ..., "device": ..., "load": [before, after], "seconds": ...}`. A missing
    entry (or one at another batch size) is profiled with `profile(model, policy)` (default:
    this script's child process) and the file, when given, is rewritten with it.
    """
    profile = profile or (lambda model, policy: _run_child(model, policy, batch_size, repeats))
    cached = {}
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
    changed = False
    for model in models:
        for policy in POLICIES:
            key = f"{model} {policy}"
            entry = cached.get(key)
            if entry is None or entry["profile"]["batch_size"] != batch_size:
                print(f"profiling {model} under {policy} at batch {batch_size} ...",
                      file=sys.stderr, flush=True)
                cached[key] = profile(model, policy)
                changed = True
    if path and changed:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cached, f)
    return {(m, p): cached[f"{m} {p}"] for m in models for p in POLICIES}


def _run_child(model, policy, batch_size, repeats):
    # The bfloat16 profile is for its bytes only: one untimed-warmup-free call per layer.
    reps, warmup = (repeats, 2) if policy == "float32" else (1, 0)
    return common.run_json_child(
        "benchmarks.precision_predict",
        ["--child", "profile", "--model", model, "--policy", policy, "--batch-size",
         str(batch_size), "--repeats", str(reps), "--warmup", str(warmup)],
        f"profile {model} {policy}", dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def child_profile(args):
    """Builds and profiles `args.model` under `args.policy`; prints the entry as JSON."""
    import keras

    from tf_spectrain import costmodel

    load = [os.getloadavg()[0]]
    start = time.perf_counter()
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(args.policy)
    try:
        model = speedup.build_model(args.model)
        with common.CpuClock() as cpu:
            profile = costmodel.profile_model(
                model, args.batch_size, repeats=args.repeats, warmup=args.warmup
            )
    finally:
        keras.mixed_precision.set_global_policy(previous)
    flops = speedup.matmul_flops() if args.policy == "float32" else None
    load.append(os.getloadavg()[0])
    print(json.dumps({
        "profile": profile.to_dict(), "cpu_flops": flops, "device": "CPU", "load": load,
        "cores": cpu.cores, "seconds": time.perf_counter() - start,
    }))


# --- main ----------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.precision_predict", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--profiles", help="JSON file of the profiles: read if it exists, else "
                   "written after profiling")
    p.add_argument("--models", type=common.csv_of(str, MODELS), default=list(MODELS))
    p.add_argument("--batch-size", type=common.positive_int, default=32,
                   help="profiling batch size (speedup.py's)")
    p.add_argument("--repeats", type=common.positive_int, default=5,
                   help="timed calls per layer function of the float32 profile")
    p.add_argument("--gpu-batch", type=common.positive_int, default=128,
                   help="global batch on the 4 GPUs")
    p.add_argument("--batches-per-epoch", type=common.positive_int, default=391,
                   help="mini-batches per epoch for the pipelines' fill and drain")
    p.add_argument("--micro-batches", type=common.positive_int, default=8,
                   help="micro-batches per mini-batch of the sync pipeline")
    p.add_argument("--gpu-tflops", type=float, default=None,
                   help=f"assumed GPU float32 TFLOP/s (default {speedup.DEFAULT_GPU_TFLOPS:g})")
    p.add_argument("--bf16-speedups", type=common.csv_of(float), default=list(DEFAULT_SPEEDUPS),
                   help="assumed bfloat16 over float32 compute speedups (1: bytes only)")
    p.add_argument("--out", help="also write the report to this markdown file")
    p.add_argument("--child", choices=["profile"], help=argparse.SUPPRESS)
    p.add_argument("--model", choices=MODELS, default="vgg16", help=argparse.SUPPRESS)
    p.add_argument("--policy", choices=POLICIES, default="float32", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=common.non_negative_int, default=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.gpu_tflops is not None and not (math.isfinite(args.gpu_tflops)
                                            and args.gpu_tflops > 0):
        p.error(f"--gpu-tflops must be a finite number > 0, got {args.gpu_tflops}")
    return args


def header(args, entries):
    """The report's opening lines: the command, the hardware and what is assumed."""
    tflops = args.gpu_tflops or speedup.DEFAULT_GPU_TFLOPS
    loads = [x for e in entries.values() for x in e.get("load", [])]
    load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "unknown"
    speeds = ", ".join(
        f"{m} {speedup.relative_speed(args, e['cpu_flops'], e['device']):.0f} "
        f"({e['cpu_flops'] / 1e9:.0f} GFLOP/s)"
        for (m, p), e in entries.items() if p == "float32"
    )
    return [
        f"`python -m benchmarks.precision_predict {' '.join(sys.argv[1:])}`", "",
        f"Predicted images/s on 4 GPUs over PCIe 3.0 x16 (12 GB/s, 10 us per transfer), "
        f"global batch {args.gpu_batch}, pipeline epochs of {args.batches_per_epoch} "
        f"mini-batches (fill and drain included), GPU at {tflops:g} TFLOP/s float32; "
        f"relative_speed (GPU over this CPU's float32 matrix products) {speeds}.", "",
        "**Assumed:** both precisions use the float32 profile's per-layer times; bfloat16 "
        "(`mixed_bfloat16`) divides every layer's forward and backward by the compute "
        "speedup `x` (x1: only the bytes change, activations and hand-offs at 2 bytes; x2 "
        "and x4: tensor-core bfloat16 over float32/TF32), and takes its hand-off and "
        "activation bytes from a profile of the model built under `mixed_bfloat16`. "
        "Weights, gradients (so the data-parallel all-reduce) and optimizer slots stay "
        "float32. The cost model scales all layers alike; on a GPU the memory-bound layers "
        "(BatchNorm, ReLU, pooling) would gain from 2-byte tensors even at x1.", "",
        f"Profiled on this CPU at batch {args.batch_size} (float32 {args.repeats} timed "
        f"calls per layer; bfloat16 once, for its bytes), 1-minute load average {load} on "
        f"{os.cpu_count()} cores: the load slows the profile and the matrix-product rate "
        "alike, and the bfloat16 times are not used.",
    ]


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child_profile(args)
    from tf_spectrain import costmodel

    entries = load_profiles(args.profiles, args.models, args.batch_size, args.repeats)
    results, memory = {}, {}
    for model in args.models:
        fp32_entry = entries[(model, "float32")]
        fp32 = costmodel.ModelProfile.from_dict(fp32_entry["profile"])
        bf16 = costmodel.ModelProfile.from_dict(entries[(model, "mixed_bfloat16")]["profile"])
        speed = speedup.relative_speed(args, fp32_entry["cpu_flops"], fp32_entry["device"])
        hw = costmodel.PCIE3_X16.replace(relative_speed=speed)
        results[model] = predict_precisions(
            fp32, bf16, hw, args.gpu_batch, args.bf16_speedups, args.micro_batches,
            args.batches_per_epoch,
        )
        cuts = results[model]["fp32"][sync_label(args.micro_batches)][1]
        memory[model] = (
            fp32.names,
            stage_memory(fp32, hw, args.gpu_batch, cuts, args.micro_batches),
            stage_memory(combine(fp32, bf16), hw, args.gpu_batch, cuts, args.micro_batches),
        )
    m = args.micro_batches
    text = header(args, entries) + [
        "", throughput_table(results), "", *cuts_notes(results), "",
        f"Each stage's memory as the planner prices it (`StageTerms`: sync, schedule 1f1b, "
        f"N = {NUM_STAGES}, M = {m}, batch {args.gpu_batch}, momentum SGD), at the fp32 "
        f"sync cuts for both precisions; activations are what the micro-batches in flight "
        f"keep (min(N - k, M) of {args.gpu_batch / m:g} examples), total adds the weights and "
        "one optimizer slot:", "", memory_table(memory),
    ]
    common.publish("\n".join(text), args.out)


if __name__ == "__main__":
    main()
