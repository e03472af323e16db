"""How even are the stages of planned (`cuts="auto"`) and static cuts? Issue 12's balance table.

    python -m benchmarks.balance                          # 4 models, N = 2, 4, 8, 3 rounds
    python -m benchmarks.balance --models resnet56 --stages 4 --rounds 1
    python -m benchmarks.balance --out docs/balance.md --jsonl balance.jsonl
    python -m benchmarks.balance --quick                  # small_cnn, N = 2, 1 round: a smoke run

Models (32x32x3 inputs, 10 classes, batch `--batch-size` 32): the zoo's `vgg16` and
`resnet56`, and `keras.applications`' `ResNet50` and `MobileNetV2` (`weights=None`, logits
out), named `resnet50` and `mobilenetv2` here. For each model and number of stages N
(`--stages`), three cut lists:

- `auto`: `tf_spectrain.costmodel.auto_partition` on N logical CPU devices (what
  `PipelineModel(cuts="auto")` runs: profile, plan, calibrate), planned for `--mode`
  (default `sync`: no recomputed forward, so it balances exactly what is measured here);
- `params`, `layers`: `tf_spectrain.partition.default_cuts(model, N, by=...)`.

Each stage's forward plus backward is then timed alone (`costmodel.measure_stages`, each
stage on its own device, the median of `--repeats` calls after `--warmup`), for the three
cut lists interleaved over `--rounds` rounds: round r measures them in the order
auto, params, layers rotated by r, so that drift of the machine hits them alike. Per cut
list the table gives each stage's milliseconds (median over rounds), the slowest stage,
max/mean stage time per round and its median, and that median over the bound.

The granularity bound is the best max/mean any cut list can reach given the layers' sizes:
with per-layer forward plus backward times t_i (`costmodel.profile_model` at the batch
size, `--profile-repeats`, in the same process) it is the least possible slowest stage sum
(`tf_spectrain.partition.plan_cuts(t, N)`, which minimises it exactly, over every cut
position) divided by the mean `sum(t) / N`. A cut list's "predicted" max/mean is the same
ratio for its own cuts from these t_i, so it is never below the bound. Measured stages are
not sums of their layers' times (per-call overhead, fusion), so a measured max/mean can
fall below the bound; "auto vs bound" is measured auto max/mean over the bound.

Each (model, N) runs in a fresh process with N logical CPU devices
(`common.prepare_tensorflow`) and `--intra-op-threads` threads per op (default 1: one
core per op, so that the stages, timed one after another, do not fight over this 2-core
machine's cores with each other or with other load; 0 keeps TensorFlow's default). Every
timing reports process CPU time / wall time beside it (`common.CpuClock`), and each
process the 1-minute load average at its start and end.
"""

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import common

