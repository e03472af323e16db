"""Memory per stage, throughput and bubble of each schedule and `recompute`, side by side.

    python -m benchmarks.memory                 # VGG16, N = 4, M = 8, batch 32
    python -m benchmarks.memory --quick         # small_cnn, a smoke run
    python -m benchmarks.memory --stages 4,8 --configs stash,nesterov,2bw --no-bubble
    python -m benchmarks.memory --out docs/MEMORY.md

Every configuration runs once, in its own process (`benchmarks.throughput`'s child: a
short warm-up fit, then one timed epoch on synthetic 32x32x3 images), one after the other:
- sync with GPipe and with 1F1B-flush, and each asynchronous mode (vanilla, stash,
  SpecTrain paper and consistent, nesterov, 2bw with one update per N mini-batches), all
  with M micro-batches, each with `recompute="auto"` and `"always"`: every stage's peak of
  micro-batches in flight (measured by the stage, next to what the schedule should keep:
  GPipe M, 1F1B-flush `min(N - k, M)`, the asynchronous schedule `(N - k) * M`), its
  estimated peak bytes (`runtime.memory`: weights, slots, in-flight inputs, tapes and
  weight copies), the process' peak resident memory, images/s with CPU time / wall time,
  and the most weight copies each stage held for backwards beside its current weights
  (`peak_weight_copies`), next to the copies the planner prices (`expected_weight_copies`:
  `stash_bytes / param_bytes` of `costmodel.StageTerms`). A copy is counted where the
  stage keeps one explicitly, from the stage's next update on (until then it shares the
  current weights' memory): with `recompute="always"`. With `"auto"` a stash-like stage's
  tapes hold the old weights instead, which the estimate does not count (0 copies);
- `--stages` takes several depths (`4,8`): everything runs at each, one table per depth;
- the bubble (1 - mean stage utilisation) of GPipe and 1F1B-flush at M = 4 and 8,
  against the lock-step value `(N - 1) / (M + N - 1)`; with `--two-cores` also at N = 2
  with one intra-op thread per stage, where the 2 stages have a core each (at N = 4 the 4
  logical devices share 2 cores, so a stage's passes stretch while others run and its
  utilisation is not the schedule's).

On GPUs the child also reads each device's allocator peak; on CPU devices TensorFlow tracks
none, so the per-stage figures are the stages' own estimates.
"""

import argparse
import sys
import time

from benchmarks import common, throughput

MODES = {
    "sync-gpipe": ("sync", "paper", "gpipe"),
    "sync-1f1b": ("sync", "paper", "1f1b"),
    "vanilla": ("vanilla", "paper", "gpipe"),
    "stash": ("stash", "paper", "gpipe"),
    "spectrain-paper": ("spectrain", "paper", "gpipe"),
    "spectrain-consistent": ("spectrain", "consistent", "gpipe"),
    "nesterov": ("nesterov", "paper", "gpipe"),
    "2bw": ("2bw", "paper", "gpipe"),  # accumulate=None: one update per N mini-batches
}


def expected_in_flight(name, num_stages, micro_batches):
    """What each stage's schedule should keep in flight, in micro-batches (closed forms)."""
    n, m = num_stages, micro_batches
    if name == "sync-gpipe":
        return [m] * n
    if name == "sync-1f1b":
        return [min(n - k, m) for k in range(n)]
    return [(n - k) * m for k in range(n)]  # async: N - k mini-batches of M each


