"""Shared pieces of the accuracy and prediction benchmarks.

- `vgg_narrow`: the VGG16 layer pattern with narrow widths, fast enough for a 2-core CPU.
- `layer_costs` / `balanced_cuts`: cut points balanced by a multiply-accumulate estimate.
- `RunSpec` and `train_run`: one training run (any mode) on the embedded digits set, with
  the test accuracy and training loss of every epoch.
- `summarise`, `markdown_table`: statistics over seeds and the tables of docs/RESULTS.md.

TensorFlow is imported lazily (inside functions), so that a script can parse its arguments
and call `tf_spectrain.setup_devices` before any TensorFlow op.
"""

import dataclasses
import json
import math
import os
import statistics
import time

PIPELINE_MODES = ("sync", "vanilla", "stash", "spectrain")
BASELINE_MODES = ("single", "dp")

# The configurations the benchmarks compare: label -> (mode, spectrain target).
CONFIGS = {
    "single": ("single", "paper"),
    "dp": ("dp", "paper"),
    "sync": ("sync", "paper"),
    "vanilla": ("vanilla", "paper"),
    "stash": ("stash", "paper"),
    "spectrain-paper": ("spectrain", "paper"),
    "spectrain-consistent": ("spectrain", "consistent"),
}

# VGG16's filters per convolution in each block, and its fully connected width.
_VGG16_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
_VGG16_FC = 512

DATASET = "digits"


def quiet_tensorflow():
    """Silences TensorFlow's C++ log lines (call before importing TensorFlow)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def setup_devices(n):
    """Splits the CPU (or GPUs) into `n` logical devices, without the warning.

    Args:
        n: the number of devices, an int >= 1.

    Returns:
        The list of device names from `tf_spectrain.setup_devices`.
    """
    import warnings

    import tf_spectrain

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf_spectrain.setup_devices(n)


# --- models ------------------------------------------------------------------------------


def vgg_narrow(input_shape, num_classes, divisor=8):
    """Builds the VGG16 layer pattern with every width divided by `divisor`.

    Thirteen 3x3 convolutions (no bias, each followed by BatchNorm and ReLU) in five blocks
    with a 2x2 max-pool after each, then `flatten`, `fc1`, `fc2` (ReLU) and `predictions`.
    Layer names are VGG16's (`block3_conv2`, `block3_bn2`, `block3_relu2`, `block3_pool`).

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: the number of classes.
        divisor: an int >= 1 that divides every filter count and the dense width
            (8: 8 to 64 filters, 64 dense units).

    Returns:
        A functional `keras.Model` named `vgg16_div<divisor>` that outputs logits.

    Raises:
        ValueError: if `divisor` is not an int >= 1.
    """
    import keras
    from keras import layers

    from tf_spectrain.models.common import batch_norm

    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 1:
        raise ValueError(f"`divisor` must be an int >= 1. Received: divisor={divisor!r}")
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = inputs
    for block, filters in enumerate(_VGG16_BLOCKS, start=1):
        for conv, width in enumerate(filters, start=1):
            x = layers.Conv2D(
                max(1, width // divisor), 3, padding="same", use_bias=False,
                name=f"block{block}_conv{conv}",
            )(x)
            x = batch_norm(f"block{block}_bn{conv}")(x)
            x = layers.Activation("relu", name=f"block{block}_relu{conv}")(x)
        x = layers.MaxPooling2D(2, name=f"block{block}_pool")(x)
    x = layers.Flatten(name="flatten")(x)
    units = max(1, _VGG16_FC // divisor)
    x = layers.Dense(units, activation="relu", name="fc1")(x)
    x = layers.Dense(units, activation="relu", name="fc2")(x)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(inputs, outputs, name=f"vgg16_div{divisor}")


def narrow_resnet(input_shape, num_classes):
    """ResNet-20's layout (3 stages of 3 basic blocks) with half its widths (8, 16, 32)."""
    from tf_spectrain.models import resnet

    saved = resnet.CIFAR_STAGE_FILTERS
    resnet.CIFAR_STAGE_FILTERS = (8, 16, 32)
    try:
        return resnet.cifar_resnet(input_shape, num_classes, 3, name="resnet20_half")
    finally:
        resnet.CIFAR_STAGE_FILTERS = saved


