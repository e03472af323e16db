"""Child process of test_worker: a server that is not the worker the trainer expects.

    python tests/cluster_fake_worker.py --cluster C --task T --play old|plain

`old` is a tf_spectrain worker that publishes tf_spectrain version 0.0.1; `plain` is a bare
`tf.distribute.Server`, with no tf_spectrain record. Prints "ready" and waits to be killed.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

OLD_VERSION = "0.0.1"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--task", type=int, required=True)
    parser.add_argument("--play", choices=["old", "plain"], required=True)
    args = parser.parse_args()

    import tensorflow as tf

    from tf_spectrain.cluster import server, spec

    cluster = spec.parse_cluster(args.cluster)
    if args.play == "old":
        keep = server.start_worker(cluster, args.task, bind_all=True,
                                   versions={"tf_spectrain": OLD_VERSION})
    else:
        keep = tf.distribute.Server(tf.train.ClusterSpec(cluster.jobs()), job_name="worker",
                                    task_index=args.task)
    print("ready", flush=True)
    while keep is not None:
        time.sleep(1)


if __name__ == "__main__":
    main()
