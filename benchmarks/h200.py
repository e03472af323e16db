"""Where a pipeline pays on today's GPUs: 4 x H200, and hosts of 4 x H200, predicted.

    python -m benchmarks.h200                                  # the tables of RESULTS.md 14
    python -m benchmarks.h200 --floor docs/data/issue17/floor.jsonl --out h200.md
    python -m benchmarks.h200 --hosts 2,4,8 --ethernet 10,25,100   # RESULTS.md 18

No GPU here: the compute comes from `../shared/gpu-h200/` (the zoo's `vgg16` at 32 px,
batch 128, and `resnet50` at 224 px, batch 64, measured on one H200 with Keras on JAX):
each layer's share of the sum of the layers' times, scaled to the measured whole forward
and whole forward+backward (its README: the per-layer times carry a compiled call's fixed
cost each, so only their shares mean anything). Tensor and weight sizes come from the same
Keras models (`costmodel.profile_model` at batch 1, for its sizes only). The runtime's fixed
host cost per mini-batch comes from `benchmarks/floor.py`'s records (`--floor`): a line in
the stages and the layers, `costmodel.RuntimeCosts`, measured on this project's 2-core CPU
machine; it bounds every pipeline's mini-batch from below (`predict_pipeline(runtime=)`).

Rows: one GPU (the measured Keras `fit` on the H200, in `fit-keras-jax.json`), data
parallelism over the 4 or 8 GPUs (ring all-reduce every step, without and with overlap of
the backward), the asynchronous pipeline in every mode (stash, vanilla and consistent
SpecTrain keep their forward; paper SpecTrain recomputes it on every stage but the last),
sync with 4 micro-batches (GPipe; its bubble), and on H hosts the H x 4 hybrid (one
pipeline of 4 stages per host, `hybrid H x 4`); a pipeline over every GPU only up to 8 GPUs.
Cuts are `costmodel.best_cuts` for each machine. Links: NVLink 4 at 450 GB/s per direction
and 10 us; PCIe Gen5 x16 at 50 GB/s and 10 us; Ethernet at its line rate and 50 us.
"""

import argparse
import json
import os
import statistics
import sys

from benchmarks import common

SHARED = os.path.join(common.ROOT, "..", "shared", "gpu-h200")
CASES = {  # model: (input shape, classes, batch, files by policy)
    "vgg16": ((32, 32, 3), 10, 128),
    "resnet50": ((224, 224, 3), 1000, 64),
}
POLICIES = ("float32", "mixed_bfloat16")
LINKS = {"NVLink": (450e9, 10e-6), "PCIe Gen5": (50e9, 10e-6)}
ETHERNET = (25, 100)  # Gb/s between the hosts (default)
ETHERNET_LATENCY = 50e-6
MODES = {  # label: predict_pipeline's recompute
    "stash": False, "vanilla": True, "spectrain (consistent)": False,
    "spectrain (paper)": True,
}
SYNC_MICRO_BATCHES = 4
MAX_PIPELINE_STAGES = 8  # more GPUs than this: only data parallelism and the hybrids


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--floor", default=os.path.join("docs", "data", "issue17",
                                                   "floor.jsonl"),
                   help="benchmarks/floor.py --json records (windows and pass by pass)")
    p.add_argument("--shared", default=SHARED, help="the folder of the H200 measurements")
    p.add_argument("--hosts", type=common.csv_of(int), default=[2],
                   help="host counts of the multi-host machines (4 H200 per host)")
    p.add_argument("--ethernet", type=common.csv_of(float), default=list(ETHERNET),
                   help="Gb/s between hosts, one machine per rate and host count")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def h200_profile(model_name, policy, shared):
    """A `ModelProfile` with the H200's times and the Keras model's sizes."""
    import keras

    import tf_spectrain
    from tf_spectrain import costmodel

    shape, classes, batch = CASES[model_name]
    suffix = "b128" if model_name == "vgg16" else "b64"
    with open(os.path.join(shared, f"{model_name}-{policy}-{suffix}.json"),
              encoding="utf-8") as f:
        measured = json.load(f)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = tf_spectrain.models.get_model(model_name, shape, classes)
    finally:
        keras.config.set_dtype_policy(previous)
    sizes = costmodel.profile_model(model, batch_size=1, repeats=1, warmup=0)
    times = {name: (f, b) for name, f, b in measured["layers"]}
    forward_share = measured["whole_forward_s"] / measured["sum_forward_s"]
    backward_share = ((measured["whole_step_s"] - measured["whole_forward_s"])
                      / measured["sum_backward_s"])
    layers = []
    for layer in sizes.layers:
        f, b = times.get(layer.name, (0.0, 0.0))
        layers.append(costmodel.LayerProfile(
            layer.name, f * forward_share, b * backward_share, layer.output_bytes,
            layer.weight_bytes, layer.activation_bytes))
    missing = [layer.name for layer in sizes.layers if layer.name not in times]
    profile = costmodel.ModelProfile(layers, batch, name=f"{model_name} {policy}",
                                     input_bytes=sizes.input_bytes)
    return profile, measured, missing, len(sizes.layers)


