"""Stages on two hosts over loopback gRPC against two local devices: hand-offs and training.

    python -m benchmarks.hosts                       # VGG16, batch 64, 3 rounds
    python -m benchmarks.hosts --rounds 5 --out docs/hosts.md
    python -m benchmarks.hosts --measure link        # only the hand-offs
    python -m benchmarks.hosts --quick               # small_cnn, 1 round: a smoke run

Issue 14's evidence, on one machine. "loopback" is two `python -m tf_spectrain.app.worker`
processes on 127.0.0.1 (one CPU device each) and a trainer process connected to them
(`tf_spectrain.connect_cluster`): a tensor goes from task 0 to task 1 over TensorFlow's
gRPC runtime. "local" is one process with the CPU split into 2 logical devices.

- `link`: the hand-off between two stages. A tensor as large as what crosses a cut of the
  model at `--batch-size` (`tf_spectrain.partition.describe_stages`: the cut after each
  block's pool, the training cut, and a 4-byte tensor for latency) lives on the first
  device and a `tf.function` reads it on the second (`tf.reduce_sum(x[:1])` placed there,
  the copy `tf_spectrain.costmodel.measure_link` times; a stage's function receives its
  input from the previous stage's device the same way). Every timed call is paired with the
  same call on a tensor already on the second device: "call" is the median time of a call
  with the copy, "hop" the median over pairs of the difference (what the copy adds), and
  GB/s the tensor's bytes / hop. `measure_link`'s own fit (bandwidth and latency through a
  4-byte and the largest tensor) is given too.
- `train`: the model as a 2-stage `stash` pipeline cut at `benchmarks.overlap.CUTS`
  (`block3_relu2` for VGG16), one stage per device, `--steps-per-execution` mini-batches
  per graph call (default "auto": windows of 8, one remote call each; "eager":
  `run_eagerly=True`, a call per pass).
  As in `benchmarks/overlap.py`: a warm-up fit of `--warmup` mini-batches (with windows,
  also fits as long as the timed ones, tracing every window shape), then a short and a long
  fit, each timed from the call of `fit` to its return, on the same synthetic batches. A
  local run then times each stage whole on its device (`costmodel.measure_stages`), for
  `benchmarks/hosts_predict.py --loopback`.

Threads: every trainer process sets one intra-op thread (`tf.config.threading`), as
`benchmarks/overlap.py`'s pipelines; every worker runs with `TF_NUM_INTRAOP_THREADS=1`
(its server's `ConfigProto` leaves the intra-op count at 0, and TensorFlow's CPU devices
then take the variable). Inter-op threads are TensorFlow's defaults (at least 2 on the
local devices, by `tf_spectrain.setup_devices`).

Processes: every measurement is a fresh trainer process (`--child`). A loopback
measurement gets two fresh workers on free ports, started before it and stopped by their
pid after it (SIGTERM, then SIGKILL), also when it fails; so no worker idles during a local
measurement. Local and loopback alternate within every round, in swapped order every other
round. CPU/wall is the CPU time of the trainer and the workers together (theirs read from
`/proc/<pid>/stat`, in 10 ms ticks) over the wall time, beside the trainer's alone.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import common

MEASUREMENTS = ("link", "train")
PLACES = ("local", "remote")
LABELS = {"local": "local", "remote": "loopback"}
MODE = "stash"
CUTS = {"vgg16": ["block3_relu2"], "small_cnn": ["pool1"]}  # benchmarks/overlap.py's fixed cuts
# The hand-off sizes: what crosses the cut after each block's pool, and the training cut.
LINK_CUTS = {
    "vgg16": ["block1_pool", "block2_pool", "block3_relu2", "block3_pool", "block4_pool",
              "block5_pool"],
    "small_cnn": ["pool1", "pool2"],
}
TINY = "tiny"  # a 4-byte tensor: the latency of a hand-off
WORKERS = 2
START_TIMEOUT = 120.0  # seconds for a worker to say it serves (TensorFlow imports)
STOP_TIMEOUT = 10.0  # seconds a worker gets to exit after SIGTERM before SIGKILL


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hosts", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default="vgg16", choices=sorted(CUTS))
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    p.add_argument("--measure", type=common.csv_of(str, MEASUREMENTS),
                   default=list(MEASUREMENTS), help="link, train or link,train")
    p.add_argument("--repeats", type=common.positive_int, default=30,
                   help="link: timed pairs of calls per tensor")
    p.add_argument("--warmup", type=common.positive_int, default=3,
                   help="train: untimed mini-batches first; link: untimed pairs")
    p.add_argument("--short", type=common.positive_int, default=8, help="mini-batches")
    p.add_argument("--long", type=common.positive_int, default=32, help="mini-batches")
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--steps-per-execution", default="auto",
                   help="train: mini-batches per graph call ('auto' or an int), or 'eager' "
                   "(run_eagerly=True: a call per pass)")
    p.add_argument("--quick", action="store_true",
                   help="small_cnn, batch 32, short windows, 5 pairs, 1 round")
    p.add_argument("--out", help="also write the tables to this file")
    p.add_argument("--jsonl", help="also append every run to this JSON-lines file")
    # A measurement in a fresh process (the parent passes these).
    p.add_argument("--child", choices=MEASUREMENTS, help=argparse.SUPPRESS)
    p.add_argument("--where", choices=PLACES, help=argparse.SUPPRESS)
    p.add_argument("--cluster", help=argparse.SUPPRESS)
    p.add_argument("--worker-pids", type=common.csv_of(int), default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.batch_size, args.short, args.long, args.rounds, args.repeats = (
            "small_cnn", 32, 4, 8, 1, 5)
    if args.child and args.where is None:
        p.error("--child needs --where")
    if args.where == "remote" and not args.cluster:
        p.error("--where remote needs --cluster")
    return args


# --- CPU time of several processes -------------------------------------------------------


def process_cpu_seconds(pid):
    """User plus system CPU seconds of process `pid` so far, from `/proc/<pid>/stat`."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ProcessesClock(common.CpuClock):
    """A `common.CpuClock` of this process that also counts the CPU time of `pids`.

    After `stop()`: `wall`, `cpu` and `cores` (this process', from `CpuClock`), `cpu_all`
    and `cores_all` (this process and `pids` together).
    """

    def __init__(self, pids=()):
        self.pids = list(pids)

    def start(self):
        self._others = sum(process_cpu_seconds(p) for p in self.pids)
        return super().start()

    def stop(self):
        others = sum(process_cpu_seconds(p) for p in self.pids) - self._others
        super().stop()
        self.cpu_all = self.cpu + others
        self.cores_all = self.cpu_all / self.wall if self.wall > 0 else 0.0
        return self


