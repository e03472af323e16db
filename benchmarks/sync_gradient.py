"""One `sync` step of a 2-stage pipeline against Keras' `model.fit`, at many cut positions.

    python -m benchmarks.sync_gradient --models NASNetMobile --cuts 24
    python -m benchmarks.sync_gradient            # every architecture of issue 11
    python -m benchmarks.sync_gradient --auto 4   # one planned 4-stage pipeline per model
    python -m benchmarks.sync_gradient --help

`sync` is sequential SGD, so after one step its weights must equal Keras' (from the same
initial weights, on the same mini-batch) to float precision at every cut. For each model
(`keras.applications`, `weights=None`) and each of `--cuts` evenly spaced cut layers, the
script reports `|W_pipe - W_keras| / |W_keras - W_0|` over the trainable weights, the
number of variables off by more than 1e-3 of their own step, and the tensors crossing the
cut; a row over `--tolerance` is marked. Too slow for CI: a few seconds per cut. Each
model runs in a fresh process (a sweep's memory grows with every model built).

Then the model's own sensitivity at that cut (`cut_sensitivity`): how far
its gradient moves when the tensors crossing the cut move by 1e-6. Max pooling and ReLU
route a gradient to one of several nearly equal values, so where that is large, a pipeline
(whose stages run as separate graphs, 1e-6 from Keras' forward) differs from Keras by as
much without any bug in the pipeline.

Two more columns tell such a row from a bug. `keras_eager` is Keras against itself: one
step of `fit` with `run_eagerly=True` against `fit`, the same mini-batch only rounded
differently; where it is far over the tolerance, so may a correct pipeline be. And
`relu_flips` counts the ReLU inputs to which the pipeline's forward (its stages' graphs)
gives the other sign than `fit`'s graph: an input within float noise of 0 whose sign
depends on the order of a sum. The gradient passes that element in one and not in the
other, a difference of a whole gradient element. (NASNetMobile, batch 4, seed 0, cut 103:
one such element, `normal_bn_1_6`'s output at channel 44, -2.6e-6 in `fit`, +1.3e-6 in
the pipeline; moving that BatchNorm's beta[44] by 5e-6 moves `fit`'s step by the 1.5e-2
the pipeline differs by, and the pipeline then agrees with it to 1.4e-4.)
"""

import argparse
import subprocess
import sys

from benchmarks import common

MODELS = {  # the architectures of issues 11 and 12, at the smallest input each accepts
    "ResNet50": 32,
    "ResNet101": 32,
    "MobileNetV2": 32,
    "MobileNetV3Small": 32,
    "DenseNet121": 32,
    "InceptionV3": 75,
    "Xception": 71,
    "NASNetMobile": 32,
    "EfficientNetB0": 32,
    "EfficientNetV2B0": 32,
    "ConvNeXtTiny": 32,
}
"""Dropout layers (MobileNetV3's and EfficientNet's heads and blocks) get rate 0, so that
sync can equal Keras exactly; the pipeline and Keras build the same model."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sync_gradient", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--models", type=common.csv_of(str, tuple(MODELS)), default=list(MODELS))
    p.add_argument("--cuts", type=common.positive_int, default=12, help="cut layers per model")
    p.add_argument("--positions", type=common.csv_of(int),
                   help="cut after these layer positions instead (e.g. 103,155)")
    p.add_argument("--batch-size", type=common.positive_int, default=4)
    p.add_argument("--seed", type=common.non_negative_int, default=0)
    p.add_argument("--tolerance", type=float, help="largest relative error "
                   "(default: 1e-4 in float32, 1e-9 in float64)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="the models' dtype; float64 leaves no ReLU within rounding of 0")
    p.add_argument("--auto", type=common.positive_int, metavar="N",
                   help="instead of the sweep: one pipeline of N stages per model with "
                   "cuts='auto' (planned from measured time)")
    p.add_argument("--out", help="also append every row to this JSON-lines file")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tolerance is None:
        args.tolerance = 1e-4 if args.dtype == "float32" else 1e-9
    return args


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


def _keras_step(build, x, y, run_eagerly=False):
    """Initial and one-step trainable weights of Keras' own `fit` on `(x, y)`."""
    import keras

    model = build()
    initial = [w.numpy() for w in model.trainable_weights]
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        run_eagerly=run_eagerly,
    )
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    return initial, [w.numpy() for w in model.trainable_weights]