def build_model(name, input_shape=(32, 32, 3), num_classes=10):
    """Builds a benchmark model by name.

    Args:
        name: `"vgg"` (`vgg_narrow`, widths / 8), `"resnet20"` (the zoo's ResNet-20) or
            `"resnet20_half"` (`narrow_resnet`).
        input_shape: one image's shape.
        num_classes: the number of classes.

    Returns:
        A functional `keras.Model` that outputs logits.

    Raises:
        ValueError: for an unknown name.
    """
    if name == "vgg":
        return vgg_narrow(input_shape, num_classes)
    if name == "resnet20_half":
        return narrow_resnet(input_shape, num_classes)
    if name == "resnet20":
        import tf_spectrain

        return tf_spectrain.models.get_model("resnet20", input_shape, num_classes)
    raise ValueError(
        f"`model` must be one of {list(MODEL_NAMES)}. Received: model={name!r}"
    )


MODEL_NAMES = ("vgg", "resnet20", "resnet20_half")


# --- balanced cuts -----------------------------------------------------------------------


def _size(shape):
    return math.prod(int(d) for d in shape[1:])


def layer_costs(model):
    """A per-layer compute estimate, in multiply-accumulates per example.

    Convolutions and dense layers count `outputs * fan_in`; every other layer counts a few
    operations per output element (BatchNorm 4, others 1), which matters for narrow
    networks, where those layers take a visible share of the time.

    Args:
        model: a functional `keras.Model`.

    Returns:
        `(names, costs, allowed)`: the layer names in graph order, their costs, and the
        positions after which exactly one tensor crosses (where a stage may end).
    """
    import keras

    from tf_spectrain.partition.graph import read_graph

    graph = read_graph(model)
    costs = []
    for call in graph.calls:
        op = call.operation
        out = sum(_size(t.shape) for t in call.outputs)
        if isinstance(op, keras.layers.Conv2D):
            fan_in = op.kernel_size[0] * op.kernel_size[1] * int(call.inputs[0].shape[-1])
            costs.append(out * fan_in)
        elif isinstance(op, keras.layers.Dense):
            costs.append(out * int(call.inputs[0].shape[-1]))
        elif isinstance(op, keras.layers.BatchNormalization):
            costs.append(4 * out)
        else:
            costs.append(out)
    last = len(graph.calls) - 1
    allowed = [p for p in range(last) if len(graph.crossing(p)) == 1]
    return graph.names, costs, allowed


def balanced_cuts(model, num_stages):
    """Cut layers that balance `layer_costs` over `num_stages` stages.

    Args:
        model: a functional `keras.Model`.
        num_stages: an int >= 1.

    Returns:
        `(cuts, shares)`: the cut layer names, and each stage's share of the total cost.
    """
    from tf_spectrain.partition import plan_cuts

    names, costs, allowed = layer_costs(model)
    positions = plan_cuts(costs, num_stages, allowed)
    bounds = [-1] + positions + [len(costs) - 1]
    total = float(sum(costs))
    shares = [sum(costs[a + 1 : b + 1]) / total for a, b in zip(bounds, bounds[1:])]
    return [names[p] for p in positions], shares


# --- one training run --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run of a benchmark grid.

    Attributes:
        model: a name of `MODEL_NAMES`.
        config: a label of `CONFIGS` (mode and SpecTrain target).
        stages: pipeline stages (for `dp`: replicas; ignored by `single`).
        lr: the learning rate of momentum SGD.
        seed: weights and data order.
        epochs: training epochs.
        batch_size: mini-batch size.
        limit: use only the first `limit` training examples (None: all).
        momentum: SGD momentum.
        weight_decay: Keras' weight decay (0: none).
    """

    model: str
    config: str
    stages: int
    lr: float
    seed: int
    epochs: int
    batch_size: int = 32
    limit: int = None
    momentum: float = 0.9
    weight_decay: float = 5e-4

    @property
    def key(self):
        """A string naming this run, for result files."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def _sgd(spec, cls):
    return cls(
        learning_rate=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay or None
    )


def build_trainer(spec, devices):
    """The compiled trainer of `spec`: a `keras.Model` (single, dp) or a `PipelineModel`.

    Args:
        spec: a `RunSpec`.
        devices: device names; a pipeline or `dp` uses the first `spec.stages`.

    Returns:
        `(trainer, model, cuts)`; `cuts` is None for the baselines.
    """
    import keras
    import tensorflow as tf

    import tf_spectrain

    mode, target = CONFIGS[spec.config]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    keras.utils.set_random_seed(spec.seed)
    if mode in BASELINE_MODES:
        scope = (
            tf.distribute.MirroredStrategy(devices[: spec.stages]).scope()
            if mode == "dp"
            else tf.device(devices[0])
        )
        with scope:
            model = build_model(spec.model)
            model.compile(_sgd(spec, keras.optimizers.SGD), loss, metrics=["accuracy"])
        return model, model, None
    model = build_model(spec.model)
    cuts, _ = balanced_cuts(model, spec.stages)
    pipe = tf_spectrain.PipelineModel(
        model, cuts=cuts, devices=devices[: spec.stages], mode=mode, spectrain_target=target
    )
    pipe.compile(_sgd(spec, tf_spectrain.SpecTrainSGD), loss, metrics=["accuracy"])
    return pipe, model, cuts


