"""The `train.py` command line: parse and check every flag, then call `tf_spectrain.training`.

Flag checks run before TensorFlow initialises; what only the model can tell (the names in
`--cuts`) is checked right after the model is built, still before any training. Either way
bad input exits with code 2 and a message within seconds, so a typo never costs a run.
"""

import argparse
import math
import os
import shlex
import signal
import sys
import time

from tf_spectrain import modes
from tf_spectrain.messages import did_you_mean

PIPELINE_MODES = modes.MODES
MODES = PIPELINE_MODES + ("single", "dp")
TARGETS = modes.TARGETS
ON_NAN = ("stop", "skip")
MAX_DEVICES = 64
MAX_SEED = 2**32  # keras.utils.set_random_seed takes seeds below 2**32
MODE_HELP = (
    "pipelines of --gpus stages: spectrain (SpecTrain weight prediction), stash (PipeDream "
    "weight stashing), vanilla (naive, stale), sync (sequential SGD / GPipe); baselines: "
    "single (one device), dp (data parallelism with tf.distribute.MirroredStrategy)"
)


def build_parser():
    """Returns the `argparse.ArgumentParser` of `train.py`."""
    p = argparse.ArgumentParser(
        prog="train.py",
        allow_abbrev=False,  # "--epoch 3" must not silently mean --epochs
        description=(
            "Train a Keras model on several devices. Without GPUs the CPU is split into "
            "logical devices, so every mode runs anywhere."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default="vgg16", help="model builder (see --help for the list)")
    p.add_argument("--gpus", type=int, default=4, help="number of devices to use")
    p.add_argument("--mode", default="spectrain", help=MODE_HELP)
    p.add_argument(
        "--cuts",
        default=None,
        type=_comma_list,
        help="comma-separated layer names, each ending a stage (--gpus - 1 of them); "
        "default: stages with about equal parameter counts",
    )
    p.add_argument(
        "--spectrain-target",
        default="paper",
        help="spectrain: 'paper' (the paper's version gaps) or 'consistent' (one "
        "prediction per mini-batch, reused by the backward)",
    )
    p.add_argument(
        "--micro-batches",
        type=int,
        default=1,
        help="sync mode: GPipe micro-batches per mini-batch (must divide --batch-size)",
    )
    p.add_argument("--dataset", default="digits", help="dataset name")
    p.add_argument("--data-dir", default=None, help="tensorflow-datasets data dir")
    p.add_argument(
        "--download",
        action="store_true",
        help="allow tensorflow-datasets to download and prepare the dataset (needs network)",
    )
    # Defaults: VGG16 on digits reaches about 94% test accuracy in 4 epochs (6.5 minutes
    # on a 2-core CPU as a 4-stage SpecTrain pipeline).
    p.add_argument("--epochs", type=int, default=4, help="training epochs")
    p.add_argument("--batch-size", type=int, default=32, help="mini-batch size (global)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="weight decay (0: none)")
    p.add_argument("--seed", type=int, default=0, help="random seed (weights, data order)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help="use only the first LIMIT examples of each split (quick runs)",
    )
    p.add_argument(
        "--logdir",
        default=None,
        help="TensorBoard log dir (default: runs/<model>-<mode>-<timestamp>; with --resume "
        "and --checkpoint-dir: the checkpoint dir's parent)",
    )
    p.add_argument(
        "--log-every",
        default="auto",
        type=_auto_or_int,
        help="write per-step scalars every N mini-batches; 'auto' keeps logging under 2%% "
        "of the training time",
    )
    p.add_argument(
        "--prediction-every",
        type=int,
        default=10,
        help="pipelines: measure the weight prediction error (staleness) on every Nth "
        "mini-batch of each epoch, on every stage; 0 turns it off",
    )
    p.add_argument("--graph", action="store_true", help="also write the model graph to TensorBoard")
    p.add_argument(
        "--histograms", action="store_true", help="also write weight histograms every epoch"
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where to save a checkpoint at every epoch end and on SIGINT/SIGTERM "
        "(default: <logdir>/checkpoints)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        help="how many of the newest checkpoints to keep; 0 saves none",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --checkpoint-dir (or <logdir>/checkpoints)",
    )
    p.add_argument(
        "--on-nan",
        default="stop",
        help="a non-finite loss: 'stop' (say where it came from; keep the last good "
        "checkpoint) or 'skip' (pipelines: leave out updates whose gradient is not finite)",
    )
    p.add_argument(
        "--export",
        default=None,
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
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer names such as block2_pool,block3_pool; got {text!r}"
        )
    return names


def _shown(value):
    """A flag's value as typed, quoted when it would be invisible (empty or spaces)."""
    return repr(value) if not str(value).strip() or str(value) != str(value).strip() else value


def _choice_error(flag, value, choices):
    hint = did_you_mean(value, choices)
    return f"{flag} must be one of {list(choices)}. Received: {flag} {_shown(value)}{hint}"


def check_args(args):
    """Checks parsed arguments; returns a list of error messages (empty when all is well).

    Only cheap checks that run no TensorFlow op: names, ranges, files and dirs.
    """
    from tf_spectrain import data, models

    errors = []
    if args.model not in models.model_names():
        errors.append(_choice_error("--model", args.model, models.model_names()))
    if args.dataset not in data.dataset_names():
        errors.append(_choice_error("--dataset", args.dataset, data.dataset_names()))
    if args.mode not in MODES:
        errors.append(_choice_error("--mode", args.mode, MODES))
    for flag, value in [
        ("--gpus", args.gpus),
        ("--epochs", args.epochs),
        ("--batch-size", args.batch_size),
    ]:
        if value < 1:
            errors.append(f"{flag} must be an integer >= 1. Received: {flag} {value}")
    if args.gpus > MAX_DEVICES:
        errors.append(
            f"--gpus must be at most {MAX_DEVICES} (one device per pipeline stage). "
            f"Received: --gpus {args.gpus}"
        )
    if args.spectrain_target not in TARGETS:
        errors.append(_choice_error("--spectrain-target", args.spectrain_target, TARGETS))
    errors += _check_pipeline_flags(args)
    if args.limit is not None and args.limit < 1:
        errors.append(f"--limit must be an integer >= 1. Received: --limit {args.limit}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        errors.append(f"--lr must be a finite number > 0. Received: --lr {args.lr}")
    if not 0 <= args.momentum < 1:
        errors.append(
            f"--momentum must be in [0, 1) (0 <= momentum < 1). Received: --momentum {args.momentum}"
        )
    if not (args.weight_decay >= 0 and math.isfinite(args.weight_decay)):
        errors.append(
            f"--weight-decay must be a finite number >= 0. Received: --weight-decay {args.weight_decay}"
        )
    if not 0 <= args.seed < MAX_SEED:
        errors.append(f"--seed must be >= 0 and < 2**32. Received: --seed {args.seed}")
    if args.data_dir is not None and os.path.isfile(args.data_dir):
        errors.append(
            f"--data-dir must be a directory, but {args.data_dir} is a file. Pass the folder "
            "that holds (or, with --download, will hold) the tensorflow-datasets data."
        )
    elif args.data_dir is not None and not args.download and not os.path.isdir(args.data_dir):
        errors.append(
            f"--data-dir {args.data_dir} does not exist. Pass the folder that holds the "
            "prepared tensorflow-datasets data, or add --download to create it."
        )
    errors += _check_run_flags(args)
    if not errors and args.dataset in data.dataset_names():
        try:
            data.check_available(args.dataset, data_dir=args.data_dir, download=args.download)
        except FileNotFoundError as e:
            errors.append(str(e))
    return errors


def _check_pipeline_flags(args):
    errors = []
    if args.micro_batches < 1:
        errors.append(
            f"--micro-batches must be an integer >= 1. Received: --micro-batches {args.micro_batches}"
        )
    elif args.micro_batches > 1:
        if args.mode != "sync":
            errors.append(
                "--micro-batches > 1 (GPipe) needs --mode sync. "
                f"Received: --micro-batches {args.micro_batches} with --mode {args.mode}"
            )
        if args.batch_size >= 1 and args.batch_size % args.micro_batches:
            errors.append(
                f"--micro-batches must divide --batch-size. Received: --batch-size "
                f"{args.batch_size} and --micro-batches {args.micro_batches}"
            )
    if args.cuts is not None and args.mode not in PIPELINE_MODES:
        errors.append(
            f"--cuts splits a pipeline and needs one of the modes {list(PIPELINE_MODES)}. "
            f"Received: --cuts with --mode {args.mode}"
        )
    elif args.cuts is not None:
        if len(args.cuts) + 1 != args.gpus:
            errors.append(
                f"--cuts names {len(args.cuts)} layers, which makes {len(args.cuts) + 1} "
                f"stages, but --gpus is {args.gpus}: give {args.gpus - 1} cut layers (one "
                f"stage per device). Received: --cuts {','.join(args.cuts)}"
            )
        repeated = sorted({c for c in args.cuts if args.cuts.count(c) > 1})
        if repeated:
            errors.append(
                f"--cuts must name each layer once. Received: --cuts {','.join(args.cuts)} "
                f"({', '.join(repeated)} repeated)"
            )
    return errors


def _check_run_flags(args):
    """Telemetry, checkpoint, fault-handling and output flags."""
    errors = []
    for flag, value in [
        ("--logdir", args.logdir),
        ("--checkpoint-dir", args.checkpoint_dir),
        ("--export", args.export),
        ("--data-dir", args.data_dir),
    ]:
        if value is not None and not value.strip():
            errors.append(f"{flag} must be a path. Received: {flag} {value!r}")
    if args.log_every != "auto" and args.log_every < 1:
        errors.append(
            f"--log-every must be 'auto' or an integer >= 1. Received: --log-every {args.log_every}"
        )
    if args.prediction_every < 0:
        errors.append(
            "--prediction-every must be an integer >= 0 (0: off). "
            f"Received: --prediction-every {args.prediction_every}"
        )
    if args.keep_checkpoints < 0:
        errors.append(
            "--keep-checkpoints must be an integer >= 0 (0: no checkpoints). "
            f"Received: --keep-checkpoints {args.keep_checkpoints}"
        )
    if args.resume and args.keep_checkpoints == 0:
        errors.append("--resume needs checkpoints: it cannot be used with --keep-checkpoints 0")
    if args.resume and args.checkpoint_dir is None and args.logdir is None:
        errors.append(
            "--resume needs to know where the checkpoints are: give --checkpoint-dir, or the "
            "--logdir of the run to continue (its checkpoints are in <logdir>/checkpoints)"
        )
    if args.on_nan not in ON_NAN:
        errors.append(_choice_error("--on-nan", args.on_nan, ON_NAN))
    elif args.on_nan == "skip" and args.mode not in PIPELINE_MODES:
        errors.append(
            f"--on-nan skip is only available for the pipeline modes {list(PIPELINE_MODES)}; "
            f"with --mode {args.mode} use --on-nan stop"
        )
    if args.export is not None and args.export != "none" and not args.export.endswith(".keras"):
        errors.append(
            "--export must be a file name ending in .keras (or 'none'). "
            f"Received: --export {args.export}"
        )
    return errors


def _check_writable(args):
    """Creates the output dirs now, so that an unwritable one fails before training."""
    from tf_spectrain import checkpoint_store

    errors = []
    targets = [("--logdir", args.logdir)]
    if args.keep_checkpoints:
        targets.append(("--checkpoint-dir", args.checkpoint_dir))
    if args.export not in (None, "none"):
        targets.append(("the folder of --export", os.path.dirname(os.path.abspath(args.export))))
    for flag, path in targets:
        try:
            checkpoint_store.check_writable_dir(path, flag)
        except (ValueError, TypeError) as e:
            errors.append(str(e))
    return errors


def default_logdir(model, mode):
    """`runs/<model>-<mode>-<timestamp>`."""
    return os.path.join("runs", f"{model}-{mode}-{time.strftime('%Y%m%d-%H%M%S')}")


def repeated_flags(parser, argv):
    """The options given more than once in `argv` (argparse would keep the last one)."""
    seen, repeated = set(), []
    options = {o for action in parser._actions for o in action.option_strings}  # noqa: SLF001
    for item in argv:
        flag = item.split("=", 1)[0]
        if flag in options and flag not in ("-h", "--help"):
            if flag in seen and flag not in repeated:
                repeated.append(flag)
            seen.add(flag)
    return repeated


def parse_args(argv=None):
    """Parses and checks `argv`; on bad input prints the errors and exits with code 2."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    errors = [
        f"{flag} was given more than once; give each flag once"
        for flag in repeated_flags(parser, argv)
    ]
    errors += check_args(args)
    if errors:
        parser.error("\n  ".join(errors))
    if args.logdir is None:
        if args.resume and args.checkpoint_dir is not None:
            args.logdir = os.path.dirname(os.path.abspath(args.checkpoint_dir))
        else:
            args.logdir = default_logdir(args.model, args.mode)
    if args.checkpoint_dir is None:
        args.checkpoint_dir = os.path.join(args.logdir, "checkpoints")
    if args.export is None:
        args.export = os.path.join(args.logdir, "model.keras")
    errors = _check_writable(args)
    if errors:
        parser.error("\n  ".join(errors))
    return args


def resume_command(argv, args):
    """The command line that continues this run from its newest checkpoint."""
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
    extra = ["--logdir", args.logdir, "--checkpoint-dir", args.checkpoint_dir, "--resume"]
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
        previous = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        return lambda: [signal.signal(s, h) for s, h in previous.items()]


def main(argv=None):
    """Entry point of `train.py`: parse, check, train, print the summary line.

    Returns 0 after training, and after a clean stop on SIGINT/SIGTERM (with a checkpoint
    and the command that resumes); 1 when training stopped on a non-finite loss.
    """
    parser = build_parser()
    args = parse_args(argv)
    from tf_spectrain import training

    stopper = _StopOnSignal(training)
    uninstall = stopper.install()
    try:
        try:
            run = training.prepare(args)
        except (ValueError, TypeError) as e:
            parser.error(str(e))
        print(training.describe(run), flush=True)
        stopper.run = run
        result = training.train(run)
    except training.CheckpointWriteError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 1
    except training.NonFiniteLossError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        if run.checkpoint is not None and run.checkpoint.last_path:
            print(
                f"The last good checkpoint is {run.checkpoint.last_path}; to continue from it "
                f"(e.g. with a lower --lr): {resume_command(argv, args)}",
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
            if batch and args.mode in PIPELINE_MODES and args.mode != "sync":
                note = (
                    "\n(The pipeline drained in the middle of an epoch: resuming from here "
                    "continues correctly, but not bit for bit as an uninterrupted run would; "
                    "resuming from an epoch-end checkpoint is exact.)"
                )
            print(
                f"Stopped by {stopper.received} at {where}. Saved checkpoint "
                f"{result['checkpoint']}.\nTo resume: {resume_command(argv, args)}{note}"
            )
        elif run.checkpoint is None:
            print(f"Stopped by {stopper.received} at {where}; checkpoints are off, nothing saved.")
        else:
            from tf_spectrain import checkpoint_store

            newest = checkpoint_store.latest_checkpoint(args.checkpoint_dir)
            print(
                f"Stopped by {stopper.received} at {where}, before any training step; the newest "
                f"checkpoint is {newest or '(none yet)'}.\nTo resume: {resume_command(argv, args)}"
            )
        return 0
    if result.get("export"):
        print(f"trained model saved to {result['export']}")
    print(
        f"test accuracy {result['test_accuracy']:.4f} | "
        f"{result['images_per_second']:.1f} images/s | "
        f"wall time {result['wall_time']:.1f} s | logs in {args.logdir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
