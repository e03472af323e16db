"""Keras users' own scripts, one line changed, on the pipeline (issue 30).

    python -m benchmarks.keras_examples_run                  # 8 scripts x 3 ways
    python -m benchmarks.keras_examples_run --scripts mnist_convnet --modes keras,sync
    python -m benchmarks.keras_examples_run --out docs/data/issue18/examples.md \\
        --jsonl docs/data/issue18/examples.jsonl

Each script in `benchmarks/keras_examples/` is a plain Keras training script modelled on
a public Keras example (its docstring names which, and what was changed: random data of
the example's shapes, fewer examples and epochs). Each has one marker line right after
its model is built, `# tf_spectrain: the one line goes here`. Every script runs three
ways, each in a fresh process in a fresh temporary directory (the script's working
directory, where it writes its files):

- `keras`: the script as it is;
- `sync`: the marker replaced by the one line
  `import tf_spectrain; model = tf_spectrain.PipelineModel(model, mode="sync")`;
- `spectrain`: by `import tf_spectrain; model = tf_spectrain.PipelineModel(model)` (the
  default: paper SpecTrain, `cuts="auto"`).

The child's preamble splits the CPU into 4 logical devices (`common.prepare_tensorflow`:
one intra-op thread), calls `keras.utils.set_random_seed(0)` (so `keras` and `sync` start
from the same weights); it records the History of every `fit` (of a `keras.Model` or a
`tf_spectrain.PipelineModel`, the outermost call only) to a JSON file. Per run the table
gives: whether the script ran to its end, else the last line of its error; the wall time
of the child process (TensorFlow's start-up included); the final training loss (the last
`fit`'s last epoch); and for `sync`, whether every History equals Keras' (same keys and
epochs, values within `--rtol`), "n/a (dropout)" for scripts with randomness in training
(there the two draw different dropout masks).
"""

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import common

SCRIPTS_DIR = os.path.join(common.ROOT, "benchmarks", "keras_examples")
MARKER = "# tf_spectrain: the one line goes here"
# mode -> the line that replaces the marker (None: the script unchanged).
MODES = {
    "keras": None,
    "sync": 'import tf_spectrain; model = tf_spectrain.PipelineModel(model, mode="sync")',
    "spectrain": "import tf_spectrain; model = tf_spectrain.PipelineModel(model)",
}
# Scripts whose training draws random numbers, so that no run can equal another's.
RANDOM_IN_TRAINING = {
    "mnist_convnet": "dropout",
    "text_classification_with_transformer": "dropout",
    "structured_data_classification_from_scratch": "dropout",
    "imbalanced_classification": "dropout",
}
NUM_DEVICES = 4
SEED = 0
RTOL = 1e-4
TIMEOUT = 900  # seconds per run


def script_names():
    """The scripts of `benchmarks/keras_examples/`, by name (file name without `.py`)."""
    return sorted(f[:-3] for f in os.listdir(SCRIPTS_DIR) if f.endswith(".py"))


def script_path(name):
    """The file of script `name`."""
    return os.path.join(SCRIPTS_DIR, name + ".py")


def marker_lines(source):
    """The 0-based numbers of the lines of `source` that are the marker (indented or not)."""
    return [i for i, line in enumerate(source.splitlines()) if line.strip() == MARKER]


