"""Predicted images/s on several hosts: pipeline, data parallelism and data x pipeline hybrids.

    python -m benchmarks.hosts_predict --profiles profiles.json     # docs/RESULTS.md section 11
    python -m benchmarks.hosts_predict --loopback hosts.jsonl       # against benchmarks/hosts.py

- Default: the cost model's images/s for 2 hosts x 4 GPUs (PCIe 3.0 x16 within a host)
  over 25 and 100 Gb/s Ethernet, for VGG16 and ResNet-50: an 8-stage pipeline, data
  parallelism over 8 GPUs (a flat ring; without and with overlap of the backward), and R
  replicas of an N-stage pipeline (R x N = 2 x 4: one pipeline per host; and 4 x 2), with
  one inter-host link per GPU and with one network card per host; one host of 4 GPUs for
  reference. The GPU assumptions and profiles are `benchmarks/speedup.py`'s (RESULTS.md
  section 4): each model profiled layer by layer on this CPU at batch 32, its times divided
  by `--gpu-tflops` over the CPU's measured matrix-product rate. `--profiles FILE` keeps
  the profiles: a file that exists is read, a missing one is written after profiling.
- `--loopback FILE`: the records `benchmarks/hosts.py --jsonl FILE` wrote, next to
  `predict_loopback`'s prediction of them (its 2-stage pipeline with one CPU device per
  worker, the link `measure_link` fitted over loopback and locally, and a profile of the
  model at the run's batch size with one intra-op thread, as hosts.py's trainers use;
  `--loopback-profile FILE` keeps it like `--profiles`).
"""

import argparse
import functools
import json
import math
import os
import statistics
import sys

from benchmarks import common, speedup

MODELS = ("vgg16", "resnet50")
ETHERNET_GBITS = (25.0, 100.0)
# A transfer between hosts: TCP over a switch plus the runtime's per-message cost; assumed.
INTER_HOST_LATENCY = 50e-6
HOSTS, GPUS_PER_HOST = 2, 4
# (replicas, stages) of the hybrids, one pipeline per host first.
HYBRIDS = ((2, 4), (4, 2))
LOOPBACK_MODES = {"stash": False}  # hosts.py's pipeline mode -> whether it recomputes


# --- the predictions ----------------------------------------------------------------------


def cluster(speed, gbits, nics_per_host=None, latency=INTER_HOST_LATENCY):
    """2 hosts x 4 GPUs, PCIe 3.0 x16 within a host, `gbits` Gb/s Ethernet between them."""
    from tf_spectrain import costmodel

    return costmodel.PCIE3_X16.replace(
        num_gpus=HOSTS * GPUS_PER_HOST, num_hosts=HOSTS, relative_speed=speed,
        inter_host_bandwidth=gbits * 1e9 / 8, inter_host_latency=latency,
        nics_per_host=nics_per_host, name=f"{HOSTS} x {GPUS_PER_HOST} GPUs, {gbits:g} Gb/s",
    )


@functools.lru_cache(maxsize=None)
def best_cuts(profile, hardware, batch_size, num_stages=None, replicas=1):
    """`costmodel.best_cuts`, remembered (the tables ask for the same cuts again)."""
    from tf_spectrain import costmodel

    return costmodel.best_cuts(
        profile, hardware, batch_size, num_stages=num_stages, replicas=replicas
    )


@functools.lru_cache(maxsize=None)
def predict_hosts(profile, speed, gbits, batch_size=128, num_batches=391):
    """Every configuration's `Estimate` on `cluster(speed, gbits)`, by label (see the table)."""
    from tf_spectrain import costmodel

    one_host = costmodel.PCIE3_X16.replace(relative_speed=speed)
    eight = cluster(speed, gbits)

    def pipeline(hw):
        cuts = best_cuts(profile, hw, batch_size)
        return costmodel.predict_pipeline(profile, hw, batch_size, cuts, num_batches=num_batches)

    row = {
        "1 host: dp 4": costmodel.predict_data_parallel(profile, one_host, batch_size),
        "1 host: pipeline 4": pipeline(one_host),
        "pipeline 8": pipeline(eight),
        "dp 8": costmodel.predict_data_parallel(profile, eight, batch_size),
        "dp 8, overlap": costmodel.predict_data_parallel(profile, eight, batch_size, overlap=True),
    }
    for nics, suffix in ((None, ""), (1, ", 1 NIC")):
        hw = cluster(speed, gbits, nics_per_host=nics)
        for r, n in HYBRIDS:
            cuts = best_cuts(profile, hw, batch_size, num_stages=n, replicas=r)
            row[f"hybrid {r}x{n}{suffix}"] = costmodel.predict_hybrid(
                profile, hw, batch_size, cuts, r, num_batches=num_batches
            )
    return row


