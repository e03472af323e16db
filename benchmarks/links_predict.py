"""The cost model on benchmarks/links.py's grid: every measured cell beside its prediction.

    python -m benchmarks.links_predict                  # docs/data/issue40/links.jsonl
    python -m benchmarks.links_predict --rates 10mbit,100mbit,1gbit,10gbit --out table.md

Each link.py record (one configuration at one link rate) is predicted from what
`benchmarks/links_calibration.py` measured apart from the grid:

- the compute: the model (`--model`) profiled layer by layer on this CPU with one
  intra-op thread at the records' batch size (kept in `--profile`), every layer scaled by
  one factor so that one device's prediction equals the measured `alone` images/s (the
  median over the records' rounds); for the pipelines, each stage's layers scaled again
  to its forward, backward and update as the pipeline itself timed them (a local
  pipeline of links.py's cut, pass by pass, kept in `--stage-times`);
- the link as TensorFlow's runtime meets it (`benchmarks/tensor_link.py`, `--link`): the
  rate a tensor of megabytes moves at between two emulated hosts, and what a graph call
  from the trainer over both workers costs with nothing to move (`call_s`); a rate it did
  not measure is its shaped rate at 97% (what TCP reaches), capped by the unshaped
  measurement; without `--link` records, the shaped rate and 13.6 Gbit/s unshaped
  (`EmulatedHosts.measure_rate`) with no call cost;
- the runtime's windows: the records' mini-batches per graph call (`window`; older
  records: 8 for `steps_per_execution` "auto"), each window a call of `call_s`.

Data parallelism is `predict_data_parallel` over 2 devices on 2 hosts (a ring all-reduce
of every weight after the backward: `dp` sums gradients with a collective after each
backward) at the rate a tensor moves each way while both hosts send at once, plus a call
per window. The pipelines are `predict_pipeline` with links.py's
cut for an epoch of the records' mini-batches in their windows (fill and drain, each
window after the one before, forwards carried across a window's end recomputed), hand-offs
beside compute; paper SpecTrain recomputes stage 0's forward in its backward. Stage 0's
link in bounds the pipelines too: it carries each mini-batch's inputs from the trainer
(0.8 MB for 64 images of 32 px; twice in windows of one) beside the gradients from stage
1. The model leaves out the trainer's CPU (a third process on the same 2 cores; 0.01-0.05
of a core measured).

Also the rates where the lines cross, from the same model: where data parallelism's
all-reduce takes as long as its compute, and where each pipeline overtakes it.
"""

import argparse
import math
import os
import statistics
import sys

from benchmarks import common, emulated_hosts, links
from benchmarks.links_calibration import (
    Calibrated,
    bits,
    calibrated,
    call_seconds,
    load_profile,
    read_link,
    stage_calibrated,
    stage_times,
)

PIPELINES = {"stash": False, "spectrain": True}  # config -> whether stage 0 recomputes


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.links_predict",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vgg16", choices=sorted(links.CUTS))
    p.add_argument("--records", type=common.csv_of(str),
                   default=["docs/data/issue40/links.jsonl"],
                   help="links.py's records, comma-separated files")
    p.add_argument("--window", type=common.positive_int, default=1,
                   help="mini-batches per graph call of the predicted-only table and the "
                   "crossings (1: the default across hosts)")
    p.add_argument("--profile", default="docs/data/issue40/{model}-profile.json",
                   help="JSON file of the profile: read if it holds the model, else written")
    p.add_argument("--link", default="docs/data/issue40/tensor-link.jsonl",
                   help="benchmarks/tensor_link.py's records (ignored if missing)")
    p.add_argument("--stage-times", default="docs/data/issue40/{model}-stage-times.json",
                   help="JSON file of each stage's measured pass times: read if it exists, "
                   "else measured (a local pipeline, pass by pass) and written; 'none' for "
                   "the profile's split")
    p.add_argument("--latency", type=float, default=100e-6,
                   help="seconds each transfer costs on top of its bytes")
    p.add_argument("--rates", type=common.csv_of(str),
                   default=["10mbit", "50mbit", "100mbit", "200mbit", "1gbit", "10gbit"],
                   help="rates of the predicted-only table")
    p.add_argument("--out", help="also write the tables to this file")
    p.add_argument("--plot", help="also draw the speed-up over dp against the link rate, "
                   "measured (per window) and predicted, to this PNG")
    args = p.parse_args(argv)
    for rate in args.rates:
        emulated_hosts.rate_bits(rate)
    return args