MODELS = ("vgg16", "resnet56", "resnet50", "mobilenetv2")
QUICK_MODEL = "small_cnn"
CUT_LISTS = ("auto", "params", "layers")
# tf_spectrain.schedule.modes.PIPELINE_MODES, spelled out: importing tf_spectrain would start
# TensorFlow in the parent (tests/test_balance_script.py checks that the two agree).
PIPELINE_MODES = ("sync", "vanilla", "stash", "spectrain", "nesterov", "2bw")
INPUT_SHAPE = (32, 32, 3)
NUM_CLASSES = 10


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.balance", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--models", type=common.csv_of(str, MODELS + (QUICK_MODEL,)),
                   default=list(MODELS))
    p.add_argument("--stages", type=common.csv_of(int), default=[2, 4, 8],
                   help="numbers of stages N, e.g. 2,4,8")
    p.add_argument("--batch-size", type=common.positive_int, default=32)
    p.add_argument("--mode", default="sync", choices=PIPELINE_MODES,
                   help="the pipeline mode auto_partition plans for (default: sync)")
    p.add_argument("--rounds", type=common.positive_int, default=3,
                   help="interleaved rounds of measuring the three cut lists")
    p.add_argument("--repeats", type=common.positive_int, default=5,
                   help="timed calls per stage in measure_stages (the median counts)")
    p.add_argument("--warmup", type=common.non_negative_int, default=2,
                   help="untimed calls per stage first")
    p.add_argument("--profile-repeats", type=common.positive_int, default=5,
                   help="timed calls per layer of the profile behind the bound")
    p.add_argument("--intra-op-threads", type=common.non_negative_int, default=1,
                   help="threads per op in every child (0: TensorFlow's default)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_MODEL}, N=2, 1 round, 2 repeats: a smoke run")
    p.add_argument("--out", help="also write the tables to this markdown file")
    p.add_argument("--jsonl", help="also append every (model, N) record to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a model, in a fresh process
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.stages, args.rounds = [QUICK_MODEL], [2], 1
        args.repeats, args.warmup, args.profile_repeats = 2, 1, 2
    if any(n < 2 for n in args.stages):
        p.error(f"--stages must all be >= 2 (a pipeline); got {args.stages}")
    if args.child and len(args.stages) != 1:
        p.error("a child measures one number of stages")
    return args


def round_order(r):
    """The cut lists in the order round `r` (0-based) measures them: rotated by `r`."""
    k = r % len(CUT_LISTS)
    return list(CUT_LISTS[k:] + CUT_LISTS[:k])


# --- the child: one model and N in a fresh process ----------------------------------------


def build_model(name):
    """The benchmark model `name` (see the module docstring), outputting logits."""
    if name in ("resnet50", "mobilenetv2"):
        import keras

        builder = {
            "resnet50": keras.applications.ResNet50,
            "mobilenetv2": keras.applications.MobileNetV2,
        }[name]
        return builder(
            weights=None, input_shape=INPUT_SHAPE, classes=NUM_CLASSES,
            classifier_activation=None,
        )
    import tf_spectrain

    return tf_spectrain.models.get_model(name, INPUT_SHAPE, NUM_CLASSES)


def stage_sums(costs, positions):
    """Sums of `costs` over the stages that cutting after `positions` makes."""
    bounds = [-1] + list(positions) + [len(costs) - 1]
    return [sum(costs[a + 1 : b + 1]) for a, b in zip(bounds[:-1], bounds[1:])]


def max_over_mean(times):
    """The slowest of `times` over their mean (1.0: perfectly even)."""
    mean = sum(times) / len(times)
    return max(times) / mean if mean > 0 else 1.0


def child(args):
    """Plans, cuts and measures one (model, N) in this fresh process; prints one JSON line."""
    import warnings

    with common.CpuClock() as whole:
        loads = [os.getloadavg()[0]]
        n = args.stages[0]
        devices = common.prepare_tensorflow(n, args.intra_op_threads)
        import keras

        from tf_spectrain import costmodel, partition

        keras.utils.set_random_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MobileNetV2 on 32x32: "no weights for it"
            model = build_model(args.child)
        b = args.batch_size
        with common.CpuClock() as clock:
            profile = costmodel.profile_model(model, b, repeats=args.profile_repeats)
        profiling = {"wall": clock.wall, "cores": clock.cores}
        costs = [layer.forward_time + layer.backward_time for layer in profile.layers]
        names = list(profile.names)
        best = partition.plan_cuts(costs, n)
        with common.CpuClock() as clock:
            plan = costmodel.auto_partition(model, devices, batch_size=b, mode=args.mode)
        planning = {"wall": clock.wall, "cores": clock.cores}
        cuts = {
            "auto": plan.cuts,
            "params": partition.default_cuts(model, n, by="params"),
            "layers": partition.default_cuts(model, n, by="layers"),
        }
        rounds = []
        for r in range(args.rounds):
            measured = {}
            for name in round_order(r):
                with common.CpuClock() as clock:
                    times = costmodel.measure_stages(
                        model, cuts[name], b, repeats=args.repeats, warmup=args.warmup,
                        device=devices,
                    )
                measured[name] = {
                    "forward": [f for f, _ in times],
                    "forward_backward": [fb for _, fb in times],
                    "wall": clock.wall,
                    "cores": clock.cores,
                }
            rounds.append({"order": round_order(r), "measured": measured})
        loads.append(os.getloadavg()[0])
    predicted = {
        name: max_over_mean(stage_sums(costs, [names.index(c) for c in cut]))
        for name, cut in cuts.items()
    }
    print(json.dumps({
        "model": args.child,
        "stages": n,
        "batch_size": b,
        "mode": args.mode,
        "devices": list(devices),
        "intra_op_threads": args.intra_op_threads,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "layer_names": names,
        "layer_seconds": costs,
        "bound": max(stage_sums(costs, best)) / (sum(costs) / n),
        "bound_cuts": [names[p] for p in best],
        "profiling": profiling,
        "cuts": cuts,
        "predicted": predicted,
        "plan": plan.to_dict(),
        "planning": planning,
        "rounds": rounds,
        "process": {"wall": whole.wall, "cores": whole.cores, "load_average": loads},
    }))


def measure(model, n, args):
    flags = [
        "--child", model, "--stages", str(n), "--batch-size", str(args.batch_size),
        "--mode", args.mode, "--rounds", str(args.rounds), "--repeats", str(args.repeats),
        "--warmup", str(args.warmup), "--profile-repeats", str(args.profile_repeats),
        "--intra-op-threads", str(args.intra_op_threads),
    ]
    return common.run_json_child("benchmarks.balance", flags, f"{model} at N={n}")


# --- tables -------------------------------------------------------------------------------


def summary(record):
    """Per cut list of one record: medians over rounds, and the comparisons.

    Returns:
        A dict: `cut_lists` maps each cut list to `stage_ms` (each stage's median forward
        plus backward, ms), `slowest_ms` (median over rounds of the slowest stage),
        `balance` (max/mean per round), `median` (their median), `over_bound`
        (median / bound) and `cores` (median CPU/wall of its measurements); besides it,
        `bound`, `auto_vs_bound` and `auto_not_worse` (auto's median max/mean <= params').
    """
    bound = record["bound"]
    out = {}
    for name in CUT_LISTS:
        runs = [r["measured"][name] for r in record["rounds"]]
        per_round = [run["forward_backward"] for run in runs]
        balance = [max_over_mean(t) for t in per_round]
        median = statistics.median(balance)
        out[name] = {
            "stage_ms": [1e3 * statistics.median(s) for s in zip(*per_round)],
            "slowest_ms": 1e3 * statistics.median(max(t) for t in per_round),
            "balance": balance,
            "median": median,
            "over_bound": median / bound,
            "cores": statistics.median(run["cores"] for run in runs),
        }
    return {
        "cut_lists": out,
        "bound": bound,
        "auto_vs_bound": out["auto"]["over_bound"],
        "auto_not_worse": out["auto"]["median"] <= out["params"]["median"],
    }


def _own_measure(plan):
    """Max/mean of the stage times `auto_partition` measured for its plan ("-": none)."""
    times = [stage["measured_seconds"] for stage in plan["stages"]]
    return "-" if None in times else f"{max_over_mean(times):.2f}"


def balance_table(records):
    """Markdown: one row per (model, N): the bound and each cut list's median max/mean."""
    rows = []
    for rec in records:
        s = summary(rec)
        cells = [common.spread(s["cut_lists"][c]["balance"], ".2f") for c in CUT_LISTS]
        plan = rec["plan"]
        rows.append([
            rec["model"], rec["stages"], f"{s['bound']:.3f}", *cells,
            f"{s['auto_vs_bound']:.2f}", "yes" if s["auto_not_worse"] else "no",
            f"{plan['balance']:.2f}", _own_measure(plan), f"{plan['profile_seconds']:.1f}",
        ])
    header = [
        "model", "N", "bound max/mean", "auto max/mean", "params max/mean",
        "layers max/mean", "auto vs bound", "auto <= params", "plan's predicted max/mean",
        "plan's own measured max/mean", "plan's profile_seconds",
    ]
    return common.markdown_table(header, rows)


def stages_table(records):
    """Markdown: one row per (model, N, cut list): its cuts and per-stage times."""
    rows = []
    for rec in records:
        s = summary(rec)
        for name in CUT_LISTS:
            c = s["cut_lists"][name]
            rows.append([
                rec["model"], rec["stages"], name, ", ".join(rec["cuts"][name]),
                " / ".join(f"{ms:.1f}" for ms in c["stage_ms"]), f"{c['slowest_ms']:.1f}",
                " ".join(f"{v:.2f}" for v in c["balance"]), f"{c['median']:.2f}",
                f"{c['over_bound']:.2f}", f"{rec['predicted'][name]:.2f}", f"{c['cores']:.2f}",
            ])
    header = [
        "model", "N", "cut list", "cuts", "per-stage F+B ms (median)", "slowest ms",
        "max/mean per round", "median", "/ bound", "predicted max/mean", "CPU/wall",
    ]
    return common.markdown_table(header, rows)


def process_table(records):
    """Markdown: per (model, N) process: how long each part took, on how many cores."""
    rows = []
    for rec in records:
        measures = [m for r in rec["rounds"] for m in r["measured"].values()]
        load = rec["process"]["load_average"]
        rows.append([
            rec["model"], rec["stages"], len(rec["layer_names"]),
            f"{rec['profiling']['wall']:.1f} ({rec['profiling']['cores']:.2f})",
            f"{rec['planning']['wall']:.1f} ({rec['planning']['cores']:.2f})",
            f"{sum(m['wall'] for m in measures):.1f} "
            f"({statistics.median(m['cores'] for m in measures):.2f})",
            f"{rec['process']['wall']:.1f} ({rec['process']['cores']:.2f})",
            f"{load[0]:.1f} / {load[-1]:.1f}",
        ])
    header = [
        "model", "N", "layers", "profile for the bound s (CPU/wall)",
        "auto_partition s (CPU/wall)", "measuring s (median CPU/wall)",
        "process s (CPU/wall)", "load average start / end",
    ]
    return common.markdown_table(header, rows)


def report(records, args, minutes):
    """The whole markdown report."""
    not_worse = [summary(rec)["auto_not_worse"] for rec in records]
    mode = records[0]["mode"] if records else args.mode
    lines = [
        "`" + " ".join(["python -m benchmarks.balance", *sys.argv[1:]]) + "`",
        "",
        f"Batch {args.batch_size}; auto planned for mode '{mode}'; each stage's forward + "
        f"backward timed alone (median of {args.repeats} calls after {args.warmup}), the "
        f"three cut lists interleaved over {args.rounds} round(s), {args.intra_op_threads} "
        f"intra-op thread(s) (0: TensorFlow's default); {minutes:.1f} min. max/mean cells: "
        "median (min-max) over rounds. The bound: the least max/mean any cuts reach from "
        "the per-layer profile (`plan_cuts`); auto vs bound = auto's median over it. The "
        "plan's predicted max/mean is from its own (calibrated) profile, its own measured "
        "one from the stage timings `auto_partition` kept it by; its profile_seconds "
        "include that calibration.",
        "",
        balance_table(records),
        "",
        f"auto no worse than params (median max/mean): {sum(not_worse)} of {len(not_worse)}.",
        "",
        "Per-stage times (predicted max/mean: the cuts' stage sums of the same profile as "
        "the bound, never below it):",
        "",
        stages_table(records),
        "",
        "Processes (one per model and N):",
        "",
        process_table(records),
    ]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child(args)
    start = time.perf_counter()
    records = []
    for model in args.models:
        for n in args.stages:
            record = measure(model, n, args)
            records.append(record)
            if args.jsonl:
                common.append_jsonl(args.jsonl, record)
            s = summary(record)
            cells = ", ".join(f"{c} {s['cut_lists'][c]['median']:.2f}" for c in CUT_LISTS)
            print(f"[{time.perf_counter() - start:6.0f} s] {model} N={n}: bound "
                  f"{s['bound']:.3f}, max/mean {cells}; auto cuts {record['cuts']['auto']}; "
                  f"process {record['process']['wall']:.0f} s", file=sys.stderr, flush=True)
    text = report(records, args, (time.perf_counter() - start) / 60)
    common.publish(text, args.out)
    return records


if __name__ == "__main__":
    main()
