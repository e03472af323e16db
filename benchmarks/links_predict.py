"""The cost model on benchmarks/links.py's grid: every measured cell beside its prediction.

    python -m benchmarks.links_predict                  # docs/data/issue40/links.jsonl
    python -m benchmarks.links_predict --rates 10mbit,100mbit,1gbit,10gbit --out table.md

Each link.py record (one configuration at one link rate) is predicted from three things,
each measured apart from the grid:

- the compute: VGG16 profiled layer by layer on this CPU with one intra-op thread at the
  records' batch size (`hosts_predict`'s profile, kept in `--profile`), every layer scaled
  by one factor so that one device's prediction equals the measured `alone` images/s (the
  median over the records' rounds);
- the link as TensorFlow's runtime meets it (`benchmarks/tensor_link.py`, `--link`): the
  rate a tensor of megabytes moves at between two emulated hosts, and what a graph call
  from the trainer over both workers costs with nothing to move (`call_s`); a rate it did
  not measure is its shaped rate at 97% (what TCP reaches), capped by the unshaped
  measurement; without `--link` records, the shaped rate and 13.6 Gbit/s unshaped
  (`EmulatedHosts.measure_rate`) with no call cost, as before;
- the runtime's windows: the records' mini-batches per graph call (`window`; older
  records: 8 for `steps_per_execution` "auto"), each window a call of `call_s`.

Data parallelism is `predict_data_parallel` over 2 devices on 2 hosts (a ring all-reduce
of every weight after the backward: `dp` sums gradients with a collective after each
backward), plus a call per window. The pipelines are `predict_pipeline` with links.py's
cut for an epoch of the records' mini-batches in their windows (fill and drain, each
window after the one before, forwards carried across a window's end recomputed), hand-offs
beside compute; paper SpecTrain recomputes stage 0's forward in its backward. The model
leaves out the trainer: it feeds stage 0 the inputs (0.8 MB per mini-batch of VGG16 at
batch 64) over stage 0's link, and runs on the same 2 cores.

Also the rates where the lines cross, from the same model: where data parallelism's
all-reduce takes as long as its compute, and where each pipeline overtakes it.
"""
import argparse
import math
import os
import statistics
import sys

from benchmarks import common, emulated_hosts, hosts_predict, links

UNSHAPED_BITS = 13.6e9  # measured between two emulated hosts (RESULTS.md section 18)
PIPELINES = {"stash": False, "spectrain": True}  # config -> whether stage 0 recomputes


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.links_predict",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=common.csv_of(str),
                   default=["docs/data/issue40/links.jsonl"],
                   help="links.py's records, comma-separated files")
    p.add_argument("--window", type=common.positive_int, default=1,
                   help="mini-batches per graph call of the predicted-only table and the "
                   "crossings (1: the default across hosts)")
    p.add_argument("--profile", default="docs/data/issue40/vgg16-profile.json",
                   help="JSON file of the profile: read if it exists, else written")
    p.add_argument("--link", default="docs/data/issue40/tensor-link.jsonl",
                   help="benchmarks/tensor_link.py's records (ignored if missing)")
    p.add_argument("--latency", type=float, default=100e-6,
                   help="seconds each transfer costs on top of its bytes")
    p.add_argument("--rates", type=common.csv_of(str),
                   default=["10mbit", "50mbit", "100mbit", "200mbit", "1gbit", "10gbit"],
                   help="rates of the predicted-only table")
    p.add_argument("--out", help="also write the tables to this file")
    args = p.parse_args(argv)
    for rate in args.rates:
        emulated_hosts.rate_bits(rate)
    return args


def bits(rate, link=None):
    """A link's bits per second as tensors meet it: `link`'s measurement at `rate`, else
    the shaped rate at 97% capped by `link`'s unshaped one; without `link`, the shaped
    rate or `UNSHAPED_BITS`."""
    shaped = emulated_hosts.rate_bits(rate)
    if not link:
        return shaped or UNSHAPED_BITS
    if rate in link:
        return link[rate]["rate_mb_per_s"] * 8e6
    ceiling = link["unshaped"]["rate_mb_per_s"] * 8e6 if "unshaped" in link else UNSHAPED_BITS
    return ceiling if shaped is None else min(0.97 * shaped, ceiling)