def hardware(rate, latency, link=None, both_ways=False):
    """2 hosts of one device each (one core per worker), joined at `rate` (as `bits`)."""
    from tf_spectrain import costmodel

    per_second = bits(rate, link, both_ways) / 8
    return costmodel.Hardware(2, 1.0, bandwidth=per_second, latency=latency, num_hosts=2,
                              inter_host_bandwidth=per_second, inter_host_latency=latency,
                              name=str(rate))


def window_of(record):
    """A links.py record's mini-batches per graph call."""
    if "window" in record:
        return record["window"]
    spe = record.get("steps_per_execution", "auto")
    return 8 if spe == "auto" else None if spe == "eager" else int(spe)




def predict(profile, config, rate, batch_size, steps, latency, model="vgg16", link=None,
            window=None):
    """Predicted images/s of links.py's `config` at `rate`, in windows of `window` (None:
    one call per epoch) over epochs of `steps` (None: the steady state, no windows);
    `profile` a `ModelProfile` or a `Calibrated` pair."""
    from tf_spectrain import costmodel

    if isinstance(profile, Calibrated):
        profile = profile.whole if config in ("alone", "dp") else profile.stages

    hw = hardware(rate, latency, link)
    call = call_seconds(rate, link)
    if config == "alone":
        return costmodel.predict_single(profile, hw, batch_size).images_per_second
    if config == "dp":  # its copies exchange their gradients both ways at once
        step = costmodel.predict_data_parallel(
            profile, hardware(rate, latency, link, both_ways=True), batch_size).seconds_per_batch
        return batch_size / (step + call / (window or 1))
    pipeline = costmodel.predict_pipeline(
        profile, hw, batch_size, links.CUTS[model], num_batches=steps, overlap=True,
        recompute=PIPELINES[config], window=window if steps else None,
        call_seconds=call).images_per_second
    # Stage 0's link in carries the inputs from the trainer (once per mini-batch, twice in
    # windows of one: again for the recomputed forward) and the gradients from stage 1.
    copies = 2 if window == 1 else 1
    inbound = batch_size * (copies * profile.input_bytes
                            + profile.stage_costs(links.CUTS[model])[0].output_bytes)
    return min(pipeline, batch_size / (inbound / (bits(rate, link) / 8)))


def crossings(profile, batch_size, steps, args, link):
    """Rates (bits/s) where dp's all-reduce equals its compute and where each pipeline
    overtakes dp (in windows of `args.window`), by bisection on a log scale between 1
    Mbit/s and 1 Tbit/s."""
    from tf_spectrain import costmodel

    latency = args.latency

    def at(gbits, config):
        return predict(profile, config, f"{gbits * 1e3:.6f}mbit", batch_size, steps, latency,
                       model=args.model, link=link, window=args.window)

    def bisect(ahead):  # ahead(rate in Gbit/s) is True at low rates, False at high ones
        low, high = 1e-3, 1e3
        if not ahead(low) or ahead(high):
            return None
        for _ in range(60):
            mid = math.sqrt(low * high)
            low, high = (mid, high) if ahead(mid) else (low, mid)
        return low * 1e9

    def allreduce_longer(gbits):
        whole = profile.whole if isinstance(profile, Calibrated) else profile
        estimate = costmodel.predict_data_parallel(
            whole, hardware(f"{gbits * 1e3:.6f}mbit", latency, link), batch_size)
        return estimate.communication_seconds > estimate.compute_seconds

    out = {"dp all-reduce = compute": bisect(allreduce_longer)}
    for config in PIPELINES:
        out[f"{config} = dp"] = bisect(lambda g, c=config: at(g, c) > at(g, "dp"))
    return out