def runtime_costs(path):
    """`{runtime: RuntimeCosts}` from floor.py's records.

    Each record is one timed fit of a pipeline (label "<mode>, N=<n>, spe=<k>") of a floor
    model of L hidden layers: per runtime (pass by pass: spe "eager", `run_eagerly=True`,
    or in records older than it, which have no "eager", spe 1; windows: spe "auto" and
    K > 1), the medians over rounds and asynchronous modes of every (N, L) point are fitted
    as `a + b N + c L` (least squares): `RuntimeCosts(a, b, layer_seconds=c)`.
    """
    from tf_spectrain.costmodel import RuntimeCosts

    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    pipelines = [r for r in records if not r["trainer"].startswith(("keras", "sync"))]
    values = {r["trainer"].rsplit("spe=", 1)[1] for r in pipelines}
    by_pass = "eager" if "eager" in values else "1"
    out = {}
    for runtime, wanted in (("pass by pass", lambda v: v == by_pass),
                            ("windows", lambda v: v == "auto" or v.isdigit() and int(v) > 1)):
        points = {}
        for r in pipelines:
            label = r["trainer"]
            if not wanted(label.rsplit("spe=", 1)[1]):
                continue
            n = int(label.split("N=")[1].split(",")[0])
            points.setdefault((n, r.get("layers", 8)), []).append(r["ms_per_batch"] / 1e3)
        if not points:
            continue
        a, b, c = fit_plane([(n, l_, statistics.median(v)) for (n, l_), v in points.items()])
        out[runtime] = RuntimeCosts(batch_seconds=a, stage_seconds=b, layer_seconds=c,
                                    name=runtime)
    return out


def fit_plane(points):
    """Least squares `s = a + b n + c l` through `(n, l, s)` points; with one value of `l`,
    `c = 0`. Negative coefficients are clipped to 0."""
    import numpy as np

    points = np.asarray(points, dtype=float)
    if len(set(points[:, 1])) == 1:
        design = np.stack([np.ones(len(points)), points[:, 0]], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, points[:, 2], rcond=None)
        return max(a, 0.0), max(b, 0.0), 0.0
    design = np.stack([np.ones(len(points)), points[:, 0], points[:, 1]], axis=1)
    (a, b, c), *_ = np.linalg.lstsq(design, points[:, 2], rcond=None)
    return max(a, 0.0), max(b, 0.0), max(c, 0.0)


def machines(hosts=(2,), ethernet=ETHERNET):
    """`{name: Hardware}`: 4 x H200 on each link, and H hosts x 4 H200 (NVLink within a
    host) on each Ethernet rate (Gb/s), for each H of `hosts`."""
    from tf_spectrain import costmodel

    out = {}
    for link, (bandwidth, latency) in LINKS.items():
        out[f"4 x H200, {link}"] = costmodel.Hardware(
            4, 1.0, bandwidth=bandwidth, latency=latency, name=f"4 x H200, {link}")
    nvlink = LINKS["NVLink"]
    for count in hosts:
        for gbits in ethernet:
            out[f"{count} hosts x 4 H200 (NVLink), {gbits:g} Gb/s"] = costmodel.Hardware(
                4 * count, 1.0, bandwidth=nvlink[0], latency=nvlink[1], num_hosts=count,
                inter_host_bandwidth=gbits * 1e9 / 8, inter_host_latency=ETHERNET_LATENCY,
                name=f"{count} x 4 H200, {gbits:g} Gb/s")
    return out


