"""What the cost model of the emulated hosts is calibrated with, each measured apart from
benchmarks/links.py's grid: the compute (the whole model and each stage) and the links.

    python -m benchmarks.links_calibration --model vgg16 --batch-size 64   # stage times
    python -m benchmarks.links_calibration --what profile --model mlp_wide  # per layer

- `calibrated`: a per-layer profile scaled so that one device trains at the one-core run's
  images/s (links.py's `alone`).
- `stage_times` / `stage_calibrated`: each stage's forward, backward and update measured
  by the pipeline itself (a local pipeline of links.py's cut on 2 devices of one core,
  pass by pass, where every pass is timed), and the profile's layers scaled to them.
- `bits` / `call_seconds` / `read_link`: the links as TensorFlow meets them
  (`benchmarks/tensor_link.py`'s records).
"""

import argparse
import collections
import dataclasses
import json
import os
import statistics
import sys

from benchmarks import common, emulated_hosts, hosts_predict, links

UNSHAPED_BITS = 13.6e9  # measured between two emulated hosts (RESULTS.md section 18)


Calibrated = collections.namedtuple("Calibrated", "whole stages")
"""The profile calibrated to the one-core run (`whole`, for one host and dp) and, for the
pipelines, to each stage's measured passes (`stages`)."""


def bits(rate, link=None, both_ways=False):
    """A link's bits per second as tensors meet it: `link`'s measurement at `rate` (with
    `both_ways`, the rate of each direction while both hosts send at once, where measured),
    else the shaped rate at 97% capped by `link`'s unshaped one; without `link`, the
    shaped rate or `UNSHAPED_BITS`."""
    shaped = emulated_hosts.rate_bits(rate)
    if not link:
        return shaped or UNSHAPED_BITS
    key = "both_ways_mb_per_s" if both_ways else "rate_mb_per_s"

    def measured(record):
        return record.get(key, record["rate_mb_per_s"]) * 8e6

    if rate in link:
        return measured(link[rate])
    ceiling = measured(link["unshaped"]) if "unshaped" in link else UNSHAPED_BITS
    return ceiling if shaped is None else min(0.97 * shaped, ceiling)


def call_seconds(rate, link=None):
    """What a graph call over both workers costs at `rate`: `link`'s measurement there, or
    its largest; 0 without `link`."""
    if not link:
        return 0.0
    return link[rate]["call_s"] if rate in link else max(r["call_s"] for r in link.values())


def read_link(path):
    """`{rate: tensor_link record}` (the last record per rate), or {} if `path` is missing."""
    if not os.path.exists(path):
        return {}
    return {r["rate"]: r for r in common.read_jsonl(path)}


def _scaled(layer, forward, backward):
    """`layer` (a `costmodel.LayerProfile`) with its forward and backward times scaled."""
    return dataclasses.replace(layer, forward_time=layer.forward_time * forward,
                               backward_time=layer.backward_time * backward)


def calibrated(profile, alone, batch_size):
    """`profile` at `batch_size`, every layer scaled so that one device trains at `alone`
    images/s."""
    from tf_spectrain import costmodel

    profile = hosts_predict.dataclass_batch(profile, batch_size)
    one = costmodel.predict_single(profile, costmodel.Hardware(1, 1.0), batch_size)
    scale = (batch_size / alone) / one.seconds_per_batch
    layers = [_scaled(layer, scale, scale) for layer in profile.layers]
    return costmodel.ModelProfile(layers, batch_size, profile.name, profile.input_bytes)