# --- children: one measurement in a fresh process -----------------------------------------


def _devices(args):
    """Sets one intra-op thread and returns the 2 stage devices of `args.where`."""
    started = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import warnings

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import tf_spectrain

    if args.where == "remote":
        devices = tf_spectrain.connect_cluster(args.cluster, devices_per_worker=1, timeout=30)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            devices = tf_spectrain.setup_devices(WORKERS)
    return devices, time.perf_counter() - started


def activation_tensors(model, batch_size, cuts):
    """What crosses each cut at `batch_size`: `[(cut, shape, dtype name)]`, model order.

    The shapes come from `tf_spectrain.partition.describe_stages` (the first stage's
    outputs: with skip connections, several tensors, flattened into one of their total
    size). A 4-byte float32 tensor named `TINY` comes first.
    """
    import numpy as np

    from tf_spectrain import partition

    out = [(TINY, [1], "float32")]
    order = [layer.name for layer in model.layers]
    for cut in sorted(cuts, key=order.index):
        first = partition.describe_stages(model, [cut])[0]
        shapes = [(batch_size,) + tuple(s[1:]) for s in first.output_shapes]
        dtype = str(model.get_layer(cut).output.dtype)
        shape = list(shapes[0]) if len(shapes) == 1 else [int(sum(np.prod(s) for s in shapes))]
        out.append((cut, shape, dtype))
    return out


