"""Shared pieces of the accuracy and prediction benchmarks (`accuracy.py`, `prediction.py`).

- `prepare_tensorflow`: quiet logs, one intra-op thread, logical devices; before any op.
- Models for a 2-core CPU: the zoo's `vgg16_narrow` (the VGG16 layer pattern, widths / 8)
  and `resnet20_digits` (ResNet-20 on 16x16 inputs); `build_model` by name.
- `balanced_cuts`: the library's default cuts balanced by compute (`cost="macs"`), with
  each stage's share.
- `RunSpec` and `Runner`: training runs on the embedded digits set (pydoc for the language
  model, a prepared imdb_reviews for the text classifiers); a `Runner` builds one
  trainer per (model, configuration, stages) and reuses it, reset to the run's initial
  weights and a fresh optimizer, for every seed and learning rate (no retracing).
- `summarise`, `markdown_table`, JSON-lines records and argparse types.

TensorFlow is imported inside functions, so a script can parse its arguments and set up
its devices before TensorFlow starts.
"""

import argparse
import dataclasses
import difflib
import json
import math
import os
import statistics
import subprocess
import sys
import time

# The configurations compared: label -> (mode, SpecTrain target).
CONFIGS = {
    "single": ("single", "paper"),
    "dp": ("dp", "paper"),
    "sync": ("sync", "paper"),
    "vanilla": ("vanilla", "paper"),
    "stash": ("stash", "paper"),
    "spectrain-paper": ("spectrain", "paper"),
    "spectrain-consistent": ("spectrain", "consistent"),
    "nesterov": ("nesterov", "paper"),
    "2bw": ("2bw", "paper"),
}
# tf_spectrain.schedule.modes.BASELINES, spelled out: importing tf_spectrain would start TensorFlow
# before a script sets it up (tests/test_benchmarks.py checks that the two agree).
BASELINES = ("single", "dp")

# The repository root: the folder that holds the `benchmarks` package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DATASET = "digits"
NUM_CLASSES = 10
INPUT_SHAPE = (32, 32, 3)
# The language model trains on pydoc (next byte of 128, 256 byte values); the text
# classifiers on imdb_reviews (tf_spectrain.data.catalog's IMDB_SEQ_LEN and
# IMDB_VOCAB_SIZE, spelled out for the same reason as BASELINES); the others on digits.
LM_DATASET, LM_SEQ_LEN, LM_VOCAB = "pydoc", 128, 256
TEXT_MODELS = {"classifier": "transformer_classifier", "lstm": "residual_lstm"}
TEXT_DATASET, TEXT_SEQ_LEN, TEXT_VOCAB, TEXT_CLASSES = "imdb_reviews", 256, 20_000, 2


def dataset_of(model):
    """The dataset a benchmark model trains on: `"pydoc"` for `"lm"`, `"imdb_reviews"` for
    the text classifiers (`TEXT_MODELS`), else digits."""
    if model == "lm":
        return LM_DATASET
    return TEXT_DATASET if model in TEXT_MODELS else DATASET


def num_classes_of(model):
    """The classes a benchmark model predicts (the vocabulary for `"lm"`)."""
    if model == "lm":
        return LM_VOCAB
    return TEXT_CLASSES if model in TEXT_MODELS else NUM_CLASSES

# --- child processes ---------------------------------------------------------------------