def hosts_table(profiles, args):
    """Markdown: images/s of every configuration, a row per model and Ethernet speed."""
    labels = None
    rows = []
    for name, (profile, flops, device) in profiles.items():
        speed = speedup.relative_speed(args, flops, device)
        for gbits in args.ethernet:
            row = predict_hosts(profile, speed, gbits, args.gpu_batch, args.batches_per_epoch)
            labels = list(row)
            ips = {k: v.images_per_second for k, v in row.items()}
            best = max((k for k in ips if not k.startswith("1 host")), key=ips.get)
            rows.append([name, f"{gbits:g} Gb/s"] + [f"{ips[k]:.0f}" for k in labels] + [best])
    return common.markdown_table(["model", "Ethernet"] + labels + ["best on 8"], rows)


def sensitivity_table(profiles, args, rates=(2.5, 10.0, 40.0)):
    """Markdown: hybrid 2x4 and dp 8 over pipeline 8, as the assumed GPU speed varies."""
    rows = []
    for name, (profile, flops, device) in profiles.items():
        for gbits in args.ethernet:
            cells = []
            for rate in rates:
                speed = speedup.relative_speed(args, flops, device, rate)
                row = predict_hosts(profile, speed, gbits, args.gpu_batch, args.batches_per_epoch)
                pipe = row["pipeline 8"].images_per_second
                cells.append(f"{row['hybrid 2x4'].images_per_second / pipe:.2f}x / "
                             f"{row['dp 8'].images_per_second / pipe:.2f}x")
            rows.append([name, f"{gbits:g} Gb/s"] + cells)
    return common.markdown_table(
        ["model", "Ethernet"] + [f"{r:g} TFLOP/s" for r in rates], rows
    )


def notes(profiles, args):
    """One line per model and speed: where the time goes in pipeline 8, dp 8, hybrid 2x4."""
    lines = []
    for name, (profile, flops, device) in profiles.items():
        speed = speedup.relative_speed(args, flops, device)
        for gbits in args.ethernet:
            row = predict_hosts(profile, speed, gbits, args.gpu_batch, args.batches_per_epoch)
            parts = []
            for label in ("pipeline 8", "dp 8", "hybrid 2x4", "hybrid 2x4, 1 NIC"):
                e = row[label]
                parts.append(f"{label} {e.seconds_per_batch * 1e3:.1f} ms per mini-batch "
                             f"(bounding: {e.compute_seconds * 1e3:.1f} compute + "
                             f"{e.communication_seconds * 1e3:.1f} transfers)")
            hw = cluster(speed, gbits)
            cuts = best_cuts(profile, hw, args.gpu_batch)
            crossing = cuts[hw.crossing_hops(list(range(len(cuts) + 1)))[0]]
            lines.append(f"- {name}, {gbits:g} Gb/s: relative_speed {speed:.1f}, weights "
                         f"{profile.weight_bytes / 1e6:.1f} MB; " + "; ".join(parts)
                         + f"; pipeline 8 crosses hosts after {crossing}")
    return lines


# --- the loopback case of benchmarks/hosts.py -----------------------------------------------