def link_child(args):
    """Times hand-offs of every tensor from device 0 to device 1; prints one JSON line."""
    started = time.perf_counter()
    devices, connect_seconds = _devices(args)
    import numpy as np
    import tensorflow as tf

    import tf_spectrain
    from tf_spectrain import costmodel

    source, target = devices
    model = tf_spectrain.models.get_model(args.model, (32, 32, 3), 10)
    tensors = activation_tensors(model, args.batch_size, LINK_CUTS[args.model])
    del model

    @tf.function
    def read(x):
        with tf.device(target):
            return tf.reduce_sum(x[:1])  # on the target: the whole tensor moves first

    def seconds(x):
        start = time.perf_counter()
        read(x).numpy()
        return time.perf_counter() - start

    rows = []
    for name, shape, dtype in tensors:
        with tf.device(source):
            there = tf.ones(shape, dtype) + 0
        with tf.device(target):
            here = tf.ones(shape, dtype) + 0
        for _ in range(args.warmup):
            seconds(there), seconds(here)
        calls, bases = [], []
        with ProcessesClock(args.worker_pids) as clock:
            for _ in range(args.repeats):
                calls.append(seconds(there))
                bases.append(seconds(here))
        rows.append({
            "name": name, "shape": shape, "dtype": dtype,
            "bytes": int(np.prod(shape)) * tf.as_dtype(dtype).size,
            "call": statistics.median(calls), "base": statistics.median(bases),
            "hop": statistics.median(c - b for c, b in zip(calls, bases)),
            "cores": clock.cores, "cores_all": clock.cores_all,
            "placed": [there.device, here.device],
        })
    largest = max(r["bytes"] for r in rows)
    bandwidth, latency = costmodel.measure_link(source, target, small_bytes=4,
                                                large_bytes=largest, repeats=args.repeats)
    print(json.dumps({
        "kind": "link", "where": args.where, "model": args.model,
        "batch_size": args.batch_size, "devices": devices, "repeats": args.repeats,
        "tensors": rows, "fit": {"bandwidth": bandwidth, "latency": latency},
        "connect_seconds": connect_seconds, "seconds": time.perf_counter() - started,
    }), flush=True)


def train_child(args):
    """Trains the 2-stage pipeline on the devices of `args.where`; prints one JSON line."""
    started = time.perf_counter()
    devices, connect_seconds = _devices(args)
    import keras

    import tf_spectrain
    from tf_spectrain.app import trainers

    keras.utils.set_random_seed(0)
    trainer = trainers.build_trainer(
        lambda: tf_spectrain.models.get_model(args.model, (32, 32, 3), 10),
        MODE, devices, learning_rate=0.01, momentum=0.9, cuts=CUTS[args.model],
        batch_size=args.batch_size,
        steps_per_execution=("auto" if args.steps_per_execution in ("auto", "eager")
                             else int(args.steps_per_execution)),
        run_eagerly=args.steps_per_execution == "eager",
    )
    b = args.batch_size
    batches = common.window_batches(b, (args.warmup, args.short, args.long))

    trainer.fit(batches(args.warmup), epochs=1, verbose=0)
    if args.steps_per_execution != "eager":
        for steps in (args.short, args.long):  # every window shape of the timed fits
            trainer.fit(batches(steps), epochs=1, verbose=0)
    out = {"kind": "train", "where": args.where, "model": args.model, "batch_size": b,
           "mode": MODE, "cuts": trainer.cuts, "devices": devices,
           "steps_per_execution": args.steps_per_execution, "run_eagerly_known": True,
           "variables_on": [stage.variables[0].value.device for stage in trainer.stages],
           "connect_seconds": connect_seconds}
    for window in ("short", "long"):
        steps = getattr(args, window)
        data = batches(steps)
        with ProcessesClock(args.worker_pids) as clock:
            trainer.fit(data, epochs=1, verbose=0)
        out[window] = {
            "steps": steps, "images_per_second": steps * b / clock.wall,
            "cores": clock.cores, "cores_all": clock.cores_all, "wall": clock.wall,
            "started_after": clock.started - started,
        }
    if args.where == "local":
        # Each stage's forward and forward + backward, timed whole on its own device (one
        # at a time): what benchmarks/hosts_predict.py calibrates the profile with.
        from tf_spectrain import costmodel

        out["stage_times"] = costmodel.measure_stages(trainer.model, trainer.cuts, b,
                                                      device=devices)
    print(json.dumps(out), flush=True)


