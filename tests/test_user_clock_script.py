"""Tests for benchmarks/user_clock.py: its arguments and its tables (no TensorFlow run)."""

from benchmarks import user_clock


def whole(total, epochs, cores=1.0):
    return {"total": {"wall": total, "cores": cores}, "epochs": epochs}


def cells(text, title):
    """The rows of the table under `title`, by first cell."""
    block = text.split(title, 1)[1].split("\n\n")[1]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()
            if line.startswith("| ") and "configuration" not in line]
    return {r[0]: r for r in rows}


def test_speed_ups_are_per_round_and_extra_is_the_first_epoch_over_later_ones():
    results = {"whole": {
        "keras-1core": [whole(90, [32, 29, 29]), whole(80, [28, 26, 26])],
        "stash": [whole(45, [20, 12, 13]), whole(50, [21, 14, 15])],
    }}
    table = cells(user_clock.tables(results), "Whole fit")
    # speed-ups 90/45 = 2.0 and 80/50 = 1.6: median 1.80
    assert table["stash"][6] == "1.80 (1.60-2.00)"
    # extra: 20 - 12.5 = 7.5 and 21 - 14.5 = 6.5
    assert table["stash"][5] == "7.0 (6.5-7.5)"
    assert table["keras-1core"][6] == "1.00 (1.00-1.00)"


def test_relength_resnet_and_main_tables():
    results = {
        "relength": {"keras-1core": [{"timed": {"wall": 10.0, "cores": 1.0}}],
                     "stash": [{"timed": {"wall": 4.0, "cores": 1.9}}]},
        "resnet": {"keras-1core": [{"build_first": 10.0, "build_new_length": 0.5,
                                    "fits": [{"cores": 1.0}]}],
                   "stash": [{"build_first": 25.0, "build_new_length": 4.0,
                              "fits": [{"cores": 1.2}]}]},
        "main": {"train-default": [{"test_accuracy": 0.94, "images_per_second": 9.0,
                                    "wall_time": 150.0, "process": {"wall": 160.0}}],
                 "train-windows": [{"test_accuracy": 0.95, "images_per_second": 20.0,
                                    "wall_time": 60.0, "process": {"wall": 70.0}}]},
    }
    text = user_clock.tables(results)
    assert cells(text, "A fit of a new number")["stash"][3] == "2.50"
    resnet = cells(text, "ResNet-50 graph building")["stash"]
    assert resnet[1:3] == ["25.0", "4.0"] and resnet[4] == "2.50"
    assert cells(text, "train.py")["train-windows"][5] == "2.50"


def test_quick_uses_the_small_model_and_one_round():
    args = user_clock.parse_args(["--quick", "--cases", "whole,main"])
    assert (args.model, args.rounds, args.cases) == ("small_cnn", 1, ["whole", "main"])
    assert user_clock.CASE_CONFIGS["main"] == tuple(user_clock.MAIN)