def child_stage_times(args):
    """In a child: links.py's pipeline of `args.model`, stash, on 2 local devices of one core
    each, pass by pass (every pass timed), 2 epochs of 12 mini-batches; prints each stage's
    median forward, backward and update seconds of the second epoch as JSON."""
    devices = common.prepare_tensorflow(2)
    import keras

    import tf_spectrain
    from tf_spectrain import schedule

    keras.utils.set_random_seed(0)
    model = links.build_model(args.model)
    pipe = tf_spectrain.PipelineModel(model, cuts=links.CUTS[args.model], devices=devices,
                                      mode="stash")
    pipe.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), run_eagerly=True,
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pipe.fit(common.synthetic_images(args.batch_size, 12), epochs=2, verbose=0)
    times = [{kind: statistics.median(end - start for done, _, start, end in timeline
                                      if done == kind)
              for kind in (schedule.FORWARD, schedule.BACKWARD, schedule.UPDATE)}
             for timeline in pipe.state.timelines]
    print(json.dumps({"model": args.model, "batch_size": args.batch_size,
                      "cuts": links.CUTS[args.model], "stages": times}))


def stage_times(path, model, batch_size):
    """Each stage's measured pass times (`child_stage_times`) and, right after, the images/s
    of one host alone as links.py measures it (`alone_images_per_s`: the machine's speed
    when the stages were timed), read from `path` if it holds them for `model` at
    `batch_size`, else measured and written there."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
        if (cached["model"], cached["batch_size"]) == (model, batch_size) and (
                "alone_images_per_s" in cached):
            return cached
    print(f"measuring {model}'s stage passes at batch {batch_size} ...", file=sys.stderr)
    measured = common.run_json_child(
        "benchmarks.links_calibration", ["--what", "stage-times", "--model", model,
                                         "--batch-size", str(batch_size)],
        f"stage times of {model}", dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    # The machine's speed meanwhile, measured as links.py measures one host alone.
    alone = links.measure(links.parse_args(["--model", model, "--batch-size", str(batch_size)]),
                          "alone", "unshaped")
    measured["alone_images_per_s"] = alone["images_per_s"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(measured, f, indent=1)
    return measured


def stage_calibrated(profile, times, cuts, scale=1.0):
    """`profile` with each stage's layers scaled so that its forward and its backward with
    the update take `times` (`stage_times`'s stages) times `scale` (to carry them to a
    machine that ran at another speed), at their shares of the stage."""
    from tf_spectrain import costmodel

    ends = profile.cut_positions(cuts) + [len(profile.layers) - 1]
    layers, first = [], 0
    for measured, end in zip(times, ends):
        stage = profile.layers[first:end + 1]
        forward = scale * measured["forward"] / sum(layer.forward_time for layer in stage)
        backward = scale * (measured["backward"] + measured["update"]) / sum(
            layer.backward_time for layer in stage)
        layers += [_scaled(layer, forward, backward) for layer in stage]
        first = end + 1
    return costmodel.ModelProfile(layers, profile.batch_size, profile.name, profile.input_bytes)


def child_profile(args):
    """In a child: `args.model` profiled layer by layer with one intra-op thread (as
    `hosts_predict`'s profiles); prints `hosts_predict.load_profiles`' JSON entry."""
    common.prepare_tensorflow(1)
    from tf_spectrain import costmodel

    profile = costmodel.profile_model(links.build_model(args.model), args.batch_size,
                                      repeats=5)
    print(json.dumps({"profile": profile.to_dict(), "cpu_flops": None, "device": "CPU"}))


def load_profile(path, model, batch_size):
    """`model`'s per-layer profile at `batch_size`, read from `path` or measured there."""
    return hosts_predict.load_profiles(
        path, [model], batch_size, 5, profile=lambda m: common.run_json_child(
            "benchmarks.links_calibration", ["--what", "profile", "--model", m,
                                             "--batch-size", str(batch_size)],
            f"profile {m}", dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")))[model][0]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.links_calibration",
                                description="Measures a model's compute (JSON on stdout).")
    p.add_argument("--what", choices=["stage-times", "profile"], default="stage-times")
    p.add_argument("--model", default="vgg16", choices=sorted(links.CUTS))
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    (child_profile if args.what == "profile" else child_stage_times)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
