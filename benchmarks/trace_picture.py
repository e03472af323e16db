"""The README's picture of a trace: a short real run, its `PipelineTrace`, one row per stage.

    python -m benchmarks.trace_picture                    # docs/plots/trace.png
    python -m benchmarks.trace_picture --batches 4 9 --out /tmp/trace.png   # a part

Trains `vgg16_narrow` cut in 4 stages on 4 logical CPU devices (random 32x32 images, batch
32, 12 mini-batches, paper SpecTrain), writes the second epoch's trace with
`tf_spectrain.callbacks.PipelineTrace` after a warm-up epoch (kept beside the picture as
`trace.json`, to open in https://ui.perfetto.dev) and draws the epoch, or the time from the
first to the last pass of mini-batches `--batches`: forwards, backwards and
updates in colour, waits in grey, each pass labelled with its mini-batch. Not a timing
benchmark: the logical devices share the machine's cores.
"""

import argparse
import json
import os

from benchmarks import common

COLOURS = {"forward": "#4c78a8", "backward": "#f58518", "update": "#54a24b", "wait": "#d9d9d9"}


def run(workdir, num_stages=4, batch_size=32, steps=12):
    """Trains one short epoch with a `PipelineTrace`; returns the trace (a dict)."""
    devices = common.prepare_tensorflow(num_stages)
    import keras

    import tf_spectrain
    from tf_spectrain.callbacks import PipelineTrace

    keras.utils.set_random_seed(0)
    model = common.build_model("vgg")
    cuts, _ = common.balanced_cuts(model, num_stages)
    pipe = tf_spectrain.PipelineModel(model, cuts=cuts, devices=devices[:num_stages],
                                      mode="spectrain")
    pipe.compile(tf_spectrain.SpecTrainSGD(0.01, momentum=0.9),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 steps_per_execution=1)  # pass by pass in the warm-up too (traced once)
    data = common.synthetic_images(batch_size, steps)
    pipe.fit(data, epochs=1, verbose=0)  # warm-up: every pass traced once
    trace = PipelineTrace(os.path.join(workdir, "trace.json"))
    pipe.fit(data, epochs=2, verbose=0, callbacks=[trace])  # the first passes of a fit
    return trace.last_trace  # are slower (see the first epoch's trace): draw the second


def draw(trace, out, batches):
    """Draws the trace (or its mini-batches `batches[0]..batches[1]-1`), a row per stage."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    stages = trace["otherData"]["stages"]
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    chosen = [e for e in events if batches is None or (
        e["cat"] == "pass" and batches[0] <= e["args"]["mini_batch"] < batches[1])]
    begin = min(e["ts"] for e in chosen)
    end = max(e["ts"] + e["dur"] for e in chosen)
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(stages) + 1.2))
    for e in events:
        if e["ts"] + e["dur"] < begin or e["ts"] > end:
            continue
        kind = e["args"]["pass"] if e["cat"] == "pass" else "wait"
        start = (max(e["ts"], begin) - begin) / 1e3
        width = (min(e["ts"] + e["dur"], end) - begin) / 1e3 - start
        row = len(stages) - 1 - e["tid"]
        ax.broken_barh([(start, width)], (row - 0.4, 0.8), color=COLOURS[kind],
                       edgecolor="white", linewidth=0.3)
        if kind != "wait" and kind != "update" and width > (end - begin) / 1e3 / 60:
            ax.text(start + width / 2, row, str(e["args"]["mini_batch"]), ha="center",
                    va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(stages)))
    ax.set_yticklabels([f"stage {s['stage']} ({s['device']})\nbubble {s['bubble']:.0%} "
                        f"(schedule {s['bubble_schedule']:.0%})"
                        for s in reversed(stages)], fontsize=8)
    ax.set_xlabel("milliseconds")
    ax.set_xlim(0, (end - begin) / 1e3)
    part = "" if batches is None else f": mini-batches {batches[0]}-{batches[1] - 1}"
    ax.set_title(f"{trace['otherData']['title']}{part}", fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], ncol=4,
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/plots/trace.png")
    parser.add_argument("--batches", type=int, nargs=2, default=None,
                        help="draw only mini-batches start..stop-1 (default: the epoch)")
    args = parser.parse_args(argv)
    workdir = os.path.dirname(os.path.abspath(args.out))
    trace = run(workdir)
    draw(trace, args.out, args.batches)
    print(json.dumps(trace["otherData"]["stages"], indent=1))
    print(f"wrote {args.out} and {os.path.join(workdir, 'trace.json')}")


if __name__ == "__main__":
    main()
