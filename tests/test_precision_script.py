"""`benchmarks.precision`'s run list and table (pure: made-up results in, markdown out).
The runs themselves train for minutes and belong in benchmarks/."""

import argparse

from benchmarks import common, precision


def result(accuracy, seconds, cores=1.0):
    return {"test_accuracy": [0.1, accuracy], "epoch_seconds": [30.0, seconds, seconds + 1],
            "cores": cores}


def test_each_float32_run_is_followed_by_its_bfloat16_twin():
    args = argparse.Namespace(models=["vgg"], seeds=[0, 1], epochs=2, lr=0.03, stages=4)
    specs = precision.specs(args)
    assert [(s.config, s.seed, s.precision) for s in specs] == [
        (c, seed, p) for c in ("single", "sync", "spectrain-paper") for seed in (0, 1)
        for p in ("float32", "mixed_bfloat16")]
    assert specs[4].trainer_key == ("vgg", "sync", 4)
    assert specs[5].trainer_key == ("vgg", "sync", 4, "mixed_bfloat16")


def test_table_pairs_the_seeds():
    spec = common.RunSpec("vgg", "sync", 4, 0.03, 0, 2)
    other = common.RunSpec("vgg", "sync", 4, 0.03, 1, 2)
    results = {
        spec: result(0.90, 10.0, 1.5),
        common.RunSpec(**{**spec.as_dict(), "precision": "mixed_bfloat16"}): result(0.86, 15.0),
        other: result(0.80, 10.0),
        common.RunSpec(**{**other.as_dict(), "precision": "mixed_bfloat16"}): result(0.82, 12.0),
    }
    row = precision.table(results).splitlines()[2]
    # Accuracy means 0.850 / 0.840; differences -0.04 and +0.02; time ratios (10.5 -> 15.5,
    # 10.5 -> 12.5 medians of the epochs after the first) 1.476 and 1.190.
    assert row == ("| vgg | sync | 2 | 0.850 (0.800 to 0.900) | 0.840 (0.820 to 0.860) | "
                   "-0.010 (-0.040 to +0.020) | 1.33 (1.19-1.48) | 1.25, 1.00 |")
