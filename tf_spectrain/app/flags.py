"""The flags of `train.py`: one `argparse` parser, one flag per `RunConfig` field.

Each flag's default is the field's (`DEFAULTS`), and its checks are `RunConfig`'s: the
parser only reads the values. The flags are added in groups (the model and its devices, the
pipeline, the data, the training, the logs, the checkpoints), in the order `--help` lists
them.
"""

import argparse
import dataclasses

from tf_spectrain.app.config import RunConfig
from tf_spectrain.app.config_checks import flag
from tf_spectrain.app.trainers import NESTEROV_OPTIMIZERS

DEFAULTS = {field.name: field.default for field in dataclasses.fields(RunConfig)}
MODE_HELP = (
    "pipelines of --gpus stages: spectrain (SpecTrain weight prediction), stash (PipeDream "
    "weight stashing), vanilla (naive, stale), sync (sequential SGD; GPipe or 1F1B-flush "
    "with --micro-batches), nesterov (weight stashing, each stage's optimizer in its "
    "Nesterov form with the momentum raised by the stage's delay; --optimizer "
    f"{' or '.join(NESTEROV_OPTIMIZERS)}), 2bw (PipeDream-2BW: weight stashing, one update "
    "per --accumulate mini-batches, at most two weight versions per stage); baselines: "
    "single (one device), dp (data parallelism with tf.distribute.MirroredStrategy; over "
    "--cluster, a copy of the model on each worker device, the pipeline's replicas of one "
    "stage)"
)


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default in its help, unless it is None (the help then says it)."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def build_parser():
    """Returns the `argparse.ArgumentParser` of `train.py` (defaults: `RunConfig`'s)."""
    p = argparse.ArgumentParser(
        prog="train.py",
        allow_abbrev=False,  # "--epoch 3" must not silently mean --epochs
        description=(
            "Train a Keras model on several devices. Without GPUs the CPU is split into "
            "logical devices, so every mode runs anywhere."
        ),
        formatter_class=_DefaultsFormatter,
    )

    def add(name, **kwargs):
        """Adds the flag of field `name` with the field's default (switches default off)."""
        if kwargs.get("action") != "store_true":
            kwargs["default"] = DEFAULTS[name]
        p.add_argument(flag(name), **kwargs)

    for add_group in FLAG_GROUPS:
        add_group(add)
    return p


def repeated_flags(argv):
    """Finds the flags given more than once in `argv` (argparse would keep the last one).

    Args:
        argv: the command-line arguments after the program name; both `--flag value` and
            `--flag=value` count.

    Returns:
        The repeated flags (e.g. `["--epochs"]`), each once, in the order of their second use.
    """
    seen, repeated = set(), []
    options = {flag(name) for name in DEFAULTS}  # build_parser adds one flag per field
    for item in argv:
        option = item.split("=", 1)[0]
        if option in options:
            if option in seen and option not in repeated:
                repeated.append(option)
            seen.add(option)
    return repeated


def _add_devices(add):
    """Adds the model and the devices it trains on: --model, --gpus, --cluster, --gpus-per-host,
    --trainer-address."""
    add("model", help="model builder (see --help for the list)")
    add("gpus", type=int, help="number of devices to use (4 when neither --gpus nor "
        "--cluster is given)")
    add("cluster", help="train on worker processes (`python -m tf_spectrain.app.worker`) at "
        "these addresses h0:p0,h1:p1,...: the stages are every worker's devices in order, "
        "worker 0's first; 'TF_CONFIG' reads the cluster from that environment variable "
        "(the trainer is then its chief, or holds no slot)")
    add("gpus_per_host", type=int, help="with --cluster: the devices of each worker that "
        "hold stages (its GPUs, or on a CPU-only worker its logical CPU devices, see the "
        "worker's --cpu-devices); 1 when not given")
    add("trainer_address", help="with --cluster: 'host' or 'host:port', this host's address "
        "that the workers reach the trainer at (default: the address this host's route to "
        "the workers leaves from; TensorFlow's localhost when every worker is on loopback)")


