"""How fast TensorFlow's runtime moves a tensor between two emulated hosts, per link rate.

    python -m benchmarks.tensor_link                           # unshaped, 1gbit, 100mbit
    python -m benchmarks.tensor_link --rates 100mbit --sizes 0,4 --calls 5

`benchmarks/links.py`'s cost model (`benchmarks/links_predict.py`) needs the link as the
pipeline meets it: TCP's rate over the shaped veth is not what TensorFlow's gRPC reaches
for a tensor of megabytes (serialised and copied by one core per process), and a graph
call from the trainer to its workers costs round trips of its own. Here, as in links.py,
2 hosts each run one worker (one intra-op thread, pinned to a core) and the trainer runs
in a third host; the trainer calls a graph function that reads a float32 variable of S MB
on worker 0 and sums it on worker 1, so S MB cross from host 0 to host 1 per call. Per
rate, the median call time of each size, and the least-squares line through them:

    seconds per call = call_s + megabytes / rate_mb_per_s

`call_s` (S = 0: a scalar) is what a graph call over both workers costs with nothing to
move; `rate_mb_per_s` is the rate a tensor moves at. Then both hosts send S MB to each
other at once, as data parallelism's exchange of gradients does: `both_ways_mb_per_s` is
the rate each direction moves at then (each process serialises what it sends and
deserialises what it receives on its one core). Records go to `--out-jsonl`.
"""

import argparse
import json
import statistics
import sys
import time

from benchmarks import common, emulated_hosts, links

RATES = ["unshaped", "1gbit", "100mbit"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.tensor_link",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=common.csv_of(str), default=RATES)
    p.add_argument("--sizes", type=common.csv_of(_megabytes), default=[0.0, 1.0, 4.0, 16.0],
                   help="megabytes per transfer (0: a scalar)")
    p.add_argument("--calls", type=common.positive_int, default=7,
                   help="timed calls per size (after one untimed)")
    p.add_argument("--out-jsonl", default="docs/data/issue40/tensor-link.jsonl")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cluster", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for rate in args.rates:
        emulated_hosts.rate_bits(rate)
    if len(args.sizes) < 2:
        p.error(f"--sizes must list at least two sizes to fit a line. Received: {args.sizes}")
    return args


def _megabytes(text):
    """argparse item type: a finite number of megabytes >= 0."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


def child(args):
    """In the trainer's host: times the transfers; prints one JSON line."""
    import tensorflow as tf

    import tf_spectrain

    tf.config.threading.set_intra_op_parallelism_threads(1)
    devices = tf_spectrain.connect_cluster(args.cluster, devices_per_worker=1, timeout=60)
    seconds, both = {}, {}
    for size in args.sizes:
        elements = max(1, int(size * 1e6 / 4))
        sources = []
        for device in devices[:2]:
            with tf.device(device):
                sources.append(tf.Variable(tf.ones((elements,))))

        @tf.function
        def move(sources=sources):
            with tf.device(devices[0]):
                x = sources[0].read_value() + 0.0  # computed on host 0
            with tf.device(devices[1]):
                return tf.reduce_sum(x)  # needs x on host 1

        @tf.function
        def swap(sources=sources):  # both ways at once, as data parallelism's exchange
            xs = []
            for device, source in zip(devices, sources):
                with tf.device(device):
                    xs.append(source.read_value() + 0.0)
            sums = []
            for device, x in zip(reversed(devices[:2]), xs):
                with tf.device(device):
                    sums.append(tf.reduce_sum(x))
            return sums

        seconds[str(size)] = _timed(move, args.calls)
        both[str(size)] = _timed(swap, args.calls)
    print(json.dumps({"seconds": seconds, "both_ways": both}))


def _timed(function, calls):
    """Seconds of each of `calls` calls of `function`, after one that builds its graph."""
    function()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        outputs = function()
        for output in outputs if isinstance(outputs, list) else [outputs]:
            output.numpy()
        times.append(time.perf_counter() - started)
    return times


def fit(sizes, medians):
    """`(call_s, rate_mb_per_s)`: least squares `seconds = call_s + MB / rate`."""
    mean_x, mean_y = statistics.fmean(sizes), statistics.fmean(medians)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, medians))
             / sum((x - mean_x) ** 2 for x in sizes))
    return mean_y - slope * mean_x, (1.0 / slope if slope > 0 else float("inf"))


def measure(args, rate):
    """One rate's record."""
    with emulated_hosts.EmulatedHosts(3, rate) as hosts:
        cluster, _ = links.start_workers(hosts, 2)
        cmd, env = common.child_command(
            "benchmarks.tensor_link", ["--child", "--cluster", cluster, "--sizes",
                                       ",".join(map(str, args.sizes)), "--calls",
                                       str(args.calls)], links.child_env())
        out = hosts.run(2, cmd, timeout=1800, env=env, cwd=common.ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"tensor_link at {rate} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    seconds, both = result["seconds"], result["both_ways"]
    medians = [statistics.median(seconds[str(s)]) for s in args.sizes]
    both_medians = [statistics.median(both[str(s)]) for s in args.sizes]
    call_s, rate_mb = fit(args.sizes, medians)
    return {"rate": rate, "sizes_mb": args.sizes, "median_s": medians, "seconds": seconds,
            "call_s": call_s, "rate_mb_per_s": rate_mb, "both_ways_median_s": both_medians,
            "both_ways_s": both, "both_ways_mb_per_s": fit(args.sizes, both_medians)[1]}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        child(args)
        return 0
    emulated_hosts.check_available()
    rows = []
    for rate in args.rates:
        record = measure(args, rate)
        common.append_jsonl(args.out_jsonl, record)
        shaped = emulated_hosts.rate_bits(rate)
        rows.append([rate] + [f"{1e3 * m:.1f}" for m in record["median_s"]] + [
            f"{1e3 * record['call_s']:.1f}", f"{record['rate_mb_per_s']:.1f}",
            f"{record['both_ways_mb_per_s']:.1f}",
            "-" if shaped is None else f"{shaped / 8e6:.1f}"])
        print(f"{rate}: call {1e3 * record['call_s']:.1f} ms, "
              f"{record['rate_mb_per_s']:.1f} MB/s one way, "
              f"{record['both_ways_mb_per_s']:.1f} MB/s each way at once", flush=True)
    common.publish(common.markdown_table(
        ["link"] + [f"{s:g} MB (ms)" for s in args.sizes] + [
            "call_s (ms)", "MB/s", "MB/s each way, both at once", "shaped MB/s"], rows),
        args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