def measured_table(records, profile, args, link):
    """Markdown rows (lists) of each measured cell of one grid (median over rounds) beside
    its prediction, and the errors."""
    first = records[0]
    batch, steps = first["batch_size"], first["steps"]
    rows, errors = [], []
    cells = {}
    for r in records:
        cells.setdefault((r["rate"], window_of(r), r["config"]), []).append(r["images_per_s"])
    for (rate, window, config), cell in cells.items():
        if config == "alone":
            continue
        measured = statistics.median(cell)
        predicted = predict(profile, config, rate, batch, steps, args.latency,
                            model=args.model, link=link, window=window)
        error = (predicted - measured) / measured
        errors.append(abs(error))
        rows.append([rate, config, "-" if window is None else str(window), str(len(cell)),
                     common.spread(cell, ".1f"), f"{predicted:.1f}", f"{100 * error:+.0f}%"])
    return rows, errors


def predicted_table(profile, batch, steps, args, link):
    """Markdown: predicted images/s of every configuration at `args.rates`."""
    rows = []
    for rate in args.rates:
        dp = predict(profile, "dp", rate, batch, steps, args.latency, model=args.model, link=link,
                     window=args.window)
        cells = [predict(profile, c, rate, batch, steps, args.latency, model=args.model, link=link,
                         window=args.window) for c in PIPELINES]
        rows.append([rate, f"{dp:.1f}"] + [f"{c:.1f} ({c / dp:.2f}x)" for c in cells])
    return common.markdown_table(
        ["link", "dp"] + [f"{c} (x dp)" for c in PIPELINES], rows)