def predictions(profile, hardware, runtimes):
    """`{row label: images/s}` of every configuration on `hardware`."""
    from tf_spectrain import costmodel

    batch = profile.batch_size
    rows = {
        "data parallel": costmodel.predict_data_parallel(profile, hardware, batch),
        "data parallel, all-reduce overlapped": costmodel.predict_data_parallel(
            profile, hardware, batch, overlap=True),
    }
    # A pipeline over every GPU only up to 8 (2 hosts); beyond, one pipeline per host.
    cuts = (costmodel.best_cuts(profile, hardware, batch)
            if hardware.num_gpus <= MAX_PIPELINE_STAGES else None)
    if cuts is not None:
        rows["pipeline, stash, without the runtime's cost"] = costmodel.predict_pipeline(
            profile, hardware, batch, cuts)
    hosts = hardware.num_hosts
    for runtime, costs in runtimes.items():
        if cuts is not None:
            for mode, recompute in MODES.items():
                rows[f"pipeline, {mode}, {runtime}"] = costmodel.predict_pipeline(
                    profile, hardware, batch, cuts, recompute=recompute, runtime=costs)
            rows[f"pipeline, sync M={SYNC_MICRO_BATCHES}, {runtime}"] = costmodel.predict_sync(
                profile, hardware, batch, cuts, micro_batches=SYNC_MICRO_BATCHES,
                runtime=costs)
        if hosts > 1:  # one pipeline of the host's 4 GPUs per host
            hybrid_cuts = costmodel.best_cuts(profile, hardware, batch, num_stages=4,
                                              replicas=hosts)
            rows[f"hybrid H x 4, stash, {runtime}"] = costmodel.predict_hybrid(
                profile, hardware, batch, hybrid_cuts, replicas=hosts, runtime=costs)
    return {label: e.images_per_second for label, e in rows.items()}, cuts


def keras_fit(shared, model_name, policy):
    """The measured one-GPU Keras fit (images/s, best of its steps_per_execution values)."""
    with open(os.path.join(shared, "fit-keras-jax.json"), encoding="utf-8") as f:
        fits = [r for r in json.load(f) if r["model"] == model_name and r["policy"] == policy]
    return max(r["images_per_s"] for r in fits)


def report(args):
    lines = []
    for model_name in CASES:
        for policy in POLICIES:
            profile, measured, missing, layers = h200_profile(model_name, policy, args.shared)
            runtimes = runtime_costs(args.floor)
            single = keras_fit(args.shared, model_name, policy)
            lines += ["", f"#### {model_name}, {policy}, batch {profile.batch_size}", "",
                      f"One H200, Keras fit (measured): {single:,.0f} images/s. Runtime floor "
                      f"({layers} layers): " + "; ".join(
                          f"{name} {c.floor(4, layers=layers) * 1e3:.2f} ms at 4 stages, "
                          f"{c.floor(8, layers=layers) * 1e3:.2f} ms at 8"
                          for name, c in runtimes.items())
                      + (f". Layers without an H200 time (0): {missing}" if missing else "")]
            table_rows = {}
            chosen = machines(args.hosts, args.ethernet)
            for name, hardware in chosen.items():
                rows, cuts = predictions(profile, hardware, runtimes)
                for label, ips in rows.items():
                    table_rows.setdefault(label, {})[name] = ips
            header = ["configuration"] + list(chosen)
            body = [[label] + [f"{cells[m]:,.0f} ({cells[m] / single:.2f}x)"
                               if m in cells else "-" for m in chosen]
                    for label, cells in table_rows.items()]
            lines.append("")
            lines.append(common.markdown_table(header, body))
    text = ("Predicted images/s (and x one H200's measured Keras fit) on each machine. "
            + "\n".join(lines))
    common.publish(text, args.out)


def main(argv=None):
    report(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