def keras_eager_error(build, x, y, reference=None):
    """Keras against itself: one step of `fit` with `run_eagerly=True` against `fit`.

    The same mini-batch and initial weights, only rounded differently (eager ops instead
    of one graph): the same measure as the pipeline's error (`relative_error`), so a
    pipeline error of this size is within what Keras itself gives.

    Args:
        build: a function returning a fresh, identically initialised Keras model.
        x, y: one mini-batch.
        reference: `(initial, one_step)` trainable weights of `fit`, if already computed.

    Returns:
        `|W_eager - W_fit| / |W_fit - W_0|`.
    """
    initial, expected = reference if reference is not None else _keras_step(build, x, y)
    return relative_error(_keras_step(build, x, y, run_eagerly=True)[1], expected, initial)[0]


def cut_sensitivity(build, x, y, position, noise=1e-6, seed=0):
    """How far the model's own gradient moves when the tensors crossing a cut move by `noise`.

    The stages of `split_model` (which share the model's layers) are chained by hand in
    eager mode, once as they are and once with normal noise added to every tensor that
    crosses the cut. Max pooling and ReLU route a gradient to one of several nearly equal
    values, so at some cuts a float-sized change moves the gradient far more than that;
    a pipeline, whose stages run as separate graphs whose outputs are about 1e-6 from
    Keras', can then differ from `model.fit` by as much.

    Args:
        build: a function returning a fresh, identically initialised Keras model.
        x, y: one mini-batch.
        position: the index into the model's `layers` to cut after.
        noise: the standard deviation of the noise.
        seed: the noise's seed.

    Returns:
        `|g(h + noise) - g(h)| / |g(h)|` over all trainable weights, `h` the crossing
        tensors: comparable to the one-step error, since a first SGD step is `-lr * g`.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_spectrain

    model = build()
    first, second = tf_spectrain.partition.split_model(model, [model.layers[position].name])
    loss = keras.losses.SparseCategoricalCrossentropy()
    zero = tf.UnconnectedGradients.ZERO

    def gradient(moved):
        with tf.GradientTape() as tape0:
            h = first(x, training=True)
        h = h if isinstance(h, list) else [h]
        if moved:
            h_in = [t + tf.random.stateless_normal(t.shape, [seed, i]) * noise
                    for i, t in enumerate(h)]
        else:
            h_in = h
        with tf.GradientTape() as tape1:
            tape1.watch(h_in)
            value = loss(y, second(h_in if len(h_in) > 1 else h_in[0], training=True))
        n = len(second.trainable_weights)
        g1 = tape1.gradient(value, second.trainable_weights + h_in, unconnected_gradients=zero)
        g0 = tape0.gradient(h, first.trainable_weights, output_gradients=g1[n:],
                            unconnected_gradients=zero)
        return [np.asarray(g) for g in list(g0) + list(g1[:n])]

    base, moved = gradient(False), gradient(True)
    change = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(moved, base)))
    size = np.sqrt(sum(np.sum(b**2) for b in base))
    return float(change / size) if size else float("inf")


def _relu_layers(model):
    """The model's ReLU layers (`keras.layers.ReLU` and `Activation("relu")`), in order."""
    import keras

    return [
        layer for layer in model.layers
        if isinstance(layer, keras.layers.ReLU)
        or (isinstance(layer, keras.layers.Activation)
            and layer.activation is keras.activations.relu)
    ]