# --- workers ------------------------------------------------------------------------------


def free_port():
    """A loopback port nothing listens on now (the kernel's pick)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent():
    # Linux: the worker gets SIGTERM if this benchmark dies without stopping it (SIGKILL).
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Workers:
    """Starts `count` fresh workers on loopback ports; stops them by pid on exit.

    `with Workers(2) as workers:` waits until each worker prints that it serves (or
    raises `RuntimeError` with its output); `workers.cluster` is the `--cluster` flag,
    `workers.pids` their process ids, `workers.start_seconds` how long they took.
    """

    def __init__(self, count=WORKERS, timeout=START_TIMEOUT):
        self.count, self.timeout = count, timeout
        self.procs, self.pids, self.cluster = [], [], None

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _start(self):
        start = time.perf_counter()
        self._dir = tempfile.TemporaryDirectory(prefix="hosts-workers-")
        self.cluster = ",".join(f"127.0.0.1:{free_port()}" for _ in range(self.count))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_NUM_INTRAOP_THREADS="1")
        for name in ("TF_CONFIG", "GRPC_FAIL_FAST"):
            env.pop(name, None)
        for task in range(self.count):
            cmd, child_env = common.child_command(
                "tf_spectrain.app.worker",
                ["--cluster", self.cluster, "--task", str(task), "--cpu-devices", "1",
                 "--bind-all"], env)
            out = os.path.join(self._dir.name, f"worker{task}.out")
            with open(out, "w") as stdout, open(out + ".err", "w") as stderr:
                proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=child_env,
                                        preexec_fn=_die_with_parent)
            proc.out_path = out
            self.procs.append(proc)
            self.pids.append(proc.pid)
        for task, proc in enumerate(self.procs):
            self._wait_ready(task, proc, start + self.timeout)
        self.start_seconds = time.perf_counter() - start

    def _wait_ready(self, task, proc, deadline):
        while time.perf_counter() < deadline:
            with open(proc.out_path) as f:
                if any(line.startswith("tf_spectrain worker: task") for line in f):
                    return
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        with open(proc.out_path + ".err") as f:
            err = f.read()[-2000:]
        raise RuntimeError(
            f"Worker task {task} of --cluster {self.cluster} did not say it serves within "
            f"{self.timeout:g} s (exit code {proc.poll()}); its stderr ends:\n{err}")

    def stop(self):
        """Stops every started worker by its pid: SIGTERM, then SIGKILL if it lingers."""
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []
        if getattr(self, "_dir", None) is not None:
            self._dir.cleanup()
            self._dir = None


# --- the parent: rounds, tables -----------------------------------------------------------


def order(args, r):
    """The `(measurement, where)` runs of round `r` (from 0): local first in even rounds."""
    places = PLACES if r % 2 == 0 else PLACES[::-1]
    return [(kind, where) for kind in args.measure for where in places]


def _flags(args, kind, where):
    return ["--child", kind, "--where", where, "--model", args.model,
            "--batch-size", str(args.batch_size), "--repeats", str(args.repeats),
            "--warmup", str(args.warmup), "--short", str(args.short), "--long", str(args.long),
            "--steps-per-execution", args.steps_per_execution]


def measure(args, kind, where):
    """One measurement in a fresh trainer process (with fresh workers if remote)."""
    flags = _flags(args, kind, where)
    label = f"{kind} {LABELS[where]}"
    if where == "local":
        return common.run_json_child("benchmarks.hosts", flags, label)
    with Workers() as workers:
        flags += ["--cluster", workers.cluster,
                  "--worker-pids", ",".join(map(str, workers.pids))]
        record = common.run_json_child("benchmarks.hosts", flags, label)
        record.update(workers_start_seconds=workers.start_seconds, cluster=workers.cluster,
                      worker_pids=workers.pids)
    return record


def _rate(row):
    """GB/s of one tensor's hop (inf when the copy added no measurable time)."""
    return row["bytes"] / row["hop"] / 1e9 if row["hop"] > 0 else float("inf")


