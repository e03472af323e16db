"""Child process of test_worker: the servers of the version check, in one process.

    python tests/cluster_fake_worker.py --cluster C --play T:old [--play T:real ...]

Serves each task T named, in this one process: `old` is a tf_spectrain worker that
publishes tf_spectrain version 0.0.1; `real` is what `python -m tf_spectrain.app.worker`
serves (`server.start_worker` with the real versions); `plain` is a bare
`tf.distribute.Server`, with no tf_spectrain record. Prints "ready" once every server is
up, and waits to be killed.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

OLD_VERSION = "0.0.1"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--play", action="append", required=True,
                        help="T:old, T:real or T:plain, the task to serve and how")
    args = parser.parse_args()

    import tensorflow as tf

    from tf_spectrain.cluster import server, spec

    cluster = spec.parse_cluster(args.cluster)
    keep = []
    for play in args.play:
        task, kind = play.split(":")
        if kind == "old":
            keep.append(server.start_worker(cluster, int(task), bind_all=True,
                                            versions={"tf_spectrain": OLD_VERSION}))
        elif kind == "real":
            keep.append(server.start_worker(cluster, int(task), bind_all=True))
        elif kind == "plain":
            keep.append(tf.distribute.Server(tf.train.ClusterSpec(cluster.jobs()),
                                             job_name="worker", task_index=int(task)))
        else:
            parser.error(f"--play {play}: the kind must be old, real or plain")
    print("ready", flush=True)
    while keep:
        time.sleep(1)


if __name__ == "__main__":
    main()