def relu_flips(build, x, y, position, devices):
    """How many ReLU inputs the 2-stage pipeline's forward gives the other sign than `fit`'s.

    A ReLU input within float noise of 0 takes its sign from the order of a sum, which
    differs between Keras' single graph (here a `tf.function` of forward and gradient, as
    in `model.fit`) and the pipeline's stages (stage 0's forward and stage 1's forward and
    gradient, each a `tf.function` on its device, as in the stage runtime). Where the two
    disagree, the gradient passes that element in one and not in the other: a difference
    of a whole gradient element, not of float noise, with no bug in either. A row over
    the tolerance with flips here is that; one without flips is not explained by it.

    Args:
        build: a function returning a fresh, identically initialised Keras model.
        x, y: one mini-batch.
        position: the index into the model's `layers` to cut after.
        devices: the two device names of the stages.

    Returns:
        The number of ReLU input elements whose sign (`> 0`) differs between the two,
        once per ReLU layer (a tensor read by two ReLU layers counts twice; max-pooling
        ties and the upper bound of a ReLU6 are not counted).
    """
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_spectrain
    from tf_spectrain.partition.keras_nodes import one_or_list
    from tf_spectrain.runtime.graphs import as_list

    loss = keras.losses.SparseCategoricalCrossentropy()

    def probe(model):
        layers = _relu_layers(model)
        outputs = list(model.outputs)
        return len(outputs), keras.Model(
            one_or_list(model.inputs), outputs + [layer.input for layer in layers]
        )

    model = build()
    _, whole = probe(model)

    @tf.function
    def keras_graph():
        with tf.GradientTape() as tape:
            out = as_list(whole(x, training=True))
            value = loss(y, out[0])
        return out[1:], tape.gradient(value, model.trainable_weights)

    expected = [np.asarray(v) for v in keras_graph()[0]]

    pipe_model = build()
    pipe = tf_spectrain.PipelineModel(
        pipe_model, cuts=[pipe_model.layers[position].name], devices=devices, mode="sync"
    )
    (n0, first), (_, second) = probe(pipe.stages[0]), probe(pipe.stages[1])

    @tf.function
    def stage0():
        with tf.device(devices[0]):
            return as_list(first(x, training=True))

    @tf.function
    def stage1(h):
        with tf.device(devices[1]):
            with tf.GradientTape() as tape:
                tape.watch(h)
                out = as_list(second(one_or_list(h), training=True))
                value = loss(y, out[0])
            return out[1:], tape.gradient(value, pipe.stages[1].trainable_weights + h)

    out0 = stage0()
    got = dict(zip([layer.name for layer in _relu_layers(pipe.stages[0])], out0[n0:]))
    got.update(zip([layer.name for layer in _relu_layers(pipe.stages[1])],
                   stage1(list(out0[:n0]))[0]))
    # Every build names unnamed layers anew: match the pipeline's ReLUs to Keras' by order.
    names = [layer.name for layer in _relu_layers(pipe_model)]
    return int(sum(np.sum((np.asarray(got[n]) > 0) != (e > 0)) for n, e in zip(names, expected)))


def _pipeline_step(pipe, x, y, expected, initial):
    """One step of `pipe` on `(x, y)` with Keras' SGD: its weights and `relative_error`s."""
    import keras

    pipe.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(),
    )
    pipe.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    got = [w.numpy() for w in pipe.model.trainable_weights]
    return (got, *relative_error(got, expected, initial))


def sweep(build, x, y, positions, devices, diagnostics=True):
    """One row per cut: the pipeline's one sync step against Keras' (see the module doc).

    Args:
        build: a function returning a fresh, identically initialised Keras model.
        x, y: one mini-batch.
        positions: indices into the model's `layers` to cut after (one 2-stage pipeline
            each; by position, since Keras names unnamed layers anew in every build).
        devices: the two device names of the stages.
        diagnostics: also measure `keras_sensitivity` and `relu_flips` (None if not).

    Returns:
        A list of dicts with `position`, `cut` (the layer's name), `crossing`,
        `relative_error`, `variables_off`, `variables`, `keras_sensitivity` (see
        `cut_sensitivity`) and `keras_eager` (Keras' own `fit` with `run_eagerly=True`
        against its `fit`, the same measure: how far Keras itself moves when the same
        mini-batch is only rounded differently; the same in every row of a model).
    """

    import tf_spectrain

    initial, expected = _keras_step(build, x, y)
    keras_eager = keras_eager_error(build, x, y, reference=(initial, expected))
    rows = []
    for position in positions:
        model = build()
        cut = model.layers[position].name
        specs = tf_spectrain.partition.describe_stages(model, [cut])
        pipe = tf_spectrain.PipelineModel(model, cuts=[cut], devices=devices, mode="sync")
        got, error, off = _pipeline_step(pipe, x, y, expected, initial)
        rows.append(
            {
                "position": position,
                "cut": cut,
                "crossing": len(specs[1].input_shapes),
                "relative_error": error,
                "variables_off": off,
                "variables": len(got),
                "keras_sensitivity": (
                    cut_sensitivity(build, x, y, position) if diagnostics else None),
                "keras_eager": keras_eager,
                "relu_flips": relu_flips(build, x, y, position, devices) if diagnostics else None,
            }
        )
    return rows


