"""`benchmarks.memory`'s closed forms and tables (pure: made-up records in, markdown out).
The measurements run in benchmarks/ (minutes of VGG16), not here."""

import argparse

import pytest

from benchmarks import memory


def record(micro, steady=10.0, util=(0.5, 0.7)):
    stages = [{"weights": 2**20, "slots": 2**20, "in_flight": c * 2**19, "micro_batches": c,
               "peak": 2**21 + c * 2**19} for c in micro]
    return {"steady": steady, "cores": 1.5, "rss_mb": 900.0, "stage_memory": stages,
            "utilisation": list(util), "bubble": 1 - sum(util) / len(util)}


@pytest.mark.parametrize("name, expected", [
    ("sync-gpipe", [8, 8, 8, 8]), ("sync-1f1b", [4, 3, 2, 1]), ("stash", [32, 24, 16, 8]),
    ("spectrain-paper", [32, 24, 16, 8]),
])
def test_expected_in_flight_closed_forms(name, expected):
    assert memory.expected_in_flight(name, 4, 8) == expected


def test_theoretical_bubble():
    assert memory.theoretical_bubble(4, 4) == pytest.approx(3 / 7)
    assert memory.theoretical_bubble(4, 8) == pytest.approx(3 / 11)
    assert memory.theoretical_bubble(1, 8) == 0


def test_tables_say_whether_the_stages_kept_what_the_schedule_should():
    args = argparse.Namespace(stages=4, micro_batches=8)
    results = {("sync-1f1b", "auto"): record([4, 3, 2, 1]),
               ("sync-gpipe", "always"): record([8, 8, 7, 8])}
    lines = memory.memory_table(results, args).splitlines()
    assert lines[2].startswith("| sync-1f1b | auto | 4 / 3 / 2 / 1 (as scheduled) | "
                               "4.0 / 3.5 / 3.0 / 2.5 | 2.0 / 1.5 / 1.0 / 0.5 | 900 |")
    assert "8 / 8 / 7 / 8 (schedule: 8 / 8 / 8 / 8)" in lines[3]
    bubble = memory.bubble_table({(2, 4, "sync-gpipe", 1): record([4, 4])}).splitlines()
    assert bubble[2] == ("| 2 | 4 | gpipe | 1 | 0.40 | 0.20 | 0.50 / 0.70 | 10.0 | 1.50 |")