def _add_pipeline(add):
    """Adds the mode and the pipeline's shape: cuts, weight prediction, micro-batches, replicas."""
    add("mode", help=MODE_HELP)
    add(
        "cuts",
        type=_comma_list,
        help="'auto' (the default: cuts planned from each layer's measured time, the plan "
        "printed before training) or comma-separated layer names, each ending a stage "
        "(--gpus - 1 of them)",
    )
    add(
        "spectrain_target",
        help="spectrain: 'paper' (the paper's version gaps) or 'consistent' (one "
        "prediction per mini-batch, reused by the backward)",
    )
    add(
        "micro_batches",
        type=int,
        help="micro-batches per mini-batch, in every pipeline mode (must divide "
        "--batch-size): each stage runs them back to back and updates once per mini-batch",
    )
    add(
        "schedule",
        help="sync mode: the order of a mini-batch's micro-batches: 'gpipe' (all forwards, "
        "then all backwards) or '1f1b' (1F1B-flush: stage k keeps at most --gpus - k "
        "micro-batches' activations); the same result",
    )
    add(
        "recompute",
        help="'auto' (recompute a stage's forward in its backward only where the weights "
        "differ) or 'always' (keep only each stage's inputs and recompute in every "
        "backward: less memory, one more forward; the same result)",
    )
    add(
        "replicas",
        type=int,
        help="copies of the pipeline (data x pipeline): the devices form --replicas "
        "pipelines of devices / replicas stages, each mini-batch is split evenly across "
        "them and each stage's gradients are summed over its copies before every update",
    )
    add(
        "accumulate",
        type=int,
        help="--mode 2bw: mini-batches per update (their mean gradient is applied once per "
        "ACCUMULATE mini-batches, and at each epoch's end); at least the number of stages, "
        "which is the default",
    )
    add(
        "stall_timeout",
        type=float,
        help="seconds in which some stage must finish a pass; otherwise training stops with "
        "an error saying where each stage is and what it waits for (0: never stop)",
    )
    add(
        "memory_limit",
        help="memory each device may use, e.g. 16GiB, 512MiB, 1.5GB or bytes: --cuts auto "
        "then plans only cuts whose stages fit it (and their device's memory); with --plan, "
        "every stage is checked against it",
    )
    add(
        "plan",
        action="store_true",
        help="print the plan and exit without training: the cuts (given ones priced, "
        "'auto' planned as training plans them; pass the printed --cuts to train that "
        "very plan), each stage's predicted time and memory (weights, optimizer "
        "slots, activations in flight, stashed weights) against its device's memory and "
        "--memory-limit; exit code 3 when a stage would not fit (2: bad flags)",
    )


def _add_data(add):
    """Adds the dataset's flags: --dataset, --data-dir, --download."""
    add("dataset", help="dataset name; when not given, digits for image models and pydoc "
        "for transformer_lm (the text classifiers need one, e.g. imdb_reviews)")
    add("data_dir", help="tensorflow-datasets data dir")
    add(
        "download",
        action="store_true",
        help="allow tensorflow-datasets to download and prepare the dataset (needs network)",
    )


def _add_training(add):
    """Adds the training's flags: epochs, batch size, optimizer, precision, seed, --limit."""
    add("epochs", type=int, help="training epochs")
    add("batch_size", type=int, help="mini-batch size (global)")
    add("optimizer", help="'sgd' (momentum SGD; the default for image models) or 'adamw' "
        "(the default for text models); in spectrain mode either predicts the weights from "
        "its own next update (docs/SPECTRAIN.md section 6c); in nesterov mode each stage "
        "runs its Nesterov form (sgd: SGD with nesterov=True; adamw: NAdam), the momentum "
        "(or beta_1) raised by the stage's delay (section 6e)")
    add("lr", type=float, help="learning rate (default: 0.01 with sgd, 0.001 with adamw)")
    add("momentum", type=float, help="SGD momentum (sgd only)")
    add("weight_decay", type=float,
        help="decoupled weight decay, 0: none (default: 5e-4 with sgd, 0.01 with adamw)")
    add("precision", help="Keras dtype policy of the model: float32, mixed_bfloat16 or "
        "mixed_float16 (float16 compute with dynamic loss scaling); variables stay float32")
    add("seed", type=int, help="random seed (weights, data order)")
    add("limit", type=int, help="use only the first LIMIT examples of each split (quick runs)")