def train_run(spec, devices, callbacks=None):
    """Trains `spec` on digits and returns its learning curve.

    The training batches of epoch `e` depend only on `(spec.seed, e)`
    (`tf_spectrain.data.load_epochs`, with the standard random crop), so every mode sees
    the same data in the same order. The test set is evaluated after every epoch.

    Args:
        spec: a `RunSpec`.
        devices: device names (at least `spec.stages`).
        callbacks: extra Keras callbacks (e.g. `Telemetry`).

    Returns:
        A dict: `test_accuracy` and `train_loss` (lists, one value per epoch; NaN after a
        non-finite loss stopped training), `seconds`, `cuts` and `diverged` (bool).
    """
    import keras

    from tf_spectrain import data
    from tf_spectrain.pipeline_model import NonFiniteLossError

    keras.backend.clear_session()
    trainer, _, cuts = build_trainer(spec, devices)
    train = data.load_epochs(
        DATASET, spec.batch_size, epochs=spec.epochs, seed=spec.seed, limit=spec.limit
    )
    steps = data.steps_per_epoch(DATASET, spec.batch_size, spec.limit)
    x_test, y_test = data.load_arrays(DATASET, "test")
    history = keras.callbacks.History()
    stop = keras.callbacks.TerminateOnNaN()
    started = time.perf_counter()
    diverged = False
    try:
        trainer.fit(
            train,
            epochs=spec.epochs,
            steps_per_epoch=steps,
            validation_data=(x_test, y_test),
            verbose=0,
            callbacks=[history, stop] + list(callbacks or []),
        )
    except NonFiniteLossError:
        diverged = True
    seconds = time.perf_counter() - started
    acc = [float(a) for a in history.history.get("val_accuracy", [])]
    loss = [float(v) for v in history.history.get("loss", [])]
    diverged = diverged or len(acc) < spec.epochs or not all(map(math.isfinite, loss))
    # A diverged run is reported at chance level from the failing epoch on.
    acc += [float("nan")] * (spec.epochs - len(acc))
    loss += [float("nan")] * (spec.epochs - len(loss))
    return {
        "test_accuracy": acc,
        "train_loss": loss,
        "seconds": seconds,
        "cuts": cuts,
        "diverged": diverged,
    }


# --- results -----------------------------------------------------------------------------


def read_jsonl(path):
    """The records of a JSON-lines file (an empty list if it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def append_jsonl(path, record):
    """Appends one record to a JSON-lines file (flushed, so a killed run keeps it)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def summarise(values):
    """Mean, sample standard deviation, min and max of the finite `values`.

    Args:
        values: numbers; NaN (a diverged run) is counted in `n_nan`, not in the statistics.

    Returns:
        A dict `mean`, `std` (0 for one value), `min`, `max`, `n`, `n_nan`; the
        statistics are NaN when no value is finite.
    """
    finite = [float(v) for v in values if math.isfinite(v)]
    nan = float("nan")
    if not finite:
        return {"mean": nan, "std": nan, "min": nan, "max": nan, "n": 0, "n_nan": len(values)}
    return {
        "mean": statistics.fmean(finite),
        "std": statistics.stdev(finite) if len(finite) > 1 else 0.0,
        "min": min(finite),
        "max": max(finite),
        "n": len(finite),
        "n_nan": len(values) - len(finite),
    }


def markdown_table(header, rows):
    """A GitHub markdown table.

    Args:
        header: the column titles.
        rows: lists of cell strings, each as long as `header`.

    Returns:
        The table as a string (no trailing newline).

    Raises:
        ValueError: if a row's length differs from the header's.
    """
    for row in rows:
        if len(row) != len(header):
            raise ValueError(
                f"Every row must have {len(header)} cells like the header {header}. "
                f"Received: a row of {len(row)}: {row}"
            )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def positive_int(text):
    """argparse type: an int >= 1, with a clear error."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_float(text):
    """argparse type: a finite float > 0, with a clear error."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def csv_of(choices, kind=str):
    """argparse type: a comma-separated list of values, each in `choices` (None: any)."""
    import argparse
    import difflib

    def parse(text):
        items = [kind(t.strip()) for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"must list at least one value, got {text!r}")
        if choices is not None:
            for item in items:
                if item not in choices:
                    close = difflib.get_close_matches(str(item), [str(c) for c in choices], 1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise argparse.ArgumentTypeError(
                        f"{item!r} is not one of {list(choices)}{hint}"
                    )
        return items

    return parse
