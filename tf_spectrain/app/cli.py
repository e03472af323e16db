"""The `train.py` command line: parse the flags into a checked `RunConfig`, then train.

Flag checks (`tf_spectrain.app.config.RunConfig`) run before TensorFlow initialises; what only
the model can tell (the names in `--cuts`) is checked right after the model is built, still
before any training. Either way bad input exits with code 2 and a message within seconds,
so a typo never costs a run.
"""

import argparse
import dataclasses
import os
import shlex
import signal
import sys
import traceback

from tf_spectrain import checks
from tf_spectrain.app.config import (  # noqa: F401 - MAX_*, ON_NAN, default_logdir: former names
    MAX_DEVICES,
    MAX_SEED,
    ON_NAN,
    ConfigError,
    RunConfig,
    default_logdir,
    flag,
)
from tf_spectrain.schedule import modes

PIPELINE_MODES = modes.PIPELINE_MODES
MODES = modes.ALL_MODES
TARGETS = modes.TARGETS
DEFAULTS = {field.name: field.default for field in dataclasses.fields(RunConfig)}
MODE_HELP = (
    "pipelines of --gpus stages: spectrain (SpecTrain weight prediction), stash (PipeDream "
    "weight stashing), vanilla (naive, stale), sync (sequential SGD; GPipe or 1F1B-flush "
    "with --micro-batches); baselines: single (one device), dp (data parallelism with "
    "tf.distribute.MirroredStrategy)"
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
        if kwargs.get("action") != "store_true":
            kwargs["default"] = DEFAULTS[name]
        p.add_argument(flag(name), **kwargs)

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
    add("dataset", help="dataset name; when not given, digits for image models and pydoc "
        "for transformer_lm (the text classifiers need one, e.g. imdb_reviews)")
    add("data_dir", help="tensorflow-datasets data dir")
    add(
        "download",
        action="store_true",
        help="allow tensorflow-datasets to download and prepare the dataset (needs network)",
    )
    add("epochs", type=int, help="training epochs")
    add("batch_size", type=int, help="mini-batch size (global)")
    add("optimizer", help="'sgd' (momentum SGD; the default for image models) or 'adamw' "
        "(the default for text models); in spectrain mode either predicts the weights from "
        "its own next update (docs/SPECTRAIN.md section 6c)")
    add("lr", type=float, help="learning rate (default: 0.01 with sgd, 0.001 with adamw)")
    add("momentum", type=float, help="SGD momentum (sgd only)")
    add("weight_decay", type=float,
        help="decoupled weight decay, 0: none (default: 5e-4 with sgd, 0.01 with adamw)")
    add("precision", help="Keras dtype policy of the model: float32, mixed_bfloat16 or "
        "mixed_float16 (float16 compute with dynamic loss scaling); variables stay float32")
    add("seed", type=int, help="random seed (weights, data order)")
    add("limit", type=int, help="use only the first LIMIT examples of each split (quick runs)")
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
        "callbacks once per call; 'auto' is 8, or 1 while measuring prediction errors "
        "(--prediction-every > 0)",
    )
    add("graph", action="store_true", help="also write the model graph to TensorBoard")
    add("histograms", action="store_true", help="also write weight histograms every epoch")
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
    return p


def _auto_or_int(text):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer; got {text!r}") from None


def _comma_list(text):
    if text.strip() == "auto":
        return "auto"
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer names such as block2_pool,block3_pool; got {text!r}"
        )
    return names


def check_args(args):
    """The problems of parsed arguments (an `argparse.Namespace`) as a list of messages.

    Args:
        args: the parsed flags, e.g. `build_parser().parse_args(argv)`.

    Returns:
        Every problem `RunConfig` finds, one message each; empty when all is well.
    """
    try:
        RunConfig(**vars(args))
    except ConfigError as e:
        return e.errors
    return []


def _check_writable(config):
    """Creates the output dirs now, so that an unwritable one fails before training."""
    targets = [("--logdir", config.logdir)]
    if config.keep_checkpoints:
        targets.append(("--checkpoint-dir", config.checkpoint_dir))
    if config.export != "none":
        folder = os.path.dirname(os.path.abspath(config.export))
        targets.append(("the folder of --export", folder))
    errors = []
    for name, path in targets:
        try:
            checks.check_writable_dir(name, path)
        except (ValueError, TypeError) as e:
            errors.append(str(e))
    return errors


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


def parse_args(argv=None):
    """Parses and checks `argv` into a `RunConfig` and creates its output directories.

    Args:
        argv: the arguments after the program name; None means `sys.argv[1:]`.

    Returns:
        The checked `RunConfig`, default paths resolved, its output directories created.

    Raises:
        SystemExit: with code 2 on bad input, after printing every error at once.
    """
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    errors = [
        f"{option} was given more than once; give each flag once"
        for option in repeated_flags(argv)
    ]
    try:
        config = RunConfig(**vars(args))
    except ConfigError as e:
        errors += e.errors
    if errors:
        parser.error("\n  ".join(errors))
    errors = _check_writable(config)
    if errors:
        parser.error("\n  ".join(errors))
    return config


