"""A tf_spectrain worker: serves this host's devices to a trainer on other hosts.

    python -m tf_spectrain.app.worker --cluster h0:p0,h1:p1 --task T [--cpu-devices G] --bind-all
    TF_CONFIG='{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": T}}' \\
        python -m tf_spectrain.app.worker [--cpu-devices G] --bind-all

Starts a TensorFlow server for address T of the list, prints one line saying what it
serves, and waits; SIGTERM or SIGINT (Ctrl-C) stops it with exit code 0. On a host with
GPUs it serves them all; `--cpu-devices G` splits the CPU into G devices (for CPU-only
hosts, one per stage).

Security: a TensorFlow server runs any graph sent by anyone who can reach its port, and
TensorFlow 2.21 listens on every interface whatever the host in the address. The worker
refuses to start so unless `--bind-all` says that this is accepted: use it on a trusted
network, or with a firewall that lets only the cluster's hosts reach the port.
"""

import argparse
import os
import signal
import sys
import threading

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def build_parser():
    """The worker's command-line parser."""
    parser = argparse.ArgumentParser(
        prog="python -m tf_spectrain.app.worker",
        description="Serve this host's devices to a tf_spectrain trainer.",
    )
    parser.add_argument("--cluster", default=None,
                        help="the workers' addresses h0:p0,h1:p1,... (default: TF_CONFIG)")
    parser.add_argument("--task", type=int, default=None,
                        help="the index of this worker's address in --cluster")
    parser.add_argument("--cpu-devices", type=int, default=None,
                        help="split the CPU into this many devices (default: one)")
    parser.add_argument("--bind-all", action="store_true",
                        help="accept that TensorFlow listens on every interface")
    return parser


def main(argv=None):
    """Runs a worker until SIGTERM or SIGINT.

    Args:
        argv: the arguments (default: `sys.argv[1:]`).

    Returns:
        The exit code: 0 when stopped by a signal, 2 for bad arguments, 1 when the server
        cannot start.
    """
    stop = threading.Event()
    received = []

    def on_signal(number, frame):
        received.append(signal.Signals(number).name)
        stop.set()

    for number in _STOP_SIGNALS:
        signal.signal(number, on_signal)
    parser = build_parser()
    args = parser.parse_args(argv)

    import tensorflow as tf

    from tf_spectrain.cluster import server, slots

    try:
        cluster, task = slots.worker_slot(args.cluster, args.task)
        worker = server.start_worker(cluster, task, cpu_devices=args.cpu_devices,
                                     bind_all=args.bind_all)
    except (TypeError, ValueError) as error:
        parser.print_usage(sys.stderr)
        print(f"error: {error}", file=sys.stderr)
        return 2
    except server.WildcardBindError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except tf.errors.OpError as error:
        print(f"error: TensorFlow could not start the server of task {task} "
              f"({cluster.workers[task]}): {error.message}", file=sys.stderr)
        return 1
    print(worker.describe(), flush=True)
    while not stop.wait(0.2):  # a timed wait lets the signal handler run promptly
        pass
    print(f"tf_spectrain worker: task {worker.task} ({worker.address}) stopped by "
          f"{received[0]}", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # TensorFlow servers cannot be shut down cleanly ("Clean shutdown is not currently
    # implemented"); leave without running its destructors.
    os._exit(code)