def _add_logging(add):
    """Adds the logs' flags: TensorBoard dir, per-step scalars, prediction errors, graph calls."""
    add(
        "logdir",
        help="TensorBoard log dir (default: runs/<model>-<mode>-<timestamp>; with --resume "
        "and --checkpoint-dir: the checkpoint dir's parent)",
    )
    add(
        "log_every",
        type=_auto_or_int,
        help="write per-step scalars every N mini-batches; 'auto' keeps logging under 2%% "
        "of the training time",
    )
    add(
        "prediction_every",
        type=int,
        help="pipelines: measure the weight prediction error (staleness) on every Nth "
        "mini-batch of each epoch, on every stage; 0 turns it off",
    )
    add(
        "steps_per_execution",
        type=_auto_or_int,
        help="mini-batches per graph call (Keras' compile argument): pipelines run every "
        "stage's passes of that many in one TensorFlow graph, with per-step logs and "
        "callbacks once per call; 'auto' is 8 where the stages are GPUs (1 for a run of "
        "fewer than 64 mini-batches in all), 1 on the CPUs "
        "of workers (--cluster), and pass by pass (as --run-eagerly) on a CPU-only "
        "machine, whose passes are long",
    )
    add(
        "run_eagerly",
        action="store_true",
        help="Keras' compile argument: pipelines run pass by pass, each pass its own call "
        "(slower; an error names its stage, pass and mini-batch)",
    )
    add("graph", action="store_true", help="also write the model graph to TensorBoard")
    add("histograms", action="store_true", help="also write weight histograms every epoch")
    add(
        "trace",
        action="store_true",
        help="pipelines: write each epoch's passes, stage by stage, as a trace "
        "(<logdir>/trace/trace_epoch_<e>.json; open it in https://ui.perfetto.dev); windows "
        "then also time each pass",
    )


def _add_checkpoints(add):
    """Adds the flags of checkpoints, resuming, non-finite losses and the exported model."""
    add(
        "checkpoint_dir",
        help="where to save a checkpoint at every epoch end and on SIGINT/SIGTERM "
        "(default: <logdir>/checkpoints)",
    )
    add(
        "keep_checkpoints",
        type=int,
        help="how many of the newest checkpoints to keep; 0 saves none",
    )
    add(
        "resume",
        action="store_true",
        help="continue from the newest checkpoint in --checkpoint-dir (or <logdir>/checkpoints)",
    )
    add(
        "on_nan",
        help="a non-finite loss: 'stop' (say where it came from; keep the last good "
        "checkpoint) or 'skip' (pipelines: leave out updates whose gradient is not finite)",
    )
    add(
        "export",
        help="save the trained model here as a .keras file (default: <logdir>/model.keras; "
        "'none' to skip)",
    )


FLAG_GROUPS = (_add_devices, _add_pipeline, _add_data, _add_training, _add_logging,
               _add_checkpoints)
"""The groups of flags, in `--help`'s order."""


def _auto_or_int(text):
    """Reads `--log-every`-like values: 'auto' or an integer."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer; got {text!r}") from None


def _comma_list(text):
    """Reads `--cuts`: 'auto' or comma-separated layer names, as a list."""
    if text.strip() == "auto":
        return "auto"
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer names such as block2_pool,block3_pool; got {text!r}"
        )
    return names