def auto_row(build, x, y, num_stages, devices):
    """One sync step of a `cuts="auto"` pipeline of `num_stages` against Keras' `fit`.

    Args:
        build: a function returning a fresh, identically initialised Keras model.
        x, y: one mini-batch.
        num_stages: the pipeline's stages.
        devices: at least `num_stages` device names.

    Returns:
        A dict with `cuts` (the planned ones), `crossing` (tensors crossing each cut),
        `relative_error`, `variables_off`, `variables`, `planning_seconds` and
        `keras_eager` (as in `sweep`).
    """

    import tf_spectrain

    initial, expected = _keras_step(build, x, y)
    model = build()
    pipe = tf_spectrain.PipelineModel(
        model, devices=devices[:num_stages], mode="sync", profile_batch_size=len(x)
    )
    specs = tf_spectrain.partition.describe_stages(model, pipe.cuts)
    got, error, off = _pipeline_step(pipe, x, y, expected, initial)
    return {
        "cuts": pipe.cuts,
        "crossing": [len(spec.input_shapes) for spec in specs[1:]],
        "relative_error": error,
        "variables_off": off,
        "variables": len(got),
        "planning_seconds": pipe.partition_plan.profile_seconds,
        "keras_eager": keras_eager_error(build, x, y, reference=(initial, expected)),
    }


AUTO_HEADER = (
    "| model | planned cuts (tensors crossing) | relative error | variables off "
    "| Keras' fit, run eagerly | planning (s) |\n|---|---|---|---|---|---|"
)


def _without_dropout(model):
    """`model` with every Dropout layer's rate set to 0 (see `MODELS`)."""
    import keras

    for layer in model.layers:
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    return model


def _cell(value, fmt):
    return "-" if value is None else format(value, fmt)


HEADER = (
    "| model | cut after (position, name) | tensors crossing | relative error "
    "| variables off | Keras' own gradient, crossing tensors moved by 1e-6 "
    "| Keras' fit, run eagerly | ReLU inputs of the other sign |\n"
    "|---|---|---|---|---|---|---|---|"
)


def per_model_processes(argv, args):
    """Runs each model in a fresh process (a sweep's memory grows with every build)."""
    print(f"{args.dtype}, batch {args.batch_size}, seed {args.seed}")
    print(AUTO_HEADER if args.auto else HEADER, flush=True)
    status = 0
    for name in args.models:
        cmd, env = common.child_command(
            "benchmarks.sync_gradient", [*argv, "--models", name, "--no-header"]
        )
        status = max(status, subprocess.run(cmd, env=env, check=False).returncode)
    return status


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if len(args.models) > 1:
        return per_model_processes(argv, args)
    devices = common.prepare_tensorflow(max(2, args.auto or 2))
    import keras
    import numpy as np

    keras.config.set_floatx(args.dtype)
    keras.config.set_dtype_policy(args.dtype)  # a cached global policy would win over floatx
    float32 = args.dtype == "float32"
    worst = 0.0
    if not args.no_header:
        print(f"{args.dtype}, batch {args.batch_size}, seed {args.seed}")
        print(AUTO_HEADER if args.auto else HEADER)
    for name in args.models:
        size = MODELS[name]
        application = getattr(keras.applications, name)

        def build(application=application, size=size):
            keras.utils.set_random_seed(args.seed)
            return _without_dropout(
                application(weights=None, input_shape=(size, size, 3), classes=10)
            )

        rng = np.random.default_rng(args.seed)
        x = rng.normal(size=(args.batch_size, size, size, 3)).astype(args.dtype)
        y = np.arange(args.batch_size) % 10
        if args.auto:
            row = dict(auto_row(build, x, y, args.auto, devices), model=name)
            worst = max(worst, row["relative_error"])
            mark = " **over**" if row["relative_error"] > args.tolerance else ""
            cuts = ", ".join(f"{c} ({n})" for c, n in zip(row["cuts"], row["crossing"]))
            print(
                f"| {name} | {cuts} | {row['relative_error']:.2e}{mark} | "
                f"{row['variables_off']} of {row['variables']} | {row['keras_eager']:.2e} | "
                f"{row['planning_seconds']:.1f} |",
                flush=True,
            )
            if args.out:
                common.append_jsonl(args.out, row)
            continue
        positions = args.positions or evenly_spaced(range(1, len(build().layers) - 1), args.cuts)
        for row in sweep(build, x, y, positions, devices, diagnostics=float32):
            row["model"] = name
            worst = max(worst, row["relative_error"])
            mark = " **over**" if row["relative_error"] > args.tolerance else ""
            print(
                f"| {name} | {row['position']} {row['cut']} | {row['crossing']} | "
                f"{row['relative_error']:.2e}{mark} | {row['variables_off']} of "
                f"{row['variables']} | {_cell(row['keras_sensitivity'], '.2e')} | "
                f"{row['keras_eager']:.2e} | {_cell(row['relu_flips'], 'd')} |",
                flush=True,
            )
            if args.out:
                common.append_jsonl(args.out, row)
    print(f"worst relative error {worst:.2e} (tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