def link_table(records):
    """Markdown: per tensor, local against loopback: hop, call, GB/s, CPU/wall.

    Args:
        records: `{"local": [link record per round], "remote": [...]}`.
    """
    header = ["tensor", "shape", "MB"]
    for where in PLACES:
        w = LABELS[where]
        header += [f"{w}: hop (ms)", f"{w}: call (ms)", f"{w}: GB/s", f"{w}: CPU/wall"]
    rows = []
    for i, first in enumerate(records["local"][0]["tensors"]):
        row = [first["name"], "x".join(map(str, first["shape"])), f"{first['bytes'] / 1e6:.3f}"]
        for where in PLACES:
            tensors = [rec["tensors"][i] for rec in records[where]]
            names = {t["name"] for t in tensors}
            if names != {first["name"]}:
                raise ValueError(f"Rounds disagree on tensor {i}: {sorted(names)}")
            row += [
                common.spread([t["hop"] * 1e3 for t in tensors], ".3f"),
                common.spread([t["call"] * 1e3 for t in tensors], ".3f"),
                "-" if first["name"] == TINY else common.spread([_rate(t) for t in tensors], ".2f"),
                common.spread([t["cores_all"] for t in tensors], ".2f"),
            ]
        rows.append(row)
    return common.markdown_table(header, rows)


def fit_table(records):
    """Markdown: `measure_link`'s bandwidth and latency, local and loopback."""
    rows = []
    for where in PLACES:
        fits = [rec["fit"] for rec in records[where]]
        rows.append([
            LABELS[where], " -> ".join(records[where][0]["devices"]),
            common.spread([f["bandwidth"] / 1e9 for f in fits], ".2f"),
            common.spread([f["latency"] * 1e3 for f in fits], ".3f"),
        ])
    return common.markdown_table(["placement", "devices", "bandwidth (GB/s)", "latency (ms)"],
                                 rows)


def train_table(records, args):
    """Markdown: per placement and window, images/s, ratio to local, CPU/wall."""
    rows = []
    for where in PLACES:
        for window in ("short", "long"):
            runs = records[where]
            ips = [r[window]["images_per_second"] for r in runs]
            ratios = [r[window]["images_per_second"] / ref[window]["images_per_second"]
                      for r, ref in zip(runs, records["local"])]
            rows.append([
                LABELS[where], f"{window} ({getattr(args, window)})", common.spread(ips, ".1f"),
                common.spread(ratios, ".2f"),
                common.spread([r[window]["cores"] for r in runs], ".2f"),
                common.spread([r[window]["cores_all"] for r in runs], ".2f"),
                common.spread([r[window]["started_after"] for r in runs], ".0f"),
            ])
    return common.markdown_table(
        ["placement", "window", "images/s", "x local", "CPU/wall: trainer",
         "CPU/wall: all", "starts after (s)"], rows)


def runs_table(records):
    """Markdown: every training run, round by round."""
    rows = []
    for where in PLACES:
        for r, run in enumerate(records[where], 1):
            rows.append([
                LABELS[where], r, ", ".join(run["variables_on"]),
                f"{run['short']['images_per_second']:.1f}", f"{run['short']['cores_all']:.2f}",
                f"{run['long']['images_per_second']:.1f}", f"{run['long']['cores_all']:.2f}",
            ])
    return common.markdown_table(
        ["placement", "round", "stage variables on", "short: images/s", "short: CPU/wall",
         "long: images/s", "long: CPU/wall"], rows)


