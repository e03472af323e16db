"""`benchmarks.links_predict`'s pure parts: the calibration to the one-core run, and data
parallelism and a pipeline on a slow link against the arithmetic done by hand."""

import pytest

from benchmarks import links, links_calibration, links_predict
from tf_spectrain import costmodel


def _toy():
    """Two layers at batch 10: 0.1 s forward and 0.2 s backward each; 1 MB and 3 MB of
    weights; 1,000 bytes per example at the cut."""
    layers = [costmodel.LayerProfile("a", 0.1, 0.2, 1000, 1e6, 0),
              costmodel.LayerProfile("b", 0.1, 0.2, 40, 3e6, 0)]
    return costmodel.ModelProfile(layers, 10, "toy", 0)


def test_calibration_makes_one_device_train_at_the_measured_rate():
    profile = links_calibration.calibrated(_toy(), alone=50.0, batch_size=20)
    assert links_predict.predict(profile, "alone", "unshaped", 20, 24, 0.0) == pytest.approx(50.0)
    # one factor for every layer: the layers keep their shares
    assert profile.layers[0].forward_time == pytest.approx(profile.layers[1].forward_time)


def test_slow_links_charge_data_parallelism_its_weights_and_the_pipeline_its_cut(monkeypatch):
    monkeypatch.setitem(links.CUTS, "toy", ["a"])
    profile = links_calibration.calibrated(_toy(), alone=20.0, batch_size=10)  # 0.5 s a batch
    per_second = 8e6 / 8  # 8 Mbit/s
    # dp: half the batch on each device (0.25 s), then a ring all-reduce over 2 devices of
    # the 4 MB of gradients: 2 (n - 1) / n * 4e6 bytes.
    dp = links_predict.predict(profile, "dp", "8mbit", 10, 24, 0.0)
    assert dp == pytest.approx(10 / (0.25 + 4e6 / per_second))
    # stash, steady state: the busier stage's compute (0.25 s) or, with hand-offs beside
    # it, the 10 x 1,000 bytes each way (0.01 s): far faster than dp here.
    stash = links_predict.predict(profile, "stash", "8mbit", 10, None, 0.0, model="toy")
    assert stash == pytest.approx(10 / 0.25, rel=0.05)
    assert links_calibration.bits("unshaped") == links_calibration.UNSHAPED_BITS


def test_the_links_as_tensors_meet_them_and_a_call_per_window(monkeypatch):
    monkeypatch.setitem(links.CUTS, "toy", ["a"])
    link = {"unshaped": {"rate_mb_per_s": 500.0, "call_s": 0.004},
            "100mbit": {"rate_mb_per_s": 11.0, "call_s": 0.02}}
    assert links_calibration.bits("100mbit", link) == 88e6  # measured
    assert links_calibration.bits("1gbit", link) == 0.97e9  # shaped, at TCP's 97%
    assert links_calibration.bits("10gbit", link) == 4e9  # capped by the unshaped measurement
    assert links_calibration.call_seconds("100mbit", link) == 0.02
    assert links_calibration.call_seconds("1gbit", link) == 0.02  # the largest measured
    assert links_calibration.call_seconds("1gbit", None) == 0.0
    assert [links_predict.window_of(r) for r in (
        {"window": 1}, {"steps_per_execution": "auto"}, {"steps_per_execution": "4"},
        {"steps_per_execution": "eager"})] == [1, 8, 4, None]
    profile = links_calibration.calibrated(_toy(), alone=20.0, batch_size=10)  # 0.5 s a batch
    # dp in windows of one pays a call per mini-batch: 0.25 s + 4 MB at 11 MB/s + 0.02 s.
    dp = links_predict.predict(profile, "dp", "100mbit", 10, 24, 0.0, link=link, window=1)
    assert dp == pytest.approx(10 / (0.25 + 4e6 / 11e6 + 0.02))

    def stash(**kwargs):
        return links_predict.predict(profile, "stash", "100mbit", 10, 24, 0.0, model="toy",
                                     **kwargs)

    # Windows of one: every window waits for the one before and pays its call: slower than
    # one call for the whole epoch.
    assert stash(link=link, window=1) < stash(link=link, window=24) < stash(window=24)
    epoch = 24 * 10 / stash(link=link, window=1)
    assert epoch >= 24 * (0.02 + 0.25)  # a call and stage 0's passes (carried: no recompute)