def child_command(module, args, env=None):
    """The command and environment that run `python -m <module> <args>` in a child process.

    The repository root comes first on the child's `PYTHONPATH`, so `benchmarks.<name>`
    is found whatever the working directory (as `python -m` from the root finds it).

    Args:
        module: the module to run, e.g. `"benchmarks.accuracy"`.
        args: its command-line arguments (strings).
        env: the child's environment before that change (default: `os.environ`).

    Returns:
        `(cmd, env)` for `subprocess.run` / `subprocess.Popen`.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return [sys.executable, "-m", module, *args], env


def run_json_child(module, args, what, env=None):
    """Runs `python -m <module> <args>` in a fresh process; returns its last line as JSON.

    Args:
        module, args, env: as for `child_command`.
        what: names the measurement in the error, e.g. `"stash"`.

    Returns:
        The object the child printed as JSON on its last line of output.

    Raises:
        RuntimeError: if the child failed; the message ends with its stderr's tail.
    """
    cmd, env = child_command(module, args, env)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- TensorFlow set-up -------------------------------------------------------------------


def prepare_tensorflow(num_devices, intra_op_threads=1):
    """Quiets TensorFlow, sets its intra-op threads and splits the CPU into devices.

    One intra-op thread per op suits these small models: the runs measured here are
    deterministic with it, and faster (the stages' threads, not one op, use the cores).
    If TensorFlow has already started (a test process), its threads stay as they are.

    Args:
        num_devices: logical devices wanted, an int >= 1.
        intra_op_threads: threads per op (0: TensorFlow's default).

    Returns:
        The device names from `tf_spectrain.setup_devices`.
    """
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import tf_spectrain

    if intra_op_threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        except RuntimeError:
            pass  # TensorFlow already runs (e.g. under pytest): keep its threads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf_spectrain.setup_devices(num_devices)


# --- models ------------------------------------------------------------------------------


def resnet20_digits(input_shape, num_classes):
    """ResNet-20 (He et al.'s CIFAR layout and widths) on images halved to 16x16.

    `downsample` (2x2 average pooling) comes first; then the layers of
    `tf_spectrain.models`' `resnet20`, with its names (`conv1`, `stage2_block1_out`,
    `avg_pool`, `predictions`). The digits are 8x8 images upscaled to 32x32, so halving
    loses nothing, and a step costs 0.07 s instead of 0.26 s on this CPU.

    Args:
        input_shape: `(height, width, channels)`, height and width >= 32.
        num_classes: the number of classes.

    Returns:
        A functional `keras.Model` named `resnet20_digits` that outputs logits.
    """
    from tf_spectrain.models import resnet

    return resnet.cifar_resnet(
        input_shape, num_classes, blocks_per_stage=3, name="resnet20_digits", downsample=True
    )


MODEL_NAMES = ("vgg", "resnet20", "small_cnn", "lm") + tuple(TEXT_MODELS)


def build_model(name):
    """Builds a benchmark model by name (for the dataset of `dataset_of(name)`).

    Args:
        name: `"vgg"` (the zoo's `vgg16_narrow`: VGG16 with every width divided by 8),
            `"resnet20"` (`resnet20_digits`), `"small_cnn"` (the zoo's two-block CNN,
            for smoke tests), `"lm"` (the zoo's `transformer_lm`, 4 blocks of width 64,
            for pydoc's bytes), `"classifier"` or `"lstm"` (the zoo's
            `transformer_classifier` and `residual_lstm` with their defaults, 4 blocks of
            width 64, for imdb_reviews).

    Returns:
        A functional `keras.Model` that outputs logits.

    Raises:
        ValueError: for an unknown name.
    """
    if name == "vgg":
        from tf_spectrain import models

        return models.vgg16_narrow(INPUT_SHAPE, NUM_CLASSES)
    if name == "resnet20":
        return resnet20_digits(INPUT_SHAPE, NUM_CLASSES)
    if name == "small_cnn":
        import tf_spectrain

        return tf_spectrain.models.get_model("small_cnn", INPUT_SHAPE, NUM_CLASSES)
    if name == "lm":
        import tf_spectrain

        return tf_spectrain.models.get_model("transformer_lm", (LM_SEQ_LEN,), LM_VOCAB)
    if name in TEXT_MODELS:
        import tf_spectrain

        return tf_spectrain.models.get_model(
            TEXT_MODELS[name], (TEXT_SEQ_LEN,), TEXT_CLASSES, vocab_size=TEXT_VOCAB
        )
    raise ValueError(f"`model` must be one of {list(MODEL_NAMES)}. Received: model={name!r}")


# --- balanced cuts -----------------------------------------------------------------------


def balanced_cuts(model, num_stages):
    """The library's default cuts balanced by compute, and each stage's share of it.

    `tf_spectrain.partition.default_cuts(model, num_stages, by="macs")`: stages of about
    equal multiply-accumulates per example, each with weights to train.

    Args:
        model: a functional `keras.Model`.
        num_stages: an int >= 1.

    Returns:
        `(cuts, shares)`: the cut layer names, and each stage's share of the total
        compute (`tf_spectrain.partition.layer_costs(model, "macs")`).

    Raises:
        ValueError: if the model has too few cut candidates.
    """
    from tf_spectrain import partition

    cuts = partition.default_cuts(model, num_stages, by="macs")
    costs = partition.layer_costs(model, "macs")
    names = list(costs)
    ends = [names.index(c) for c in cuts] + [len(names) - 1]
    starts = [0] + [e + 1 for e in ends[:-1]]
    total = float(sum(costs.values()))
    values = list(costs.values())
    shares = [sum(values[a : b + 1]) / total for a, b in zip(starts, ends, strict=True)]
    return cuts, shares


# --- training runs -----------------------------------------------------------------------


OPTIMIZERS = ("sgd", "adamw")  # trainers.OPTIMIZERS (this module imports no TensorFlow)
_WEIGHT_DECAY = {"sgd": 5e-4, "adamw": 0.01}  # trainers.DEFAULT_WEIGHT_DECAY


def describe_optimizer(optimizer):
    """How a report names the optimizer of `optimizer_settings(optimizer)`."""
    settings = optimizer_settings(optimizer)
    if optimizer == "sgd":
        return f"momentum SGD (0.9), weight decay {settings['weight_decay']:g}"
    return f"AdamW (Keras' defaults), weight decay {settings['weight_decay']:g}"


def optimizer_settings(optimizer):
    """The `RunSpec` fields of `optimizer`: its name and its default weight decay."""
    return dict(optimizer=optimizer, weight_decay=_WEIGHT_DECAY[optimizer])


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run.

    Attributes:
        model: a name of `MODEL_NAMES`.
        config: a label of `CONFIGS` (mode and SpecTrain target).
        stages: pipeline stages; for `dp` the replicas; ignored by `single` (1).
        lr: the learning rate.
        seed: initial weights and data order.
        epochs: training epochs.
        batch_size: mini-batch size.
        limit: only the first `limit` training examples (None: all 1,437).
        momentum: SGD momentum.
        weight_decay: Keras' weight decay (0: none).
        precision: the Keras dtype policy the model trains under (`float32`,
            `mixed_bfloat16`; `trainers.PRECISIONS`).
        optimizer: `"sgd"` (momentum SGD) or `"adamw"` (`trainers.OPTIMIZERS`; spectrain
            predicts with `SpecTrain(AdamW)`, docs/SPECTRAIN.md section 6c).
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
    precision: str = "float32"
    optimizer: str = "sgd"

    @property
    def trainer_key(self):
        """Runs with the same key share one trainer (same graph, same cuts)."""
        key = (self.model, self.config, self.stages)
        if self.precision != "float32":
            key += (self.precision,)
        return key if self.optimizer == "sgd" else key + (self.optimizer,)

    def as_dict(self):
        """The fields as a dict (JSON-ready)."""
        return dataclasses.asdict(self)


def _epoch_clock():
    import keras

    class EpochClock(keras.callbacks.Callback):
        """Wall time of every epoch, evaluation included."""

        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._start)

    return EpochClock()


class Runner:
    """Trains `RunSpec`s on their datasets, building each trainer once and reusing it.

    A trainer (a compiled `keras.Model` for `single`/`dp`, a `PipelineModel` otherwise)
    is built for the first run of its `trainer_key`. Before every run it gets the run's
    initial weights (those a fresh model built after `keras.utils.set_random_seed(seed)`
    has: the same for every configuration), every optimizer variable gets back the value it
    had before any step (momentum, iteration count: 0; NAdam's running product: 1) and the
    learning rate is set. A reused trainer then trains exactly as a
    new one would, without tracing its functions again (`tests/test_benchmarks.py` checks
    this).

    Args:
        devices: the device names (at least as many as the largest `stages`).
        data_dir: the tensorflow-datasets data directory in which `imdb_reviews` is
            prepared (for the text classifiers; see `benchmarks/prepare_imdb.py`); None
            means tfds' default. Never downloads.
        steps_per_execution: the pipelines' `compile(steps_per_execution=...)`: "auto"
            (windows of several mini-batches per graph call) or an int (1: a graph call per
            mini-batch, few window shapes to build). All train the same steps.
    """

    def __init__(self, devices, data_dir=None, steps_per_execution="auto"):
        self.devices = list(devices)
        self.data_dir = data_dir
        self.steps_per_execution = steps_per_execution
        self._trainers = {}
        self._fresh = {}
        self._initial = {}

    def initial_weights(self, model_name, seed):
        """The weights of a fresh `model_name` built with the global seed `seed`."""
        import keras

        key = (model_name, seed)
        if key not in self._initial:
            keras.utils.set_random_seed(seed)
            self._initial[key] = build_model(model_name).get_weights()
        return self._initial[key]

    def _build(self, spec):
        from tf_spectrain import checkpoint
        from tf_spectrain.app import trainers

        mode, target = CONFIGS[spec.config]
        trainer = trainers.build_trainer(
            lambda: build_model(spec.model),
            mode,
            self.devices[: spec.stages],
            learning_rate=spec.lr,
            optimizer=spec.optimizer,
            momentum=spec.momentum,
            weight_decay=spec.weight_decay,
            cuts=lambda model: balanced_cuts(model, spec.stages)[0],
            spectrain_target=target,
            metrics=["accuracy"],
            precision=spec.precision,
            steps_per_execution=self.steps_per_execution,
        )
        cuts = None if mode in BASELINES else trainer.cuts
        optimizers = checkpoint.trainer_optimizers(trainer)
        # Each optimizer variable's value before any step (not always 0: NAdam's running
        # product of its momentum schedule starts at 1), for `trainer` to restore.
        self._fresh[spec.trainer_key] = [[v.numpy() for v in o.variables] for o in optimizers]
        return trainer, optimizers, cuts

    def trainer(self, spec):
        """The trainer of `spec`, reset for it: `(trainer, cuts)`."""
        import tensorflow as tf

        from tf_spectrain import checkpoint

        key = spec.trainer_key
        if key not in self._trainers:
            self._trainers[key] = self._build(spec)
        trainer, optimizers, cuts = self._trainers[key]
        model = checkpoint.trainer_model(trainer)
        model.set_weights(self.initial_weights(spec.model, spec.seed))
        for optimizer, fresh in zip(optimizers, self._fresh[key]):
            if len(fresh) != len(optimizer.variables):  # built by its first fit (Keras'): zeros
                fresh = [tf.zeros(v.shape, v.dtype) for v in optimizer.variables]
            for variable, value in zip(optimizer.variables, fresh):
                variable.assign(tf.constant(value, variable.dtype))
            optimizer.learning_rate = spec.lr
        return trainer, cuts

    def run(self, spec, callbacks=None):
        """Trains `spec` and returns its learning curve.

        Every configuration sees the same data: the training batches of epoch `e` depend
        only on `(spec.seed, e)` (`tf_spectrain.data.load_epochs`, random crops included).
        The whole test set is evaluated after every epoch.

        Args:
            spec: a `RunSpec`.
            callbacks: extra Keras callbacks (e.g. `Telemetry`).

        Returns:
            A dict: `test_accuracy`, `test_loss`, `train_loss` (one value per epoch),
            `epoch_seconds`
            (each epoch's wall time, evaluation included), `seconds` (the whole run),
            `cores` (process CPU time / wall time over the run),
            `cuts` (None for the baselines) and `diverged`. A run whose loss became
            non-finite stops; its later epochs are recorded at chance accuracy
            (`1 / NUM_CLASSES`) and NaN loss.
        """
        import keras

        from tf_spectrain import data
        from tf_spectrain.pipeline_model import NonFiniteLossError

        timer = CpuClock().start()  # stopped once training and evaluation are done
        trainer, cuts = self.trainer(spec)
        # tf.data combines its op seeds with the global seed: fix it for every run.
        keras.utils.set_random_seed(spec.seed)
        dataset = dataset_of(spec.model)
        train = data.load_epochs(
            dataset, spec.batch_size, epochs=spec.epochs, seed=spec.seed, limit=spec.limit,
            data_dir=self.data_dir,
        )
        steps = data.steps_per_epoch(dataset, spec.batch_size, spec.limit, self.data_dir)
        x_test, y_test = data.load_arrays(dataset, "test", data_dir=self.data_dir)
        history, clock = keras.callbacks.History(), _epoch_clock()
        diverged = False
        try:
            trainer.fit(
                train, epochs=spec.epochs, steps_per_epoch=steps,
                validation_data=(x_test, y_test), verbose=0, shuffle=False,
                callbacks=[history, clock, keras.callbacks.TerminateOnNaN()]
                + list(callbacks or []),
            )
        except NonFiniteLossError:
            diverged = True
            del self._trainers[spec.trainer_key]  # its pipeline state is not reusable
        timer.stop()
        loss = [float(v) for v in history.history.get("loss", [])]
        acc = [float(a) for a in history.history.get("val_accuracy", [])]
        test_loss = [float(v) for v in history.history.get("val_loss", [])]
        done = 0  # epochs that ended with a finite loss and were evaluated
        while done < min(len(loss), len(acc)) and math.isfinite(loss[done]):
            done += 1
        missing = spec.epochs - done
        chance = 1.0 / num_classes_of(spec.model)
        acc = acc[:done] + [chance] * missing
        test_loss = test_loss[:done] + [float("nan")] * missing
        loss = loss[:done] + [float("nan")] * missing
        return {
            "test_accuracy": acc,
            "test_loss": test_loss,
            "train_loss": loss,
            "epoch_seconds": clock.seconds,
            "seconds": timer.wall,
            "cores": timer.cores,
            "cuts": cuts,
            "diverged": diverged or missing > 0,
        }


# --- timing on synthetic data (throughput.py, speedup.py) -------------------------------


class CpuClock:
    """Times a `with` block (or `start()` to `stop()`): wall seconds, this process' CPU
    seconds, and their ratio.

    `cores` = CPU time / wall time: on this machine's logical devices, about 2 when two
    stages compute at once and 1 when they take turns (or a stall leaves the cores idle),
    so every timing reports it beside its figure. `started` is the `time.perf_counter()`
    of the start.
    """

    def start(self):
        """Starts the clock; returns it."""
        self.started = time.perf_counter()
        self._cpu = time.process_time()
        return self

    def stop(self):
        """Stops the clock: sets `wall`, `cpu` and `cores`; returns it."""
        self.wall = time.perf_counter() - self.started
        self.cpu = time.process_time() - self._cpu
        self.cores = self.cpu / self.wall if self.wall > 0 else 0.0
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def synthetic_images(batch_size, steps):
    """`steps` cached mini-batches of random 32x32x3 images and labels of 10 classes.

    The data come from a NumPy generator seeded with 0: every configuration and every
    process times the same batches.
    """
    import numpy as np
    import tensorflow as tf

    from tf_spectrain.workflow.iterators import without_autotune

    rng = np.random.default_rng(0)
    size = batch_size * steps
    x = rng.normal(size=(size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size).astype("int32")
    # No autotuner: deleting an autotuned iterator can leave the cores idle for seconds at
    # the end of every epoch (tf_spectrain.workflow.iterators), in Keras' fit as in ours.
    return without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).cache())


def window_batches(batch_size, counts):
    """`batches(n)`: the first `n` of the same seeded mini-batches of random 32x32x3 images.

    For timing windows of `n` mini-batches (at most `max(counts)`), as `benchmarks/overlap.py`
    and `benchmarks/hosts.py` time them: NumPy generator seeded with 0, 10 classes, a
    prefetch of 2 and no autotuner (see `synthetic_images`).
    """
    import numpy as np
    import tensorflow as tf

    from tf_spectrain.workflow.iterators import without_autotune

    rng = np.random.default_rng(0)
    b = batch_size
    x = rng.normal(size=(b * max(counts), 32, 32, 3))
    x, y = x.astype("float32"), rng.integers(0, 10, len(x)).astype("int32")

    def batches(n):
        ds = tf.data.Dataset.from_tensor_slices((x[: n * b], y[: n * b]))
        return without_autotune(ds.batch(b).prefetch(2))

    return batches


def batch_clock():
    """A Keras callback that times an epoch mini-batch by mini-batch.

    Its `stamps` get `time.perf_counter()` at the start of the epoch and at the end of
    every mini-batch (for a pipeline: when the mini-batch's loss is known, before the
    drain). Give it to one single-epoch `fit`.
    """
    import keras

    class BatchClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.stamps = []

        def on_epoch_begin(self, epoch, logs=None):
            self.stamps.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())

        def steady(self, batch_size, skip):
            """Images/s from the end of mini-batch `skip` to the end of the last one."""
            batches = len(self.stamps) - 1
            return (batches - skip - 1) * batch_size / (self.stamps[-1] - self.stamps[skip + 1])

        def whole(self, batch_size):
            """Images/s from the start of the epoch to the end of its last mini-batch."""
            batches = len(self.stamps) - 1
            return batches * batch_size / (self.stamps[-1] - self.stamps[0])

    return BatchClock()


# --- records and tables ------------------------------------------------------------------


def read_jsonl(path):
    """The records of a JSON-lines file (an empty list if it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def append_jsonl(path, record):
    """Appends one record to a JSON-lines file, flushed (a killed run keeps it)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def summarise(values):
    """Mean, sample standard deviation, min and max of `values`.

    Args:
        values: numbers; non-finite ones are left out and counted in `n_nan`.

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


def spread(values, fmt):
    """`"median (min-max)"` of `values`, each formatted with `fmt` (one value: itself)."""
    values = sorted(values)
    median = format(statistics.median(values), fmt)
    if len(values) == 1:
        return median
    return f"{median} ({format(values[0], fmt)}-{format(values[-1], fmt)})"


def publish(text, out=None):
    """Prints a benchmark's report and, with `out` (its `--out`), writes it there too."""
    print(text)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def markdown_table(header, rows):
    """A GitHub markdown table.

    Args:
        header: the column titles.
        rows: lists of cells (converted with `str`), each as long as `header`.

    Returns:
        The table as a string, without a trailing newline.

    Raises:
        ValueError: if a row's length differs from the header's.
    """
    for row in rows:
        if len(row) != len(header):
            raise ValueError(
                f"Every row must have {len(header)} cells, like the header {list(header)}. "
                f"Received a row of {len(row)}: {list(row)}"
            )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot with the file-only Agg backend (install the "bench" extra)."""
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit(
            "The plots need matplotlib: pip install -e '.[bench]'"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --- command-line argument types -----------------------------------------------------------


def positive_int(text):
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def non_negative_int(text):
    """argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def csv_of(kind, choices=None):
    """argparse type: a comma-separated list of `kind` values, each in `choices` if given.

    Numbers must be finite and > 0 (learning rates), or >= 0 for ints (seeds).
    """

    def convert(item):
        try:
            value = kind(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a valid {kind.__name__}"
            ) from None
        if kind is float and not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{item!r} must be a finite number > 0")
        if kind is int and value < 0:
            raise argparse.ArgumentTypeError(f"{item!r} must be an integer >= 0")
        if choices is not None and value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], 1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise argparse.ArgumentTypeError(f"{item!r} is not one of {list(choices)}{hint}")
        return value

    def parse(text):
        items = [convert(t.strip()) for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"must list at least one value, got {text!r}")
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"lists a value twice: {text!r}")
        return items

    return parse
