"""The `train.py` command line: parse the flags into a checked `RunConfig`, then train.

The flags themselves are `tf_spectrain.app.flags`'; this module checks them, runs the
training, handles SIGINT/SIGTERM and prints the outcome.

Flag checks (`tf_spectrain.app.config.RunConfig`) run before TensorFlow initialises; what only
the model can tell (the names in `--cuts`) is checked right after the model is built, still
before any training. Either way bad input exits with code 2 and a message within seconds,
so a typo never costs a run.
"""

import os
import shlex
import signal
import sys
import traceback

from tf_spectrain import checks
from tf_spectrain.app.config import ConfigError, RunConfig
from tf_spectrain.app.flags import build_parser, repeated_flags
from tf_spectrain.schedule import modes


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
    errors = [] if config.plan else _check_writable(config)  # --plan writes nothing
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
        command that resumes); 1 when training stopped on a non-finite loss or a stall (no
        stage finished a pass for --stall-timeout), or a checkpoint could not be written.
        With `--plan`: 0 when every stage fits, 3 when one would not (nothing trained).

    Raises:
        SystemExit: with code 2 on bad flags or a bad `--cuts` (after printing every error),
            or with 128 + the signal number on SIGINT/SIGTERM during set-up.
        KeyboardInterrupt: on a second SIGINT/SIGTERM.
    """
    parser = build_parser()
    config = parse_args(argv)
    if config.plan:
        return _plan(parser, config)
    from tf_spectrain.app import preparation, training
    from tf_spectrain.callbacks import CheckpointWriteError
    from tf_spectrain.pipeline_model import NonFiniteLossError, PipelineStalledError

    stopper = _StopOnSignal(training)
    uninstall = stopper.install()
    try:
        try:
            run = preparation.prepare(config)
        except (ValueError, TypeError) as e:
            parser.error(str(e))
        print(preparation.describe(run), flush=True)
        plan = getattr(run.trainer, "partition_plan", None)
        if plan is not None:
            print(plan, flush=True)
        stopper.run = run
        result = training.train(run)
    except CheckpointWriteError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 1
    except (NonFiniteLossError, PipelineStalledError) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        if run.checkpoint is not None and run.checkpoint.last_path:
            how = "e.g. with a lower --lr" if isinstance(e, NonFiniteLossError) else (
                "once the cause is mended")
            print(
                f"The last good checkpoint is {run.checkpoint.last_path}; to continue from it "
                f"({how}): {resume_command(argv, config)}",
                file=sys.stderr,
            )
        return 1
    finally:
        uninstall()
    if result["interrupted"]:
        print(_stop_message(result, run, argv, stopper.received))
        return 0
    if result.get("export"):
        print(f"trained model saved to {result['export']}")
    print(_summary_line(result, config, preparation.example_unit(config)))
    return 0


def _plan(parser, config):
    """`--plan`: prints the plan and returns its exit code (0, or 3 when a stage would not
    fit); cuts that are not the model's exit with 2."""
    from tf_spectrain.app import planning

    try:
        return planning.plan_run(config)
    except (ValueError, TypeError) as e:
        parser.error(str(e))


def _stop_message(result, run, argv, signal_name):
    """What `main` says after a clean stop on a signal: where, what was saved, how to resume."""
    config = run.config
    epoch, batch, total = result["stopped_at"]
    where = f"epoch {epoch}, after {batch} of its {total} mini-batches"
    if result["checkpoint"]:
        note = ""
        if batch and config.mode in modes.PIPELINE_MODES and config.mode != "sync":
            note = (
                "\n(The pipeline drained in the middle of an epoch: resuming from here "
                "continues correctly, but not bit for bit as an uninterrupted run would; "
                "resuming from an epoch-end checkpoint is exact.)"
            )
        return (
            f"Stopped by {signal_name} at {where}. Saved checkpoint "
            f"{result['checkpoint']}.\nTo resume: {resume_command(argv, config)}{note}"
        )
    if run.checkpoint is None:
        return f"Stopped by {signal_name} at {where}; checkpoints are off, nothing saved."
    from tf_spectrain import checkpoint

    newest = checkpoint.latest_checkpoint(config.checkpoint_dir)
    return (
        f"Stopped by {signal_name} at {where}, before any training step; the newest "
        f"checkpoint is {newest or '(none yet)'}.\n"
        f"To resume: {resume_command(argv, config)}"
    )


def _summary_line(result, config, unit):
    """The last line of a finished run: test quality, speed in `unit`/s, wall time, logs."""
    quality = f"test accuracy {result['test_accuracy']:.4f}"
    if "test_perplexity" in result:
        quality = (f"test loss {result['test_loss']:.4f} | test perplexity "
                   f"{result['test_perplexity']:.2f} | token accuracy "
                   f"{result['test_accuracy']:.4f}")
    return (f"{quality} | {result['images_per_second']:.1f} {unit}/s "
            f"| wall time {result['wall_time']:.1f} s | logs in {config.logdir}")


if __name__ == "__main__":
    sys.exit(main())