def report(results, args, minutes, command=None):
    """The whole markdown report of a run.

    Args:
        results: `{"link": {"local": [...], "remote": [...]}, "train": {...}}`, a record
            per round (a measurement left out of `--measure` is missing or empty).
        args: the parsed arguments.
        minutes: the run's duration.
        command: the command line to show (default: this process').
    """
    command = command or " ".join(["python -m benchmarks.hosts", *sys.argv[1:]])
    lines = [
        f"`{command}`",
        "",
        f"{args.model}, batch {args.batch_size}; local = 2 logical CPU devices of the trainer "
        f"process, loopback = {WORKERS} `tf_spectrain.app.worker` processes on 127.0.0.1 (one "
        f"CPU device each, task 0 -> task 1 over gRPC). {args.rounds} interleaved rounds of "
        f"fresh processes (fresh workers for every loopback run), {minutes:.1f} min. One "
        "intra-op thread in every trainer (tf.config.threading) and every worker "
        "(TF_NUM_INTRAOP_THREADS=1). Medians, (min-max) over rounds. CPU/wall: trainer "
        "and workers together, unless marked trainer.",
    ]
    link = results.get("link") or {}
    if link.get("local") and link.get("remote"):
        lines += [
            "",
            f"Hand-off of a tensor from device 0 to device 1: {args.repeats} timed pairs per "
            "tensor and process (a call that copies, and the same call on a tensor already "
            "there); call = median time of the copying call, hop = median of the pairs' "
            "differences, GB/s = bytes / hop (inf: no measurable cost). The tensors are what "
            f"crosses each cut at batch {args.batch_size} (`describe_stages`); tiny is 4 "
            "bytes.",
            "",
            link_table(link),
            "",
            "`tf_spectrain.costmodel.measure_link` (fit through 4 bytes and the largest "
            "tensor):",
            "",
            fit_table(link),
        ]
    train = results.get("train") or {}
    if train.get("local") and train.get("remote"):
        cut = ", ".join(train["local"][0]["cuts"])
        lines += [
            "",
            f"Training: a 2-stage {MODE} pipeline cut at {cut}, one stage per device; a "
            f"warm-up fit of {args.warmup}, then windows of {args.short} (short) and "
            f"{args.long} (long) mini-batches, each timed from the call of fit to its "
            "return. x local = images/s / the same round's local images/s.",
            "",
            train_table(train, args),
            "",
            "Every training run:",
            "",
            runs_table(train),
        ]
    starts = [r["workers_start_seconds"] for kind in results.values()
              for r in kind.get("remote", []) if "workers_start_seconds" in r]
    if starts:
        lines += ["", f"Workers took {common.spread(starts, '.1f')} s to start (both at once)."]
    return "\n".join(lines)


def _progress(r, kind, where, record):
    if kind == "link":
        big = max(record["tensors"], key=lambda t: t["bytes"])
        tiny = record["tensors"][0]
        text = (f"tiny hop {tiny['hop'] * 1e3:.3f} ms, {big['name']} hop "
                f"{big['hop'] * 1e3:.3f} ms ({_rate(big):.2f} GB/s)")
    else:
        text = (f"short {record['short']['images_per_second']:.1f} images/s on "
                f"{record['short']['cores_all']:.2f} cores, long "
                f"{record['long']['images_per_second']:.1f} on "
                f"{record['long']['cores_all']:.2f}")
    print(f"round {r + 1}: {kind} {LABELS[where]}: {text}", file=sys.stderr, flush=True)


def _stop_on_sigterm(number, frame):
    raise SystemExit(128 + number)  # unwinds the `with Workers()`: they are stopped


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child == "link":
        link_child(args)
        os._exit(0)  # skip TensorFlow's teardown of a connected context
    if args.child == "train":
        train_child(args)
        os._exit(0)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    start = time.perf_counter()
    results = {kind: {where: [] for where in PLACES} for kind in args.measure}
    for r in range(args.rounds):
        for kind, where in order(args, r):
            record = measure(args, kind, where)
            results[kind][where].append(record)
            if args.jsonl:
                common.append_jsonl(args.jsonl, dict(record, round=r))
            _progress(r, kind, where, record)
    text = report(results, args, (time.perf_counter() - start) / 60)
    common.publish(text, args.out)


if __name__ == "__main__":
    main()
