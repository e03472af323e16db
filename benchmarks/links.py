"""The paper's headline on emulated hosts: a pipeline against data parallelism on shaped links.

    python -m benchmarks.links                                # VGG16, 2 hosts, 4 rates, 3 rounds
    python -m benchmarks.links --rates 100mbit --configs dp,stash --rounds 1
    python -m benchmarks.links --quick                        # small_cnn, 1 round: a smoke run

Each host is a network namespace (`benchmarks.emulated_hosts`) running one
`python -m tf_spectrain.app.worker` with one intra-op thread, pinned to a core of its own
(host h on core h modulo the cores); the trainer runs in a namespace of its own
(`--hosts` + 1 namespaces), joined to the workers at the address its route leaves from
(`tf_spectrain.cluster.reach`). Every link, the trainer's too, is shaped to the rate both
ways (`tc ... tbf`). Configurations:

- `dp`: `train.py --mode dp` over the cluster: a copy of the model per worker, each
  mini-batch split across them, the gradients summed before every update;
- `sync`, `stash`, `spectrain`: a pipeline of one stage per worker, cut at `CUTS`
  (`sync` with `--micro-batches 4`), `spectrain` with the paper's target;
- `alone`: the model on one core in one process, no network (`single` mode): one host.

Every measurement is a fresh set of namespaces, workers and trainer. The trainer fits
`--epochs` epochs of `--steps` mini-batches of synthetic images (the first epoch builds
the graphs) and reports the median of the later epochs as images/s, and the bytes every
host sent during them per mini-batch (what the switch's ports received, all hosts).
Configurations alternate within a round, rates in the outer loop; records go to
`--out-jsonl` as they come (with `window`, the pipelines' mini-batches per graph call:
`steps_per_execution="auto"` runs windows of one on workers' CPUs), and the table gives
medians over rounds. `--model mlp_wide` (the zoo's `mlp` with 2,048 units per hidden layer,
cut after `dense1`) has weights large next to its activations.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import common, emulated_hosts

CONFIGS = ("alone", "dp", "sync", "stash", "spectrain")
CUTS = {"vgg16": ["block3_relu2"], "small_cnn": ["pool1"], "mlp_wide": ["dense1"]}
# Models beyond the zoo's names: (zoo name, options). `mlp_wide` has weights large next to
# its activations: 42 MB of weights against 0.5 MB at its cut at batch 64 (VGG16: 61 MB
# against 4.2 MB).
OPTIONS = {"mlp_wide": ("mlp", {"hidden": 2048})}
PORT = 2222
START_TIMEOUT = 120.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.links",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vgg16", choices=sorted(CUTS))
    p.add_argument("--hosts", type=common.positive_int, default=2)
    p.add_argument("--rates", type=common.csv_of(str), default=["unshaped", "1gbit", "200mbit",
                                                                "50mbit"])
    p.add_argument("--configs", type=common.csv_of(str, CONFIGS), default=list(CONFIGS))
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    p.add_argument("--steps", type=common.positive_int, default=24)
    p.add_argument("--epochs", type=common.positive_int, default=3)
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--quick", action="store_true", help="small_cnn, 1 round, short epochs")
    p.add_argument("--slow-start-after-idle", choices=("on", "off"), default="on",
                   help="TCP's restart from a small window after an idle moment (Linux's "
                   "default: on), in every host")
    p.add_argument("--steps-per-execution", default="auto",
                   help="the pipelines' `steps_per_execution`: auto, an int, or eager "
                   "(`run_eagerly`: pass by pass)")
    p.add_argument("--trace", metavar="DIR", help="also write each pipeline's trace of every "
                   "epoch there (`PipelineTrace`, pass times: slows windows a little)")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--out-jsonl", default="docs/data/issue40/links.jsonl")
    p.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    p.add_argument("--trace-file", help=argparse.SUPPRESS)
    p.add_argument("--cluster", help=argparse.SUPPRESS)
    p.add_argument("--switch", help=argparse.SUPPRESS)
    p.add_argument("--worker-pids", type=common.csv_of(int), default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for rate in args.rates:
        emulated_hosts.rate_bits(rate)
    if args.quick:
        args.model, args.rounds, args.steps, args.epochs = "small_cnn", 1, 6, 2
    return args


# --- the trainer (a child process in the trainer's namespace, or alone) ---------------------

def port_bytes(switch):
    """Bytes each host has sent and received so far, `{"p<h>": (sent, received)}`: what the
    switch's port of host h received and sent (a byte two hosts exchange is sent once)."""
    done = subprocess.run(["ip", "netns", "exec", switch, "ip", "-s", "-j", "link", "show"],
                          capture_output=True, text=True, check=True)
    return {link["ifname"]: (link["stats64"]["rx"]["bytes"], link["stats64"]["tx"]["bytes"])
            for link in json.loads(done.stdout) if link["ifname"].startswith("p")}