def script_for_mode(source, mode):
    """The script's text for `mode`: the marker replaced by the mode's line, same indent.

    Args:
        source: the script's text.
        mode: a key of `MODES`.

    Returns:
        The text to run; unchanged for `"keras"`.

    Raises:
        ValueError: if `source` has not exactly one marker line, or `mode` is unknown.
    """
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {sorted(MODES)}. Received: {mode!r}")
    found = marker_lines(source)
    if len(found) != 1:
        raise ValueError(
            f"A script must have exactly one line `{MARKER}`; this one has {len(found)}."
        )
    if MODES[mode] is None:
        return source
    lines = source.splitlines(keepends=True)
    line = lines[found[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[found[0]] = indent + MODES[mode] + "\n"
    return "".join(lines)


# --- the child: preamble, History capture, the script ------------------------------------


def _jsonable_history(history):
    """`History.history` as a dict of lists of floats."""
    return {key: [float(v) for v in values] for key, values in history.history.items()}


def record_fits(classes, histories, path):
    """Wraps `fit` of each class in `classes` to append each History to `histories`.

    Only the outermost `fit` records (a pipeline that calls Keras' `fit` inside, or a
    subclass that inherits a wrapped `fit`, records once); after each, `histories` is
    written to `path` as JSON (so a script that fails later keeps what it trained).

    Args:
        classes: the classes whose `fit` to wrap (e.g. `keras.Model`, `PipelineModel`).
        histories: the list to append to.
        path: the JSON file to write.
    """
    depth = [0]

    def wrap(original):
        @functools.wraps(original)
        def fit(self, *args, **kwargs):
            depth[0] += 1
            try:
                history = original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0 and hasattr(history, "history"):
                histories.append(_jsonable_history(history))
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(histories, f)
                if getattr(self, "num_stages", None):  # a pipeline: how it was cut
                    with open(path + ".stages", "w", encoding="utf-8") as f:
                        f.write(str(self.num_stages))
            return history

        return fit

    for cls in classes:
        cls.fit = wrap(cls.fit)


def run_child(script, record):
    """The child process: the preamble, then `script` run as `__main__` in this directory."""
    import runpy

    common.prepare_tensorflow(NUM_DEVICES)
    import keras

    import tf_spectrain

    keras.utils.set_random_seed(SEED)
    record_fits([keras.Model, tf_spectrain.PipelineModel], [], record)
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")


# --- the parent: one run per script and mode -----------------------------------------------


def _text(output):
    """A child's captured output as text (a timeout hands it over as bytes)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _last_line(text):
    """The last non-empty line of `text` ("" if none)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_script(name, mode, timeout=TIMEOUT):
    """Runs script `name` one way in a fresh process and temporary directory.

    Args:
        name: a script of `script_names()`.
        mode: a key of `MODES`.
        timeout: seconds before the child is killed (and the run counts as failed).

    Returns:
        A record: `script`, `mode`, `ran` (bool), `error` (the last line of the
        child's stderr, or "" if it ran), `wall_s`, `histories` (one dict per `fit`),
        `final_loss` (NaN without one), `stages` (the pipeline's number of stages at its
        last `fit`, None for Keras), `stderr_tail`.
    """
    with open(script_path(name), encoding="utf-8") as f:
        source = script_for_mode(f.read(), mode)
    with tempfile.TemporaryDirectory(prefix=f"keras_example-{name}-{mode}-") as work:
        script = os.path.join(work, name + ".py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(source)
        record_path = os.path.join(work, "histories.json")
        cmd, env = common.child_command(
            "benchmarks.keras_examples_run", ["--child", script, "--record", record_path]
        )
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        start = time.perf_counter()
        try:
            out = subprocess.run(
                cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout,
                check=False,
            )
            returncode, stderr = out.returncode, out.stderr
        except subprocess.TimeoutExpired as e:
            returncode = None
            stderr = _text(e.stderr) + f"\nTimeoutExpired: killed after {timeout} s"
        wall = time.perf_counter() - start
        histories, stages = [], None
        if os.path.exists(record_path):
            with open(record_path, encoding="utf-8") as f:
                histories = json.load(f)
        if os.path.exists(record_path + ".stages"):
            with open(record_path + ".stages", encoding="utf-8") as f:
                stages = int(f.read())
    ran = returncode == 0
    final = histories[-1].get("loss", []) if histories else []
    return {
        "script": name,
        "mode": mode,
        "ran": ran,
        "error": "" if ran else _last_line(stderr) or f"exit status {returncode}",
        "wall_s": round(wall, 2),
        "stages": stages,
        "histories": histories,
        "final_loss": final[-1] if final else math.nan,
        "stderr_tail": "" if ran else stderr[-4000:],
    }


def compare_histories(expected, actual, rtol=RTOL):
    """Whether the Histories `actual` equal `expected`, e.g. a pipeline's against Keras'.

    Args:
        expected, actual: lists of History dicts (key -> list of per-epoch values), one
            per `fit`.
        rtol: relative tolerance of each value (NaNs equal NaNs).

    Returns:
        `"equal"`, or `"differs: ..."` naming the first difference (number of fits, keys,
        epochs, or the first value beyond `rtol` with both values).
    """
    if len(expected) != len(actual):
        return f"differs: {len(actual)} fits, Keras {len(expected)}"
    for n, (want, got) in enumerate(zip(expected, actual)):
        if sorted(want) != sorted(got):
            return f"differs: fit {n} keys {sorted(got)}, Keras {sorted(want)}"
        for key in sorted(want):
            if len(want[key]) != len(got[key]):
                return f"differs: fit {n} {key} has {len(got[key])} epochs, Keras {len(want[key])}"
            for epoch, (a, b) in enumerate(zip(want[key], got[key])):
                if math.isnan(a) and math.isnan(b):
                    continue
                if not abs(a - b) <= rtol * abs(a):
                    return f"differs: fit {n} {key} epoch {epoch + 1}: {b:.7g}, Keras {a:.7g}"
    return "equal"


def history_check(record, keras_record, rtol=RTOL):
    """The table's History cell of a `sync` run: "equal", "differs: ...", "n/a (...)".

    A run that failed after some `fit`s is compared on those (the cell says so).
    """
    if record["mode"] != "sync":
        return ""
    reason = RANDOM_IN_TRAINING.get(record["script"])
    if reason:
        return f"n/a ({reason})"
    if keras_record is None or not keras_record["ran"]:
        return "n/a (Keras did not run)"
    if record["ran"]:
        return compare_histories(keras_record["histories"], record["histories"], rtol)
    done = record["histories"]
    if not done:
        return "n/a (no fit finished)"
    check = compare_histories(keras_record["histories"][: len(done)], done, rtol)
    return f"{check} ({len(done)} fit(s) before the error)"


def _cell(text):
    """`text` fit for a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def results_table(records, rtol=RTOL):
    """The markdown table of `records` (from `run_script`), one row per script and mode."""
    keras_runs = {r["script"]: r for r in records if r["mode"] == "keras"}
    rows = []
    for r in records:
        loss = "-" if math.isnan(r["final_loss"]) else f"{r['final_loss']:.4f}"
        rows.append([
            r["script"], r["mode"], r.get("stages") or "-", "yes" if r["ran"] else "no",
            f"{r['wall_s']:.1f}", loss,
            history_check(r, keras_runs.get(r["script"]), rtol) or "-",
            _cell(r["error"]),
        ])
    header = ["script", "mode", "stages", "ran", "wall s", "final loss",
              "History = Keras (sync)", "error (last line)"]
    return common.markdown_table(header, rows)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.keras_examples_run", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--scripts", type=common.csv_of(str, script_names()),
                   default=script_names(), help="comma-separated script names (default: all)")
    p.add_argument("--modes", type=common.csv_of(str, list(MODES)), default=list(MODES),
                   help="comma-separated: keras, sync, spectrain (default: all three)")
    p.add_argument("--rtol", type=float, default=RTOL,
                   help="relative tolerance of sync's History against Keras'")
    p.add_argument("--timeout", type=common.positive_int, default=TIMEOUT,
                   help="seconds per run before it is killed")
    p.add_argument("--out", help="also write the markdown table here")
    p.add_argument("--jsonl", help="append one JSON record per run here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        run_child(args.child, args.record)
        return
    records = []
    for name in args.scripts:
        for mode in args.modes:
            record = run_script(name, mode, args.timeout)
            records.append(record)
            status = "ran" if record["ran"] else f"FAILED: {record['error']}"
            print(f"{name} / {mode}: {status} ({record['wall_s']:.1f} s)", flush=True)
            if args.jsonl:
                common.append_jsonl(args.jsonl, record)
    text = (
        f"Keras example scripts, one line changed ({NUM_DEVICES} logical CPU devices, "
        f"seed {SEED}; wall time of the whole child process; History rtol {args.rtol:g})\n\n"
        + results_table(records, args.rtol)
    )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    common.publish(text, args.out)


if __name__ == "__main__":
    main()