def predict_loopback(profile, loopback, local=(math.inf, 0.0), batch_size=64,
                     cuts=("block3_relu2",), num_batches=None, concurrency=None,
                     recompute=False, runtime=None):
    """Predicts benchmarks/hosts.py's training: 2 stages, one CPU device each.

    "loopback" is two workers on one machine: two hosts of one device each, joined by the
    measured loopback link; "local" one host of two logical devices joined by `local`.
    Times are the profile's (`relative_speed` 1): profile the model on this CPU with the
    trainers' threads (one intra-op thread) at `batch_size`.

    Args:
        profile: a `costmodel.ModelProfile` of the model (any batch: times scale).
        loopback: `(bandwidth, latency)` of a hand-off between the workers (bytes/s,
            seconds), e.g. hosts.py's `measure_link` fit of the loopback run.
        local: `(bandwidth, latency)` between the local devices (default: free).
        batch_size: the mini-batch, an int >= 1 (hosts.py's `--batch-size`).
        cuts: the pipeline's cut (hosts.py: `block3_relu2` for VGG16).
        num_batches: mini-batches per timed fit (fill and drain included), or None for
            the steady state.
        concurrency: how many of the 2 devices compute at once (None: both).
        recompute: whether the first stage recomputes its forward (not in `stash`).
        runtime: the runtime's fixed host cost (`costmodel.RuntimeCosts`), or None.

    Returns:
        `{"local": Estimate, "loopback": Estimate}` of `predict_pipeline`.
    """
    from tf_spectrain import costmodel

    local_hw = costmodel.Hardware(
        2, 1.0, bandwidth=local[0], latency=local[1], concurrency=concurrency, name="local"
    )
    loop_hw = local_hw.replace(
        num_hosts=2, inter_host_bandwidth=loopback[0], inter_host_latency=loopback[1],
        name="loopback",
    )
    return {
        where: costmodel.predict_pipeline(profile, hw, batch_size, list(cuts),
                                          num_batches=num_batches, recompute=recompute,
                                          runtime=runtime)
        for where, hw in (("local", local_hw), ("loopback", loop_hw))
    }


def loopback_runtime(train, remote_latency):
    """The runtime's fixed cost of hosts.py's trainer (`costmodel.RuntimeCosts`).

    Windows (`steps_per_execution` "auto" or K; "auto" is 8) pay one remote call per
    window and remote stage, pass by pass ("eager", `run_eagerly=True`; and 1 in records
    made before windows of one existed, which lack `run_eagerly_known`) three (forward,
    backward, update) per mini-batch: each a loopback call of `remote_latency` seconds (the
    link's fitted latency, which includes the call itself).
    """
    import dataclasses

    from tf_spectrain import costmodel

    spe = str(train.get("steps_per_execution", "1"))
    if spe == "eager" or spe == "1" and not train.get("run_eagerly_known"):
        base, calls = costmodel.PASS_BY_PASS, 3.0
    else:
        base, calls = costmodel.WINDOWS, 1.0 / (8 if spe == "auto" else int(spe))
    return dataclasses.replace(base, remote_stage_seconds=calls * remote_latency,
                               name=f"{base.name}, loopback")