def expected_weight_copies(name, num_stages):
    """The weight copies each stage keeps beside its current weights, as the planner prices
    them (`costmodel.StageTerms.stashed_versions`, closed forms; spelled out here, as
    importing tf_spectrain would start TensorFlow in this parent process)."""
    n = num_stages
    mode, target, _ = MODES[name]
    if mode in ("stash", "nesterov"):
        return [n - k - 1 for k in range(n)]  # one version per mini-batch in flight
    if mode == "2bw":
        return [min(n - k - 1, 1) for k in range(n)]  # one update per A >= N mini-batches
    if mode == "spectrain" and target == "consistent":
        return [n - k if k < n - 1 else 0 for k in range(n)]
    if mode == "spectrain":  # one predicted version where the paper's gaps are not both 0
        return [int(k // 2 + n - 1 - k > 0 or k // 2 > 0) for k in range(n)]
    return [0] * n  # sync, vanilla


def theoretical_bubble(num_stages, micro_batches):
    """The idle share of a flushed mini-batch in lock-step slots: (N - 1) / (M + N - 1)."""
    return (num_stages - 1) / (micro_batches + num_stages - 1)


def run(args, name, stages, micro_batches, recompute, intra_op=0):
    """One configuration in a fresh process; its JSON record."""
    mode, target, order = MODES[name]
    flags = [
        "--child", "--model", args.model, "--mode", mode, "--target", target,
        "--stages", str(stages), "--batch-size", str(args.batch_size),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--skip", str(args.skip),
        *throughput.child_flags(micro_batches, order, recompute),
    ]
    if intra_op:
        flags += ["--intra-op", str(intra_op)]
    out = common.run_json_child("benchmarks.throughput", flags, name)
    print(f"{name} N={stages} M={micro_batches} recompute={recompute}: images/s "
          f"{out['steady']:.1f}, stages {[m['micro_batches'] for m in out['stage_memory']]}",
          file=sys.stderr, flush=True)
    return out


def _mib(n):
    return n / 2**20


def memory_table(results, args, num_stages=None):
    """Markdown: one row per mode and recompute, at `num_stages` (default `args.stages`)."""
    n = args.stages if num_stages is None else num_stages
    lines = [
        "| configuration | recompute | in flight per stage (measured / schedule) | "
        "estimated peak per stage (MiB) | of which in flight (MiB) | process peak (MiB) | "
        "images/s | CPU/wall | weight copies per stage (measured; priced) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, recompute), out in results.items():
        stages = out["stage_memory"]
        measured = [m["micro_batches"] for m in stages]
        expected = expected_in_flight(name, n, args.micro_batches)
        counts = " / ".join(str(c) for c in measured)
        same = "as scheduled" if measured == expected else "schedule: " + " / ".join(
            str(c) for c in expected)
        peaks = " / ".join(f"{_mib(m['peak']):.1f}" for m in stages)
        flight = " / ".join(f"{_mib(m['in_flight']):.1f}" for m in stages)
        copies = [m.get("weight_copies") for m in stages]
        copies = "-" if None in copies else " / ".join(str(c) for c in copies)
        priced = " / ".join(str(c) for c in expected_weight_copies(name, n))
        lines.append(
            f"| {name} | {recompute} | {counts} ({same}) | {peaks} | {flight} | "
            f"{out['rss_mb']:.0f} | {out['steady']:.1f} | {out['cores']:.2f} | "
            f"{copies}; {priced} |"
        )
    return "\n".join(lines)


def bubble_table(bubbles):
    """Markdown: measured bubble against the lock-step value."""
    lines = [
        "| N | M | schedule | intra-op threads | measured bubble | lock-step value | "
        "utilisation per stage | images/s | CPU/wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (stages, m, name, intra), out in bubbles.items():
        util = " / ".join(f"{u:.2f}" for u in out["utilisation"])
        lines.append(
            f"| {stages} | {m} | {name[5:]} | {intra or 'default'} | {out['bubble']:.2f} | "
            f"{theoretical_bubble(stages, m):.2f} | {util} | {out['steady']:.1f} | "
            f"{out['cores']:.2f} |"
        )
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default="vgg16")
    p.add_argument("--stages", type=common.csv_of(int), default=[4],
                   help="pipeline depth(s) N, e.g. 4 or 4,8 (one table per depth; at N = 8 "
                        "the timed epoch needs --steps well above 8 for stage 0 to fill)")
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=6, help="mini-batches in the timed epoch")
    p.add_argument("--warmup", type=int, default=2, help="mini-batches of the warm-up fit")
    p.add_argument("--skip", type=int, default=2, help="first mini-batches left out (fill)")
    p.add_argument("--configs", type=common.csv_of(str, list(MODES)),
                   default=list(MODES))
    p.add_argument("--no-bubble", action="store_true", help="skip the bubble runs")
    p.add_argument("--two-cores", action="store_true",
                   help="also measure the bubble at N = 2 with one intra-op thread per stage")
    p.add_argument("--quick", action="store_true", help="small_cnn, batch 32, 6 steps")
    p.add_argument("--out", default=None, help="also write the tables to this file")
    args = p.parse_args()
    if args.quick:
        args.model, args.batch_size, args.steps, args.warmup, args.skip = "small_cnn", 32, 6, 2, 2
        args.micro_batches = 4
    if args.batch_size % args.micro_batches:
        p.error(f"--micro-batches must divide --batch-size; got --batch-size "
                f"{args.batch_size} and --micro-batches {args.micro_batches}")
    if args.skip + 2 > args.steps:
        p.error(f"--steps must exceed --skip + 1; got --steps {args.steps} --skip {args.skip}")
    if not args.stages or min(args.stages) < 1:
        p.error(f"--stages must be integers >= 1 such as 4 or 4,8; got {args.stages}")
    start = time.perf_counter()
    tables = []
    bubbles = {}
    for n in args.stages:
        results = {}
        for name in args.configs:
            for recompute in ("auto", "always"):
                results[(name, recompute)] = run(args, name, n, args.micro_batches, recompute)
        tables.append((n, memory_table(results, args, n)))
        if args.no_bubble:
            continue
        depths = ((n, 0), (2, 1)) if args.two_cores and n == args.stages[0] else ((n, 0),)
        for stages, intra in depths:
            for m in (4, 8):
                for name in ("sync-gpipe", "sync-1f1b"):
                    known = results.get((name, "auto"))
                    if intra == 0 and stages == n and m == args.micro_batches and known:
                        bubbles[(stages, m, name, intra)] = known
                    elif args.batch_size % m == 0:
                        bubbles[(stages, m, name, intra)] = run(args, name, stages, m, "auto",
                                                                intra)
    command = " ".join(["python", "-m", "benchmarks.memory"] + sys.argv[1:])
    depths = ", ".join(str(n) for n in args.stages)
    text = (
        f"`{command}`: {args.model}, N = {depths}, M = {args.micro_batches}, batch "
        f"{args.batch_size}, {args.steps} timed mini-batches, one run each, "
        f"{(time.perf_counter() - start) / 60:.1f} min.\n"
    )
    for n, table in tables:
        text += f"\nN = {n}:\n\n{table}\n" if len(tables) > 1 else f"\n{table}\n"
    if bubbles:
        text += f"\n{bubble_table(bubbles)}\n"
    common.publish(text, args.out)


if __name__ == "__main__":
    main()