def call_seconds(rate, link=None):
    """What a graph call over both workers costs at `rate`: `link`'s measurement there, or
    its largest; 0 without `link`."""
    if not link:
        return 0.0
    return link[rate]["call_s"] if rate in link else max(r["call_s"] for r in link.values())


def hardware(rate, latency, link=None):
    """2 hosts of one device each (one core per worker), joined at `rate`."""
    from tf_spectrain import costmodel

    per_second = bits(rate, link) / 8
    return costmodel.Hardware(2, 1.0, bandwidth=per_second, latency=latency, num_hosts=2,
                              inter_host_bandwidth=per_second, inter_host_latency=latency,
                              name=str(rate))


def read_link(path):
    """`{rate: tensor_link record}` (the last record per rate), or {} if `path` is missing."""
    if not os.path.exists(path):
        return {}
    return {r["rate"]: r for r in common.read_jsonl(path)}


def window_of(record):
    """A links.py record's mini-batches per graph call."""
    if "window" in record:
        return record["window"]
    spe = record.get("steps_per_execution", "auto")
    return 8 if spe == "auto" else None if spe == "eager" else int(spe)


def calibrated(profile, alone, batch_size):
    """`profile` at `batch_size`, every layer scaled so that one device trains at `alone`
    images/s."""
    from tf_spectrain import costmodel

    profile = hosts_predict.dataclass_batch(profile, batch_size)
    one = costmodel.predict_single(profile, hardware("unshaped", 0.0), batch_size)
    scale = (batch_size / alone) / one.seconds_per_batch
    layers = [costmodel.LayerProfile(
        layer.name, layer.forward_time * scale, layer.backward_time * scale,
        layer.output_bytes, layer.weight_bytes, layer.activation_bytes)
        for layer in profile.layers]
    return costmodel.ModelProfile(layers, batch_size, profile.name, profile.input_bytes)


def predict(profile, config, rate, batch_size, steps, latency, model="vgg16", link=None,
            window=None):
    """Predicted images/s of links.py's `config` at `rate`, in windows of `window` (None:
    one call per epoch) over epochs of `steps` (None: the steady state, no windows)."""
    from tf_spectrain import costmodel

    hw = hardware(rate, latency, link)
    call = call_seconds(rate, link)
    if config == "alone":
        return costmodel.predict_single(profile, hw, batch_size).images_per_second
    if config == "dp":
        step = costmodel.predict_data_parallel(profile, hw, batch_size).seconds_per_batch
        return batch_size / (step + call / (window or 1))
    return costmodel.predict_pipeline(
        profile, hw, batch_size, links.CUTS[model], num_batches=steps, overlap=True,
        recompute=PIPELINES[config], window=window if steps else None,
        call_seconds=call).images_per_second


def crossings(profile, batch_size, steps, args, link):
    """Rates (bits/s) where dp's all-reduce equals its compute and where each pipeline
    overtakes dp (in windows of `args.window`), by bisection on a log scale between 1
    Mbit/s and 1 Tbit/s."""
    from tf_spectrain import costmodel

    latency = args.latency

    def at(gbits, config):
        return predict(profile, config, f"{gbits * 1e3:.6f}mbit", batch_size, steps, latency,
                       link=link, window=args.window)

    def bisect(ahead):  # ahead(rate in Gbit/s) is True at low rates, False at high ones
        low, high = 1e-3, 1e3
        if not ahead(low) or ahead(high):
            return None
        for _ in range(60):
            mid = math.sqrt(low * high)
            low, high = (mid, high) if ahead(mid) else (low, mid)
        return low * 1e9

    def allreduce_longer(gbits):
        estimate = costmodel.predict_data_parallel(
            profile, hardware(f"{gbits * 1e3:.6f}mbit", latency, link), batch_size)
        return estimate.communication_seconds > estimate.compute_seconds

    out = {"dp all-reduce = compute": bisect(allreduce_longer)}
    for config in PIPELINES:
        out[f"{config} = dp"] = bisect(lambda g, c=config: at(g, c) > at(g, "dp"))
    return out