def loopback_table(records, profile, concurrency=None):
    """Markdown: hosts.py's measured images/s per placement and window beside the model's.

    Where the local records hold each stage's measured times (`stage_times`), the profile's
    layers are scaled to them (`costmodel.calibrate_stages`, the medians over the records),
    and the runtime's fixed cost per mini-batch is charged (`loopback_runtime`).

    Args:
        records: hosts.py's JSON-lines records (kinds "link" and "train", "where" "local"
            or "remote"), of one model and batch size.
        profile: a `costmodel.ModelProfile` of that model.
        concurrency: as `predict_loopback`.
    """
    from tf_spectrain import costmodel

    by = {(kind, where): [r for r in records if r["kind"] == kind and r["where"] == where]
          for kind in ("link", "train") for where in ("local", "remote")}
    missing = [f"{kind} {where}" for (kind, where), rs in by.items() if not rs]
    if missing:
        raise ValueError(f"The records lack {', '.join(missing)} runs: run benchmarks/hosts.py "
                         "with --measure link,train --jsonl FILE.")

    def fit(where):
        fits = [r["fit"] for r in by[("link", where)]]
        return (statistics.median(f["bandwidth"] for f in fits),
                statistics.median(f["latency"] for f in fits))

    train = by[("train", "local")][0]
    mode = train.get("mode", "stash")
    if mode not in LOOPBACK_MODES:
        raise ValueError(f"Mode {mode!r} of the records is not one predict_loopback knows: "
                         f"{sorted(LOOPBACK_MODES)}")
    timed = [r["stage_times"] for r in by[("train", "local")] if "stage_times" in r]
    runtime = None
    if timed:
        stages = [[statistics.median(t[k][i] for t in timed) for i in (0, 1)]
                  for k in range(len(timed[0]))]
        profile = costmodel.calibrate_stages(
            dataclass_batch(profile, train["batch_size"]), train["cuts"], stages)
        runtime = loopback_runtime(train, fit("remote")[1])
    rows = []
    for window in ("short", "long"):
        steps = train[window]["steps"]
        predicted = predict_loopback(
            profile, fit("remote"), fit("local"), train["batch_size"], train["cuts"],
            num_batches=steps, concurrency=concurrency, recompute=LOOPBACK_MODES[mode],
            runtime=runtime,
        )
        measured = {where: statistics.median(r[window]["images_per_second"]
                                             for r in by[("train", where)])
                    for where in ("local", "remote")}
        for where, label in (("local", "local"), ("remote", "loopback")):
            p = predicted[label].images_per_second
            m = measured[where]
            rows.append([label, f"{window} ({steps})", f"{p:.1f}", f"{m:.1f}",
                         f"{100 * (p - m) / m:+.0f}%",
                         f"{p / predicted['local'].images_per_second:.2f}",
                         f"{m / measured['local']:.2f}"])
    return common.markdown_table(
        ["placement", "window", "predicted images/s", "measured images/s", "error",
         "predicted x local", "measured x local"], rows)


def dataclass_batch(profile, batch_size):
    """`profile` with its times scaled to `batch_size` (the stage times are at that batch)."""
    from tf_spectrain import costmodel

    if profile.batch_size == batch_size:
        return profile
    scale = batch_size / profile.batch_size
    layers = [costmodel.LayerProfile(
        layer.name, layer.forward_time * scale, layer.backward_time * scale,
        layer.output_bytes, layer.weight_bytes, layer.activation_bytes)
        for layer in profile.layers]
    return costmodel.ModelProfile(layers, batch_size, profile.name, profile.input_bytes)


# --- profiles -------------------------------------------------------------------------------


def load_profiles(path, models, batch_size, repeats, profile=None):
    """`{model: (ModelProfile, cpu_flops, device)}`, read from `path` or profiled.

    A model missing from the file (or profiled at another batch size) is profiled with
    `profile(model)` (default: `benchmarks/speedup.py`'s profiling child) and the file,
    when given, is rewritten with it.
    """
    from tf_spectrain import costmodel

    profile = profile or (lambda model: speedup.run_child(
        "profile", model=model, batch_size=batch_size, repeats=repeats))
    cached = {}
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
    changed = False
    for model in models:
        entry = cached.get(model)
        if entry is None or entry["profile"]["batch_size"] != batch_size:
            print(f"profiling {model} at batch {batch_size} ...", file=sys.stderr, flush=True)
            cached[model] = profile(model)
            changed = True
    if path and changed:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cached, f)
    return {
        m: (costmodel.ModelProfile.from_dict(cached[m]["profile"]), cached[m]["cpu_flops"],
            cached[m]["device"])
        for m in models
    }