def _moved(before, after):
    """`{"p<h>": [sent, received]}` between two `port_bytes` readings."""
    return {port: [a - b for a, b in zip(after[port], before[port])] for port in after}


def _cpu_seconds(pid):
    """CPU seconds process `pid` has used (user and system, from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mark(args):
    """Now: wall and CPU seconds, the hosts' bytes, the workers' CPU seconds."""
    return (time.perf_counter(), time.process_time(),
            port_bytes(args.switch) if args.switch else {},
            [_cpu_seconds(pid) for pid in args.worker_pids])


def child(args):
    """Trains one configuration; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    import tf_spectrain
    from tf_spectrain.app import trainers
    from tf_spectrain.runtime.loop import window_size

    tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.child == "alone":
        devices = common.prepare_tensorflow(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    else:
        devices = tf_spectrain.connect_cluster(args.cluster, devices_per_worker=1, timeout=60)
    mode = {"alone": "single", "spectrain": "spectrain"}.get(args.child, args.child)
    settings = {"sync": dict(micro_batches=4), "spectrain": dict(spectrain_target="paper")}

    def build():
        keras.utils.set_random_seed(0)
        return build_model(args.model)

    spe = args.steps_per_execution
    pipeline = {} if args.child in ("alone", "dp") else dict(
        run_eagerly=spe == "eager", steps_per_execution="auto" if spe in ("auto", "eager")
        else int(spe))
    trainer = trainers.build_trainer(
        build, mode, devices, learning_rate=0.01, cuts=CUTS[args.model],
        batch_size=args.batch_size, across_hosts=args.child == "dp",
        **settings.get(args.child, {}), **pipeline)
    data = common.synthetic_images(args.batch_size, args.steps)
    marks = {}

    class Clock(keras.callbacks.Callback):
        reads_model_weights = False

        def on_epoch_begin(self, epoch, logs=None):
            marks.setdefault("begin", {})[epoch] = _mark(args)

        def on_epoch_end(self, epoch, logs=None):
            marks.setdefault("end", {})[epoch] = _mark(args)

    callbacks = [Clock()]
    if args.trace_file and args.child not in ("alone", "dp"):
        callbacks.append(tf_spectrain.callbacks.PipelineTrace(args.trace_file, pass_times=True))
    started = time.perf_counter()
    trainer.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
    total = time.perf_counter() - started
    later = range(1, args.epochs)
    seconds = [marks["end"][e][0] - marks["begin"][e][0] for e in later]
    cpu = [marks["end"][e][1] - marks["begin"][e][1] for e in later]
    moved = [_moved(marks["begin"][e][2], marks["end"][e][2]) for e in later]
    epoch = statistics.median(seconds)
    mid = sorted(range(len(seconds)), key=seconds.__getitem__)[len(seconds) // 2]
    window = None if args.child == "alone" else window_size(  # dp: the pipeline's replicas
        trainer.steps_per_execution, callbacks, trainer.run_eagerly, trainer.devices)
    print(json.dumps({
        "images_per_s": args.batch_size * args.steps / epoch, "epoch_s": seconds,
        "window": window,  # mini-batches per graph call (None: pass by pass, or no pipeline)
        "first_epoch_s": marks["end"][0][0] - marks["begin"][0][0], "fit_s": total,
        "trainer_cpu_per_wall": statistics.median(c / s for c, s in zip(cpu, seconds)),
        "bytes_per_batch": statistics.median(
            sum(sent for sent, _ in m.values()) for m in moved) / args.steps,
        "host_bytes_per_batch": {  # host h: [sent, received], in the median epoch
            f"h{port[1:]}": [b / args.steps for b in moved[mid][port]] for port in moved[mid]},
        "worker_cpu_per_wall": [  # each worker's, in the median epoch
            (marks["end"][mid + 1][3][w] - marks["begin"][mid + 1][3][w]) / seconds[mid]
            for w in range(len(args.worker_pids))],
    }))


def build_model(name):
    """One of `CUTS`' models, for 32x32x3 images of 10 classes (a fresh `keras.Model`)."""
    import tf_spectrain

    zoo, options = OPTIONS.get(name, (name, {}))
    return tf_spectrain.models.get_model(zoo, common.INPUT_SHAPE, common.NUM_CLASSES, **options)


# --- the parent: namespaces, workers, records ------------------------------------------------

def child_env():
    """The environment of the workers and the trainer: quiet logs, no GPU, one intra-op
    thread."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
                TF_NUM_INTRAOP_THREADS="1")


def _child_args(args, config):
    return ["--child", config, "--model", args.model, "--batch-size", str(args.batch_size),
            "--steps", str(args.steps), "--epochs", str(args.epochs),
            "--steps-per-execution", args.steps_per_execution]


def measure(args, config, rate, round_=0):
    """One measurement of `config` at `rate`: a record dict."""
    record = dict(config=config, rate=rate, model=args.model, hosts=args.hosts,
                  batch_size=args.batch_size, steps=args.steps, epochs=args.epochs,
                  slow_start_after_idle=args.slow_start_after_idle, bytes_counted="sent",
                  steps_per_execution=args.steps_per_execution)
    if config == "alone":
        cmd, env = common.child_command("benchmarks.links", _child_args(args, config),
                                        child_env())
        out = subprocess.run(["taskset", "-c", "0", *cmd], capture_output=True, text=True,
                             env=env, timeout=3600, check=False)
        return _record(record, out)
    sysctls = {"net.ipv4.tcp_slow_start_after_idle": "1" if args.slow_start_after_idle == "on"
               else "0"}
    traced = [] if not args.trace else [
        "--trace-file", os.path.abspath(os.path.join(args.trace, f"{config}-{rate}-r{round_}-"
                                                     "epoch{epoch}.json"))]
    with emulated_hosts.EmulatedHosts(args.hosts + 1, rate, sysctls=sysctls) as hosts:
        cluster, workers = start_workers(hosts, args.hosts)
        cmd, env = common.child_command(
            "benchmarks.links",
            _child_args(args, config) + traced + [
                "--cluster", cluster, "--switch", hosts.switch,
                "--worker-pids", ",".join(str(w.pid) for w in workers)], child_env())
        out = hosts.run(args.hosts, cmd, timeout=3600, env=env, cwd=common.ROOT)
    return _record(record, out)


def start_workers(hosts, count):
    """Starts `python -m tf_spectrain.app.worker` in hosts 0 .. count - 1 of `hosts` (an
    entered `EmulatedHosts`), one intra-op thread each, host h pinned to core h modulo the
    cores; returns `(cluster, workers)`: the `--cluster` string and the processes."""
    cores = os.cpu_count() or 1
    cluster = ",".join(f"{hosts.address(h)}:{PORT}" for h in range(count))
    workers = [hosts.popen(h, [sys.executable, "-m", "tf_spectrain.app.worker", "--cluster",
                               cluster, "--task", str(h), "--bind-all"], core=h % cores,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=child_env(), cwd=common.ROOT) for h in range(count)]
    for worker in workers:
        if not any(line.startswith("tf_spectrain worker: ") for line in worker.stdout):
            raise RuntimeError(f"a worker did not start (exit {worker.wait()})")
    return cluster, workers


def _record(record, out):
    if out.returncode != 0:
        raise RuntimeError(f"{record['config']} at {record['rate']} failed:\n"
                           f"{out.stderr[-3000:]}")
    return dict(record, **json.loads(out.stdout.strip().splitlines()[-1]))


def table(records, args):
    """The markdown table: images/s per config and rate, speed-up over dp, bytes."""
    header = ["link"] + [f"{c} images/s" for c in args.configs] + [
        f"{c} / dp" for c in args.configs if c not in ("dp", "alone") and "dp" in args.configs
    ] + [f"{c} MB per mini-batch" for c in args.configs if c != "alone"]
    rows = []
    for rate in args.rates:
        cell = {c: [r for r in records if r["config"] == c and r["rate"] == rate]
                for c in args.configs}
        speed = {c: [r["images_per_s"] for r in rs] for c, rs in cell.items()}
        row = [rate] + [common.spread(speed[c], ".1f") if speed[c] else "-" for c in args.configs]
        for c in args.configs:
            if c in ("dp", "alone") or "dp" not in args.configs:
                continue
            ratios = [a / b for a, b in zip(speed[c], speed["dp"])]
            row.append(common.spread(ratios, ".2f") if ratios else "-")
        for c in args.configs:
            if c != "alone":
                moved = [r["bytes_per_batch"] / 1e6 for r in cell[c]]
                row.append(common.spread(moved, ".1f") if moved else "-")
        rows.append(row)
    return common.markdown_table(header, rows)


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    emulated_hosts.check_available()
    records = []
    for round_ in range(args.rounds):
        for rate in args.rates:
            order = args.configs if round_ % 2 == 0 else list(reversed(args.configs))
            for config in order:
                if config == "alone" and rate != args.rates[0]:
                    continue  # no network: once per round
                record = dict(measure(args, config, rate, round_), round=round_)
                if config == "alone":
                    records += [dict(record, rate=r) for r in args.rates]
                else:
                    records.append(record)
                common.append_jsonl(args.out_jsonl, record)
                print(f"round {round_} {rate} {config}: {record['images_per_s']:.1f} images/s, "
                      f"{record['bytes_per_batch'] / 1e6:.1f} MB per mini-batch", flush=True)
    common.publish(table(records, args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
