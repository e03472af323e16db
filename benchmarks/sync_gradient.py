"""One `sync` step of a 2-stage pipeline against Keras' `model.fit`, at many cut positions.

    python -m benchmarks.sync_gradient --models NASNetMobile --cuts 24
    python -m benchmarks.sync_gradient            # every architecture of issue 11
    python -m benchmarks.sync_gradient --help

`sync` is sequential SGD, so after one step its weights must equal Keras' (from the same
initial weights, on the same mini-batch) to float precision at every cut. For each model
(`keras.applications`, `weights=None`) and each of `--cuts` evenly spaced cut layers, the
script reports `|W_pipe - W_keras| / |W_keras - W_0|` over the trainable weights, the
number of variables off by more than 1e-3 of their own step, and the tensors crossing the
cut; a row over `--tolerance` is marked. Too slow for CI: a few seconds per cut.
"""

import argparse
import sys

from benchmarks import common

MODELS = {  # the architectures of issue 11, at the smallest input each accepts
    "ResNet50": 32,
    "MobileNetV2": 32,
    "DenseNet121": 32,
    "InceptionV3": 75,
    "Xception": 71,
    "NASNetMobile": 32,
    "ConvNeXtTiny": 32,
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sync_gradient", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--models", type=common.csv_of(str, tuple(MODELS)), default=list(MODELS))
    p.add_argument("--cuts", type=common.positive_int, default=12, help="cut layers per model")
    p.add_argument("--batch-size", type=common.positive_int, default=4)
    p.add_argument("--seed", type=common.non_negative_int, default=0)
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative error")
    p.add_argument("--out", help="also append every row to this JSON-lines file")
    return p.parse_args(argv)


def evenly_spaced(items, count):
    """`count` items spread evenly over `items`, both ends included (all if fewer)."""
    items = list(items)
    if count >= len(items):
        return items
    step = (len(items) - 1) / max(count - 1, 1)
    return [items[round(i * step)] for i in range(count)]


def relative_error(pipe_weights, keras_weights, initial_weights):
    """`(|W_pipe - W_keras| / |W_keras - W_0|, variables off by > 1e-3 of their step)`.

    A variable's own step counts as at least 1% of the whole step: a bias that BatchNorm
    cancels has a gradient of float noise, which no comparison of its own can resolve.
    """
    import numpy as np

    def norm(pairs):
        return float(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in pairs)))

    step = norm(zip(keras_weights, initial_weights))
    error = norm(zip(pipe_weights, keras_weights))
    off = sum(
        1
        for p, k, w in zip(pipe_weights, keras_weights, initial_weights)
        if np.linalg.norm(p - k) > 1e-3 * max(float(np.linalg.norm(k - w)), 1e-2 * step, 1e-12)
    )
    return error / step if step else float("inf"), off


def sweep(build, x, y, positions, devices):
    """One row per cut: the pipeline's one sync step against Keras' (see the module doc).

    Args:
        build: a function returning a fresh, identically initialised Keras model.
        x, y: one mini-batch.
        positions: indices into the model's `layers` to cut after (one 2-stage pipeline
            each; by position, since Keras names unnamed layers anew in every build).
        devices: the two device names of the stages.

    Returns:
        A list of dicts with `position`, `cut` (the layer's name), `crossing`,
        `relative_error`, `variables_off` and `variables`.
    """
    import keras

    import tf_spectrain

    def loss():
        return keras.losses.SparseCategoricalCrossentropy()

    def sgd():
        return keras.optimizers.SGD(0.01, momentum=0.9)

    reference = build()
    initial = [w.numpy() for w in reference.trainable_weights]
    reference.compile(optimizer=sgd(), loss=loss())
    reference.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    expected = [w.numpy() for w in reference.trainable_weights]
    rows = []
    for position in positions:
        model = build()
        cut = model.layers[position].name
        specs = tf_spectrain.partition.describe_stages(model, [cut])
        pipe = tf_spectrain.PipelineModel(model, cuts=[cut], devices=devices, mode="sync")
        pipe.compile(optimizer=sgd(), loss=loss())
        pipe.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
        got = [w.numpy() for w in model.trainable_weights]
        error, off = relative_error(got, expected, initial)
        rows.append(
            {
                "position": position,
                "cut": cut,
                "crossing": len(specs[1].input_shapes),
                "relative_error": error,
                "variables_off": off,
                "variables": len(got),
            }
        )
    return rows


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    devices = common.prepare_tensorflow(2)
    import keras
    import numpy as np

    worst = 0.0
    print("| model | cut after (position, name) | tensors crossing | relative error "
          "| variables off |")
    print("|---|---|---|---|---|")
    for name in args.models:
        size = MODELS[name]
        application = getattr(keras.applications, name)

        def build(application=application, size=size):
            keras.utils.set_random_seed(args.seed)
            return application(weights=None, input_shape=(size, size, 3), classes=10)

        rng = np.random.default_rng(args.seed)
        x = rng.normal(size=(args.batch_size, size, size, 3)).astype("float32")
        y = np.arange(args.batch_size) % 10
        positions = evenly_spaced(range(1, len(build().layers) - 1), args.cuts)
        for row in sweep(build, x, y, positions, devices):
            row["model"] = name
            worst = max(worst, row["relative_error"])
            mark = " **over**" if row["relative_error"] > args.tolerance else ""
            print(
                f"| {name} | {row['position']} {row['cut']} | {row['crossing']} | "
                f"{row['relative_error']:.2e}{mark} | {row['variables_off']} of "
                f"{row['variables']} |",
                flush=True,
            )
            if args.out:
                common.append_jsonl(args.out, row)
    print(f"worst relative error {worst:.2e} (tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
