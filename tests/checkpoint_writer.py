"""Saves checkpoints in a loop: the process that test_checkpoint_store.py kills with SIGKILL.

Usage: python checkpoint_writer.py DIRECTORY [COUNT]

Continues after the newest checkpoint in DIRECTORY (or starts at step 0) and saves one
checkpoint per step, `keep=KEEP`, step g being (epoch, batch) = divmod(g, BATCHES_PER_EPOCH).
Every array of the checkpoint of (epoch, batch) holds `value(epoch, batch)` so that a reader
can tell a consistent checkpoint from a mixed one. Prints "saving NAME" (NAME the checkpoint
directory name) before each save and "saved PATH" after it, flushed, so the test can time
its kill. Stops after COUNT saves (default: never).

`tf_spectrain.checkpoint.store` is imported without running the `__init__.py` of
`tf_spectrain` and `tf_spectrain.checkpoint` (which import TensorFlow), so that this process
starts fast: see `load_pure`.
"""

import importlib
import os
import sys
import types

import numpy as np

BATCHES_PER_EPOCH = 3
KEEP = 2


def load_pure(name="tf_spectrain.checkpoint.store"):
    """Imports the module `name` of this checkout's tf_spectrain without its packages' `__init__`.

    The packages `tf_spectrain` and `tf_spectrain.checkpoint` are registered as empty
    modules whose `__path__` is their folder, so that only `name` and what it imports run.
    """
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    for package in ("tf_spectrain", "tf_spectrain.checkpoint"):
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [os.path.join(root, *package.split("."))]
            sys.modules[package] = module
    return importlib.import_module(name)


def value(epoch, batch):
    return epoch * 100 + batch


def arrays_for(epoch, batch):
    v = value(epoch, batch)
    return {
        "stage0/kernel": np.full((1_000_000,), v, np.float32),  # 4 MB
        "stage1/kernel": np.full((400, 1000), v, np.float64),  # 3.2 MB
        "stage1/count": np.int64(v),
        "stage1/odd": np.full((5,), v % 2 == 1),
        "data/order": np.full((3,), v % 256, np.uint8),
    }


def main(directory, count):
    store = load_pure()
    latest = store.latest_checkpoint(directory)
    step = 0
    if latest is not None:
        _, info = store.load_checkpoint(latest)
        step = info["epoch"] * BATCHES_PER_EPOCH + info["batch"] + 1
    saved = 0
    while count is None or saved < count:
        epoch, batch = divmod(step, BATCHES_PER_EPOCH)
        print(f"saving ckpt-e{epoch:04d}-b{batch:06d}", flush=True)
        path = store.save_checkpoint(
            directory,
            arrays_for(epoch, batch),
            {"writer": "kill-test", "value": value(epoch, batch)},
            epoch=epoch,
            batch=batch,
            keep=KEEP,
        )
        print(f"saved {path}", flush=True)
        saved += 1
        step += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