def test_stage_calibration_gives_each_stage_its_measured_passes():
    profile = costmodel.ModelProfile(
        [costmodel.LayerProfile("a", 0.1, 0.2, 1000, 1e6, 0),
         costmodel.LayerProfile("b", 0.3, 0.1, 1000, 1e6, 0),
         costmodel.LayerProfile("c", 0.1, 0.1, 40, 3e6, 0)], 10, "toy", 0)
    times = [{"forward": 0.8, "backward": 0.5, "update": 0.1},
             {"forward": 0.05, "backward": 0.15, "update": 0.05}]
    staged = links_calibration.stage_calibrated(profile, times, ["b"])
    stages = staged.stage_costs(["b"])
    assert [s.forward_time for s in stages] == pytest.approx([0.8, 0.05])
    assert [s.backward_time for s in stages] == pytest.approx([0.6, 0.2])  # with the update
    # within a stage the layers keep their shares
    assert staged.layers[1].forward_time == pytest.approx(3 * staged.layers[0].forward_time)
    assert [layer.weight_bytes for layer in staged.layers] == [1e6, 1e6, 3e6]


def test_links_builds_each_model_it_cuts_at_its_cut():
    for name, cuts in links.CUTS.items():
        model = links.build_model(name)
        assert all(model.get_layer(cut) is not None for cut in cuts), name
        assert model.input_shape == (None, 32, 32, 3) and model.output_shape == (None, 10)
    wide = links.build_model("mlp_wide")
    # weights large next to the activations at the cut: 42 MB against 2,048 floats an image
    assert 4 * wide.count_params() > 40e6
    assert wide.get_layer("dense1").output.shape[-1] == 2048


def test_stage_0s_link_in_carries_the_inputs_once_or_twice_and_the_gradient(monkeypatch):
    monkeypatch.setitem(links.CUTS, "toy", ["a"])
    layers = [costmodel.LayerProfile("a", 0.001, 0.001, 1e4, 0, 0),  # 0.1 MB a batch
              costmodel.LayerProfile("b", 0.001, 0.001, 10, 0, 0)]
    profile = costmodel.ModelProfile(layers, 10, "toy", input_bytes=1e5)  # 1 MB a batch
    link = {"8mbit": {"rate_mb_per_s": 1.0, "call_s": 0.0}}  # 1 MB/s
    got = [links_predict.predict(profile, "stash", "8mbit", 10, 24, 0.0, model="toy",
                                 link=link, window=w) for w in (1, 8)]
    # 2 s or 1 s of inputs a batch, and the gradient at the cut (0.1 s), on stage 0's link in
    assert got == pytest.approx([10 / 2.1, 10 / 1.1])


def test_data_parallelism_exchanges_at_the_rate_of_both_ways_at_once():
    link = {"unshaped": {"rate_mb_per_s": 900.0, "call_s": 0.0, "both_ways_mb_per_s": 450.0},
            "1gbit": {"rate_mb_per_s": 120.0, "call_s": 0.0}}  # an older record: one way
    assert links_calibration.bits("unshaped", link, both_ways=True) == 450 * 8e6
    assert links_calibration.bits("unshaped", link) == 900 * 8e6
    assert links_calibration.bits("1gbit", link, both_ways=True) == 120 * 8e6
    assert links_calibration.bits("10gbit", link, both_ways=True) == 450 * 8e6  # the ceiling
    profile = links_calibration.calibrated(_toy(), alone=20.0, batch_size=10)  # 0.5 s a batch
    # 0.25 s of compute, then the 4 MB of gradients at 450 MB/s
    dp = links_predict.predict(profile, "dp", "unshaped", 10, 24, 0.0, link=link, window=1)
    assert dp == pytest.approx(10 / (0.25 + 4e6 / 450e6))