def resume_command(argv, config):
    """Builds the command line that continues a run from its newest checkpoint.

    Args:
        argv: the run's arguments after the program name; None means `sys.argv[1:]`.
        config: the run's `RunConfig` (its resolved `logdir` and `checkpoint_dir` are used).

    Returns:
        "python train.py ..." with `argv`'s flags, minus `--logdir`, `--checkpoint-dir` and
        `--resume`, followed by the resolved `--logdir`, `--checkpoint-dir` and `--resume`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        flag = item.split("=", 1)[0]
        if flag in ("--logdir", "--checkpoint-dir"):
            skip = "=" not in item
            continue
        if flag != "--resume":
            kept.append(item)
    extra = ["--logdir", config.logdir, "--checkpoint-dir", config.checkpoint_dir, "--resume"]
    return "python train.py " + shlex.join(kept + extra)


class _StopOnSignal:
    """SIGINT/SIGTERM: the first asks the run to stop cleanly, a second SIGINT quits.

    Before training starts (set-up) there is nothing to save: the program exits with
    128 + the signal number. After training (the final evaluation and export) the signal
    is noted and the program finishes, since the work is saved already.
    """

    def __init__(self, training):
        self.training = training
        self.run = None
        self.received = None

    def __call__(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received is not None:
            raise KeyboardInterrupt(f"second {name}: quitting without saving")
        self.received = name
        if self.run is None:
            print(f"\n{name} received during set-up: nothing trained yet, nothing to save.",
                  file=sys.stderr, flush=True)
            raise SystemExit(128 + signum)
        if self.run.phase == "finishing":
            print(f"\n{name} received: training is over and saved; the final evaluation and "
                  "export finish in a moment (send SIGINT again to quit at once).",
                  file=sys.stderr, flush=True)
            return
        print(
            f"\n{name} received: finishing the mini-batches in flight, then saving a "
            "checkpoint (send SIGINT again to quit at once without saving)...",
            file=sys.stderr,
            flush=True,
        )
        self.training.request_stop(self.run)

    def install(self):
        """Handles SIGINT and SIGTERM from now on; returns a function restoring the old handlers."""
        previous = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        return lambda: [signal.signal(s, h) for s, h in previous.items()]


def script_main(argv=None):
    """`train.py`'s entry point: `main`, then the process' exit.

    After a run connected to a cluster (`--cluster`), the process ends with `os._exit`
    once its output is flushed: TensorFlow's teardown of a connected context waits for
    every worker, for seconds when one has died. The exit code is `main`'s (1 after an
    error, whose traceback is printed first; 130 on a second SIGINT).

    Args:
        argv: the arguments after the program name; None means `sys.argv[1:]`.

    Returns:
        `main`'s exit code (without a cluster; with one the process ends here).
    """
    from tf_spectrain.cluster import health

    try:
        code = main(argv)
    except SystemExit as stop:
        if health.connected_cluster() is None:
            raise
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException as error:
        if health.connected_cluster() is None:
            raise
        traceback.print_exc()
        code = 130 if isinstance(error, KeyboardInterrupt) else 1
    if health.connected_cluster() is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
    return code


def main(argv=None):
    """Entry point of `train.py`: parse, check, train, print the summary line.

    Args:
        argv: the arguments after the program name; None means `sys.argv[1:]`.

    Returns:
        0 after training, and after a clean stop on SIGINT/SIGTERM (with a checkpoint and the
        command that resumes); 1 when training stopped on a non-finite loss or a checkpoint
        could not be written.

    Raises:
        SystemExit: with code 2 on bad flags or a bad `--cuts` (after printing every error),
            or with 128 + the signal number on SIGINT/SIGTERM during set-up.
        KeyboardInterrupt: on a second SIGINT/SIGTERM.
    """
    parser = build_parser()
    config = parse_args(argv)
    from tf_spectrain.app import training
    from tf_spectrain.callbacks import CheckpointWriteError

    stopper = _StopOnSignal(training)
    uninstall = stopper.install()
    try:
        try:
            run = training.prepare(config)
        except (ValueError, TypeError) as e:
            parser.error(str(e))
        print(training.describe(run), flush=True)
        plan = getattr(run.trainer, "partition_plan", None)
        if plan is not None:
            print(plan, flush=True)
        stopper.run = run
        result = training.train(run)
    except CheckpointWriteError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 1
    except training.NonFiniteLossError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        if run.checkpoint is not None and run.checkpoint.last_path:
            print(
                f"The last good checkpoint is {run.checkpoint.last_path}; to continue from it "
                f"(e.g. with a lower --lr): {resume_command(argv, config)}",
                file=sys.stderr,
            )
        return 1
    finally:
        uninstall()
    if result["interrupted"]:
        epoch, batch, total = result["stopped_at"]
        where = f"epoch {epoch}, after {batch} of its {total} mini-batches"
        if result["checkpoint"]:
            note = ""
            if batch and config.mode in PIPELINE_MODES and config.mode != "sync":
                note = (
                    "\n(The pipeline drained in the middle of an epoch: resuming from here "
                    "continues correctly, but not bit for bit as an uninterrupted run would; "
                    "resuming from an epoch-end checkpoint is exact.)"
                )
            print(
                f"Stopped by {stopper.received} at {where}. Saved checkpoint "
                f"{result['checkpoint']}.\nTo resume: {resume_command(argv, config)}{note}"
            )
        elif run.checkpoint is None:
            print(f"Stopped by {stopper.received} at {where}; checkpoints are off, nothing saved.")
        else:
            from tf_spectrain import checkpoint

            newest = checkpoint.latest_checkpoint(config.checkpoint_dir)
            print(
                f"Stopped by {stopper.received} at {where}, before any training step; the newest "
                f"checkpoint is {newest or '(none yet)'}.\n"
                f"To resume: {resume_command(argv, config)}"
            )
        return 0
    if result.get("export"):
        print(f"trained model saved to {result['export']}")
    quality = f"test accuracy {result['test_accuracy']:.4f}"
    if "test_perplexity" in result:
        quality = (f"test loss {result['test_loss']:.4f} | test perplexity "
                   f"{result['test_perplexity']:.2f} | token accuracy "
                   f"{result['test_accuracy']:.4f}")
    print(f"{quality} | {result['images_per_second']:.1f} {training.example_unit(config)}/s "
          f"| wall time {result['wall_time']:.1f} s | logs in {config.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