def plot(records, profile, args, link, path):
    """Speed-up over dp against link rate: each measured cell (the median over rounds of
    each round's ratio to dp in the same grid and round, their range as a bar) per
    pipeline and window, and the model's lines at `args.window` from 10 Mbit/s to 10
    Gbit/s."""
    plt = common.pyplot()
    batch, steps = records[0]["batch_size"], records[0]["steps"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colours = {"stash": "tab:blue", "spectrain": "tab:orange"}
    names = {"stash": "stash", "spectrain": "paper SpecTrain"}
    rates = [10 ** (7 + k / 8) for k in range(25)]  # 10 Mbit/s .. 10 Gbit/s
    for config in PIPELINES:
        predicted = [predict(profile, config, f"{r / 1e6:.6f}mbit", batch, steps, args.latency,
                             model=args.model, link=link, window=args.window)
                     / predict(profile, "dp", f"{r / 1e6:.6f}mbit", batch, steps, args.latency,
                               model=args.model, link=link, window=args.window) for r in rates]
        ax.plot([r / 1e6 for r in rates], predicted, "-", color=colours[config], alpha=0.6,
                label=f"{names[config]}, predicted (windows of {args.window})")
        windows = sorted({window_of(r) for r in records if r["config"] == config},
                         key=lambda w: -1 if w is None else w)
        for window, marker in zip(windows, "os^D"):
            xs, ys, lows, highs = [], [], [], []
            for rate in dict.fromkeys(r["rate"] for r in records):
                rounds = {(r.get("grid"), r.get("round")): r["images_per_s"] for r in records
                          if r["rate"] == rate and r["config"] == "dp"}
                ratios = [r["images_per_s"] / rounds[r.get("grid"), r.get("round")]
                          for r in records if r["rate"] == rate and r["config"] == config
                          and window_of(r) == window
                          and (r.get("grid"), r.get("round")) in rounds]
                if ratios:
                    xs.append(bits(rate, link) / 1e6)
                    ys.append(statistics.median(ratios))
                    lows.append(ys[-1] - min(ratios))
                    highs.append(max(ratios) - ys[-1])
            if xs:
                ax.errorbar(xs, ys, yerr=[lows, highs], fmt=marker, color=colours[config],
                            capsize=3, label=f"{names[config]}, measured (windows of {window})")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("link rate between hosts (Mbit/s, as TensorFlow moves tensors)")
    ax.set_ylabel("images/s over data parallelism's")
    ax.set_title(f"{args.model} on 2 emulated hosts, one core each", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def grids(args):
    """`[(path, records)]`: each `--records` file's records of `args.model` on 2 hosts with
    each host's bytes (links.py's since they are kept) and a one-core (`alone`) run."""
    out = []
    for path in args.records:
        records = [r for r in common.read_jsonl(path) if "host_bytes_per_batch" in r
                   and r["model"] == args.model and r["hosts"] == 2]
        if any(r["config"] == "alone" for r in records):
            out.append((path, records))
    if not out:
        raise SystemExit(f"{args.records} hold no {args.model} record of 2 hosts with an "
                         "`alone` run: run benchmarks/links.py first.")
    return out


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    link = read_link(args.link)
    measured = grids(args)
    batch = measured[0][1][0]["batch_size"]
    base = load_profile(args.profile.format(model=args.model), args.model, batch)
    stages = None if args.stage_times == "none" else stage_times(
        args.stage_times.format(model=args.model), args.model, batch)
    rows, lines, first = [], [], None
    for path, records in measured:
        alone = statistics.median(r["images_per_s"] for r in records if r["config"] == "alone")
        whole = calibrated(base, alone, batch)
        staged = whole if stages is None else stage_calibrated(
            whole, stages["stages"], links.CUTS[args.model],
            scale=stages["alone_images_per_s"] / alone)
        profile = Calibrated(whole, staged)
        first = first or (records, profile)
        grid_rows, errors = measured_table(records, profile, args, link)
        name = os.path.basename(path)
        rows += [[name] + row for row in grid_rows]
        lines.append(f"- {name}: one core alone {alone:.1f} images/s (the calibration); "
                     f"cells within 25%: {sum(e <= 0.25 for e in errors)} of {len(errors)}, "
                     f"largest error {100 * max(errors):.0f}%.")
    records, profile = first
    steps = records[0]["steps"]
    crossing = crossings(profile, batch, steps, args, link)
    text = "\n".join([
        f"`python -m benchmarks.links_predict {' '.join(sys.argv[1:])}`", "",
        f"{args.model}, batch {batch}, epochs of {steps} mini-batches, 2 hosts of one core; "
        "each grid's compute calibrated to its own one-core run"
        + ("" if stages is None else
           f", the pipelines' stages to their passes measured in {args.stage_times} at "
           f"{stages['alone_images_per_s']:.1f} images/s alone (" + ", ".join(
               f"stage {k}: forward {1e3 * t['forward']:.0f} ms, backward "
               f"{1e3 * t['backward']:.0f} ms, update {1e3 * t['update']:.0f} ms"
               for k, t in enumerate(stages["stages"])) + "), scaled to each grid's")
        + f"; {args.latency * 1e6:g} us per transfer; " + (
            "the links as " + args.link + " measured them: " + ", ".join(
                f"{rate} {r['rate_mb_per_s']:.0f} MB/s and {1e3 * r['call_s']:.1f} ms per call"
                for rate, r in link.items()) if link else "the links at their shaped rates")
        + ".", "",
        common.markdown_table(["records", "link", "configuration", "window", "rounds",
                               "measured images/s", "predicted", "error"], rows), "",
        *lines, "",
        f"Where the lines cross (predicted for {os.path.basename(measured[0][0])}): " + "; ".join(
            f"{name} at {'-' if rate is None else f'{rate / 1e6:,.0f} Mbit/s'}"
            for name, rate in crossing.items()) + ".", "",
        f"Predicted only, in windows of {args.window}:", "",
        predicted_table(profile, batch, steps, args, link),
    ])
    common.publish(text, args.out)
    if args.plot:
        plot([dict(r, grid=path) for path, rs in measured for r in rs], profile, args, link,
             args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
