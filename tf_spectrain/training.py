"""One training run as `train.py` does it: devices, data, model, fit, evaluate.

`prepare(config)` sets up devices, data and the model (raising `ValueError` for input that
only the model can check, such as `--cuts`, before any training), and `train(run)` fits
and evaluates. `config` holds the checked flags of `train.py` (an `argparse.Namespace` or
any object with the same attributes). Modes:

- `single`: the whole model on the first device, plain `model.fit`.
- `dp`: data parallelism over all devices with `tf.distribute.MirroredStrategy`, the
  baseline the SpecTrain paper compares against (each step all-reduces every gradient).
- `sync`, `vanilla`, `stash`, `spectrain`: a pipeline of `--gpus` stages
  (`tf_spectrain.PipelineModel`), see SPECTRAIN.md.
"""

import dataclasses
import time
import warnings

import keras
import tensorflow as tf

from tf_spectrain import data, devices, models, modes, partition
from tf_spectrain.optimizer import SpecTrainSGD
from tf_spectrain.pipeline_model import PipelineModel



def make_sgd(config, cls=keras.optimizers.SGD):
    """Momentum SGD with the run's learning rate, momentum and weight decay."""
    return cls(
        learning_rate=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay or None,
    )


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class _ThroughputMeter(keras.callbacks.Callback):
    """Training images per second, timed over the training part of each epoch.

    The clock stops at the last training batch, so validation is not counted.
    """

    def __init__(self, images_per_epoch):
        super().__init__()
        self.images_per_epoch = images_per_epoch
        self.images = 0
        self.seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._last = self._start

    def on_train_batch_end(self, batch, logs=None):
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds += self._last - self._start
        self.images += self.images_per_epoch

    @property
    def images_per_second(self):
        return self.images / self.seconds if self.seconds else 0.0


@dataclasses.dataclass
class Run:
    """Everything `prepare` set up for `train`."""

    config: object
    device_names: list
    model: keras.Model
    trainer: object  # the compiled keras.Model (baselines) or PipelineModel
    train_ds: tf.data.Dataset
    test_ds: tf.data.Dataset
    num_train: int
    started: float


def prepare(config):
    """Sets up devices, data and the compiled model or pipeline described by `config`.

    Raises:
        ValueError, TypeError: for input that can only be checked against the model
            (`--cuts`), before any training.
    """
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        device_names = devices.setup_devices(config.gpus)
    keras.utils.set_random_seed(config.seed)
    info = data.get_info(config.dataset)
    common = dict(
        batch_size=config.batch_size,
        data_dir=config.data_dir,
        download=config.download,
        limit=config.limit,
    )
    train_ds = data.load(config.dataset, "train", seed=config.seed, **common)
    test_ds = data.load(config.dataset, "test", **common)
    num_train = info.num_train if config.limit is None else min(config.limit, info.num_train)

    last_batch = num_train % config.batch_size
    if 0 < last_batch < config.micro_batches:
        raise ValueError(
            f"The last mini-batch of an epoch has {last_batch} examples ({num_train} training "
            f"examples, --batch-size {config.batch_size}), fewer than --micro-batches "
            f"{config.micro_batches}: it cannot be split. Choose a batch size that leaves no "
            "remainder or a larger one, or fewer micro-batches."
        )
    if config.mode in modes.MODES:
        model = models.get_model(config.model, info.image_shape, info.num_classes)
        cuts = config.cuts
        if cuts is None:
            cuts = partition.default_cuts(model, config.gpus)
        elif len(cuts) + 1 != config.gpus:
            raise ValueError(
                f"--cuts names {len(cuts)} layers, which makes {len(cuts) + 1} stages, but "
                f"--gpus is {config.gpus}: give {config.gpus - 1} cut layers (one stage per "
                f"device). Received: --cuts {','.join(cuts)}"
            )
        trainer = PipelineModel(
            model,
            cuts=cuts,
            devices=device_names,
            mode=config.mode,
            spectrain_target=config.spectrain_target,
            micro_batches=config.micro_batches,
        )
        trainer.compile(optimizer=make_sgd(config, SpecTrainSGD), loss=_loss(), metrics=["accuracy"])
    else:
        scope = (
            tf.distribute.MirroredStrategy(device_names).scope()
            if config.mode == "dp"
            else tf.device(device_names[0])
        )
        with scope:
            model = models.get_model(config.model, info.image_shape, info.num_classes)
            model.compile(optimizer=make_sgd(config), loss=_loss(), metrics=["accuracy"])
        trainer = model
    return Run(config, device_names, model, trainer, train_ds, test_ds, num_train, started)


def describe(run):
    """One line saying what will be trained where, e.g. the pipeline's stages and cuts."""
    config = run.config
    what = f"{config.model} on {config.dataset} ({run.num_train} training images)"
    if isinstance(run.trainer, PipelineModel):
        pipe = run.trainer
        return (
            f"{what}: {config.mode} pipeline of {pipe.num_stages} stages on "
            f"{', '.join(pipe.devices)}, cut after {', '.join(pipe.cuts) or 'nothing'}"
        )
    where = ", ".join(run.device_names) if config.mode == "dp" else run.device_names[0]
    return f"{what}: {config.mode} on {where}"


def train(run):
    """Fits and evaluates a prepared run; returns a summary dict.

    Returns:
        A dict with `test_accuracy`, `test_loss`, `images_per_second`, `wall_time` (s,
        from the start of `prepare`), `history` (the Keras history dict), `devices`,
        `model` (the trained Keras model) and, for pipelines, `cuts`.
    """
    config = run.config
    meter = _ThroughputMeter(run.num_train)
    history = run.trainer.fit(
        run.train_ds,
        epochs=config.epochs,
        shuffle=False,  # the training dataset is already shuffled, seeded
        validation_data=run.test_ds,
        callbacks=[meter, keras.callbacks.TensorBoard(config.logdir)],
        verbose=getattr(config, "verbose", "auto"),
    )
    test_loss, test_accuracy = run.trainer.evaluate(run.test_ds, verbose=0)
    result = {
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "images_per_second": meter.images_per_second,
        "wall_time": time.perf_counter() - run.started,
        "history": history.history,
        "devices": run.device_names,
        "model": run.model,
    }
    if isinstance(run.trainer, PipelineModel):
        result["cuts"] = run.trainer.cuts
    return result


def run(config):
    """`prepare` then `train`: one whole run of `train.py`."""
    return train(prepare(config))