def measured_table(records, profile, args, link):
    """Markdown: each measured cell (median over rounds) beside its prediction."""
    first = records[0]
    batch, steps = first["batch_size"], first["steps"]
    rows, errors = [], []
    cells = {}
    for r in records:
        cells.setdefault((r["rate"], window_of(r), r["config"]), []).append(r["images_per_s"])
    alone = [speed for (_, _, config), speeds in cells.items() if config == "alone"
             for speed in speeds]
    for (rate, window, config), cell in cells.items():
        if config == "alone":
            continue
        measured = statistics.median(cell)
        predicted = predict(profile, config, rate, batch, steps, args.latency, link=link,
                            window=window)
        error = (predicted - measured) / measured
        errors.append(abs(error))
        rows.append([rate, config, "-" if window is None else str(window), str(len(cell)),
                     common.spread(cell, ".1f"), f"{predicted:.1f}", f"{100 * error:+.0f}%"])
    rows.append(["none", "alone", "-", str(len(alone)), common.spread(alone, ".1f"),
                 f"{statistics.median(alone):.1f}", "calibration"])
    table = common.markdown_table(
        ["link", "configuration", "window", "rounds", "measured images/s", "predicted",
         "error"], rows)
    return table, errors


def predicted_table(profile, batch, steps, args, link):
    """Markdown: predicted images/s of every configuration at `args.rates`."""
    rows = []
    for rate in args.rates:
        dp = predict(profile, "dp", rate, batch, steps, args.latency, link=link,
                     window=args.window)
        cells = [predict(profile, c, rate, batch, steps, args.latency, link=link,
                         window=args.window) for c in PIPELINES]
        rows.append([rate, f"{dp:.1f}"] + [f"{c:.1f} ({c / dp:.2f}x)" for c in cells])
    return common.markdown_table(
        ["link", "dp"] + [f"{c} (x dp)" for c in PIPELINES], rows)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    records = [r for path in args.records for r in common.read_jsonl(path)
               if "host_bytes_per_batch" in r  # since each host's bytes are kept
               and r["model"] == "vgg16" and r["hosts"] == 2]
    link = read_link(args.link)
    alone = [r["images_per_s"] for r in records if r["config"] == "alone"]
    if not alone:
        raise SystemExit(f"{args.records} holds no VGG16 record of 2 hosts with an `alone` "
                         "run: run benchmarks/links.py first.")
    first = records[0]
    batch, steps = first["batch_size"], first["steps"]
    profiles = hosts_predict.load_profiles(
        args.profile, ["vgg16"], batch, 5,
        profile=lambda m: common.run_json_child(
            "benchmarks.hosts_predict",
            ["--child", "profile", "--model", m, "--batch-size", str(batch)],
            f"profile {m}", dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")))
    profile = calibrated(profiles["vgg16"][0], statistics.median(alone), batch)
    table, errors = measured_table(records, profile, args, link)
    crossing = crossings(profile, batch, steps, args, link)
    text = "\n".join([
        f"`python -m benchmarks.links_predict {' '.join(sys.argv[1:])}`", "",
        f"VGG16, batch {batch}, epochs of {steps} mini-batches, 2 hosts of one core; compute "
        f"calibrated to the measured one-core run ({statistics.median(alone):.1f} images/s); "
        f"{args.latency * 1e6:g} us per transfer; " + (
            "the links as " + args.link + " measured them: " + ", ".join(
                f"{rate} {r['rate_mb_per_s']:.0f} MB/s and {1e3 * r['call_s']:.1f} ms per call"
                for rate, r in link.items()) if link else "the links at their shaped rates")
        + ".", "", table, "",
        f"Largest error: {100 * max(errors):.0f}%; cells within 25%: "
        f"{sum(e <= 0.25 for e in errors)} of {len(errors)}.", "",
        "Where the lines cross (predicted): " + "; ".join(
            f"{name} at {'-' if rate is None else f'{rate / 1e6:,.0f} Mbit/s'}"
            for name, rate in crossing.items()) + ".", "",
        f"Predicted only, in windows of {args.window}:", "",
        predicted_table(profile, batch, steps, args, link),
    ])
    common.publish(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