def child_profile(args):
    """Profiles `args.model` with one intra-op thread (hosts.py's trainers); prints JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import tf_spectrain
    from tf_spectrain import costmodel

    model = tf_spectrain.models.get_model(args.model, (32, 32, 3), 10)
    profile = costmodel.profile_model(model, args.batch_size, repeats=args.repeats)
    print(json.dumps({"profile": profile.to_dict(), "cpu_flops": None, "device": "CPU"}))


# --- main ---------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hosts_predict", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--profiles", help="JSON file of the profiles: read if it exists, else "
                   "written after profiling")
    p.add_argument("--models", type=common.csv_of(str, MODELS), default=list(MODELS))
    p.add_argument("--batch-size", type=common.positive_int, default=32,
                   help="profiling batch size (speedup.py's)")
    p.add_argument("--repeats", type=common.positive_int, default=5,
                   help="timed calls per layer function when profiling")
    p.add_argument("--gpu-batch", type=common.positive_int, default=128,
                   help="global batch on the 8 GPUs")
    p.add_argument("--batches-per-epoch", type=common.positive_int, default=391,
                   help="mini-batches per epoch for the pipelines' fill and drain")
    p.add_argument("--gpu-tflops", type=float, default=None,
                   help=f"assumed GPU float32 TFLOP/s (default {speedup.DEFAULT_GPU_TFLOPS:g})")
    p.add_argument("--ethernet", type=common.csv_of(float), default=list(ETHERNET_GBITS),
                   help="inter-host link speeds in Gb/s")
    p.add_argument("--out", help="also write the tables to this markdown file")
    p.add_argument("--loopback", help="benchmarks/hosts.py --jsonl records to predict")
    p.add_argument("--loopback-profile", help="with --loopback: JSON file of the profile, "
                   "read if it exists, else written after profiling")
    p.add_argument("--concurrency", type=float, default=None,
                   help="with --loopback: devices computing at once (default 2)")
    p.add_argument("--child", choices=["profile"], help=argparse.SUPPRESS)
    p.add_argument("--model", default="vgg16", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def loopback_report(args):
    """The `--loopback` table: hosts.py's records against `predict_loopback`."""
    records = common.read_jsonl(args.loopback)
    trains = [r for r in records if r.get("kind") == "train"]
    if not trains:
        raise SystemExit(f"{args.loopback} holds no training record of benchmarks/hosts.py.")
    model, batch = trains[0]["model"], trains[0]["batch_size"]
    profiles = load_profiles(
        args.loopback_profile, [model], batch, args.repeats,
        profile=lambda m: common.run_json_child(
            "benchmarks.hosts_predict",
            ["--child", "profile", "--model", m, "--batch-size", str(batch),
             "--repeats", str(args.repeats)],
            f"profile {m}", dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")),
    )
    table = loopback_table(records, profiles[model][0], args.concurrency)
    return "\n".join([
        f"`python -m benchmarks.hosts_predict {' '.join(sys.argv[1:])}`", "",
        f"{model}, batch {batch}: benchmarks/hosts.py's measurements ({args.loopback}) "
        "against the cost model (`predict_loopback`: the links measure_link fitted, a "
        "profile with one intra-op thread).", "", table,
    ])


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child_profile(args)
    if args.loopback:
        text = loopback_report(args)
    else:
        profiles = load_profiles(args.profiles, args.models, args.batch_size, args.repeats)
        backward2 = {n: (speedup.with_backward_ratio(p, 2.0), f, d)
                     for n, (p, f, d) in profiles.items()}
        tflops = args.gpu_tflops or speedup.DEFAULT_GPU_TFLOPS
        text = "\n".join([
            f"`python -m benchmarks.hosts_predict {' '.join(sys.argv[1:])}`", "",
            f"Predicted images/s, global batch {args.gpu_batch}, pipeline epochs of "
            f"{args.batches_per_epoch} mini-batches; GPU at {tflops:g} TFLOP/s; "
            f"{HOSTS} hosts x {GPUS_PER_HOST} GPUs, PCIe 3.0 x16 within a host, Ethernet at "
            f"the line rate with {INTER_HOST_LATENCY * 1e6:g} us per transfer between hosts:",
            "", hosts_table(profiles, args), "", *notes(profiles, args), "",
            "The same with every backward set to twice its forward:", "",
            hosts_table(backward2, args), "",
            "hybrid 2x4 / pipeline 8 and dp 8 / pipeline 8 for other GPU speeds:", "",
            sensitivity_table(profiles, args),
        ])
    common.publish(text, args.out)


if __name__ == "__main__":
    main()
