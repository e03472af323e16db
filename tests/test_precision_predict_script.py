"""Tests for benchmarks/precision_predict.py without profiling: one profile's times with
another's bytes (`combine`), the predictions and tables of made-up 4-layer profiles against
values worked out by hand, the per-stage memory, the profile cache and the arguments."""

import json

import pytest

from benchmarks import precision_predict as pp
from tf_spectrain.costmodel import Hardware, LayerProfile, ModelProfile

NAMES = ["l0", "l1", "l2", "l3"]


def _profile(forward, backward, nbytes, batch_size=4, name="net", weights=8e6):
    """Four equal layers: `nbytes` per example out and kept, 12 MB of inputs per example."""
    layers = [LayerProfile(n, forward, backward, nbytes, weights, nbytes) for n in NAMES]
    return ModelProfile(layers, batch_size, name, input_bytes=12e6)


# Float32: 1 ms forward, 2 ms backward per layer at batch 4, 4 MB per example out.
FP32 = _profile(1e-3, 2e-3, 4e6)
# Built under mixed_bfloat16: half the bytes; its times (nonsense here) must not be used.
BF16 = _profile(0.5, 0.7, 2e6, batch_size=2, name="net_bf16")
# 16 GB/s, no latency: a hand-off of 4 examples x 4 MB takes 1 ms (0.5 ms in bf16).
HW = Hardware(num_gpus=4, relative_speed=1.0, bandwidth=16e9, latency=0.0)


def test_combine_takes_times_from_one_profile_and_bytes_from_the_other():
    both = pp.combine(FP32, BF16, compute_speedup=4.0)
    assert (both.name, both.batch_size, both.input_bytes, both.names) == ("net_bf16", 4, 12e6,
                                                                         NAMES)
    for layer in both.layers:
        assert layer.forward_time == pytest.approx(0.25e-3)
        assert layer.backward_time == pytest.approx(0.5e-3)
        assert (layer.output_bytes, layer.activation_bytes, layer.weight_bytes) == (2e6, 2e6,
                                                                                    8e6)
    same = pp.combine(FP32, BF16)
    assert [(x.forward_time, x.backward_time) for x in same.layers] == [(1e-3, 2e-3)] * 4


def test_combine_refuses_other_layers_and_bad_speedups():
    other = ModelProfile([LayerProfile(n, 1.0, 1.0) for n in ["l0", "l1", "x", "l3"]], 4)
    with pytest.raises(ValueError, match=r"same layers.*position 2: \['l2'\] against \['x'\]"):
        pp.combine(FP32, other)
    shorter = ModelProfile([LayerProfile(n, 1.0, 1.0) for n in NAMES[:3]], 4)
    with pytest.raises(ValueError, match=r"4 layers and 'model' 3.*position 3: \['l3'\]"):
        pp.combine(FP32, shorter)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="compute_speedup"):
            pp.combine(FP32, BF16, bad)
    with pytest.raises(TypeError, match="sizes"):
        pp.combine(FP32, BF16.to_dict())


# Images/s worked out by hand (ms per mini-batch of 4, one layer per stage, steady state):
# - paper SpecTrain: the busiest stage (1 or 2) runs F + B + recomputed F + two hand-offs:
#   fp32 1 + 2 + 1 + 1 + 1 = 6; bf16 x1 1 + 2 + 1 + 0.5 + 0.5 = 5; x2 0.5 + 1 + 0.5 + 1 = 3;
#   x4 0.25 + 0.5 + 0.25 + 1 = 2.
# - sync, M = 2: (sum + (M - 1) max) / M of the forward phase (F_k + send on) plus that of
#   the backward phase (B_k + send back): fp32 ahead [2, 2, 2, 1] -> 4.5, back
#   [2, 3, 3, 3] -> 7: 11.5; x1 [1.5, 1.5, 1.5, 1] -> 3.5, [2, 2.5, 2.5, 2.5] -> 6: 9.5;
#   x2 [1, 1, 1, .5] -> 2.25, [1, 1.5, 1.5, 1.5] -> 3.5: 5.75; x4 [.75, .75, .75, .25]
#   -> 1.625, [.5, 1, 1, 1] -> 2.25: 3.875.
# - data parallel: 1 example per GPU, F 1 + B 2 (divided by x) + the float32 all-reduce
#   of 32 MB, 2 * 3 / 4 * 32e6 / 16e9 s = 3: fp32 and x1 6, x2 4.5, x4 3.75.
EXPECTED_MS = {
    pp.SPECTRAIN: {"fp32": 6.0, 1.0: 5.0, 2.0: 3.0, 4.0: 2.0},
    pp.sync_label(2): {"fp32": 11.5, 1.0: 9.5, 2.0: 5.75, 4.0: 3.875},
    pp.DATA_PARALLEL: {"fp32": 6.0, 1.0: 6.0, 2.0: 4.5, 4.0: 3.75},
}


def _results():
    return pp.predict_precisions(FP32, BF16, HW, 4, [1.0, 2.0, 4.0], micro_batches=2)


def test_predictions_match_hand_computed_times():
    results = _results()
    assert list(results) == ["fp32", 1.0, 2.0, 4.0]
    for precision, configs in results.items():
        assert list(configs) == list(EXPECTED_MS)
        for label, (estimate, cuts) in configs.items():
            assert estimate.images_per_second == pytest.approx(
                4 / (EXPECTED_MS[label][precision] * 1e-3)), (precision, label)
            assert cuts == (None if label == pp.DATA_PARALLEL else ["l0", "l1", "l2"])


def _rows(text):
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines()[2:]]


def test_throughput_table_cells():
    text = pp.throughput_table({"net": _results()})
    assert text.splitlines()[0] == (
        "| model | configuration | fp32 images/s | bf16 x1 images/s | bf16 x1 / fp32 "
        "| bf16 x2 images/s | bf16 x2 / fp32 | bf16 x4 images/s | bf16 x4 / fp32 |")
    assert _rows(text) == [
        ["net", pp.SPECTRAIN, "667", "800", "1.20x", "1333", "2.00x", "2000", "3.00x"],
        ["net", pp.sync_label(2), "348", "421", "1.21x", "696", "2.00x", "1032", "2.97x"],
        ["net", pp.DATA_PARALLEL, "667", "667", "1.00x", "889", "1.33x", "1067", "1.60x"],
    ]


def test_cuts_notes_name_each_pipelines_cuts():
    assert pp.cuts_notes({"net": _results()}) == [
        f"- net, {label}: cuts fp32 ['l0', 'l1', 'l2']; bf16 x1 the same; bf16 x2 the same; "
        "bf16 x4 the same"
        for label in (pp.SPECTRAIN, pp.sync_label(2))
    ]


def test_stage_memory_and_its_table():
    # Sync 1F1B-flush, N = 4, M = 2: stage k keeps min(4 - k, 2) micro-batches of 2
    # examples, each its inputs and its layer's outputs. fp32: stage 0 2 * 2 * (12 + 4) MB
    # = 64, stages 1-2 2 * 2 * (4 + 4) = 32, stage 3 1 * 2 * 8 = 16; bf16 (inputs of stage
    # 0 still float32): 2 * 2 * (12 + 2) = 56, 2 * 2 * 4 = 16, 8. Totals add 8 MB of weights
    # and 8 of momentum.
    cuts = ["l0", "l1", "l2"]
    fp32 = pp.stage_memory(FP32, HW, 4, cuts, 2)
    bf16 = pp.stage_memory(pp.combine(FP32, BF16), HW, 4, cuts, 2)
    for estimates, acts in ((fp32, [64, 32, 32, 16]), (bf16, [56, 16, 16, 8])):
        assert [e.activation_bytes / 1e6 for e in estimates] == pytest.approx(acts)
        assert [e.memory_bytes / 1e6 for e in estimates] == pytest.approx([a + 16 for a in acts])
    rows = _rows(pp.memory_table({"net": (FP32.names, fp32, bf16)}))
    assert rows == [
        ["net", "0", "l0 .. l0", "64.0", "56.0", "0.88", "80.0", "72.0"],
        ["net", "1", "l1 .. l1", "32.0", "16.0", "0.50", "48.0", "32.0"],
        ["net", "2", "l2 .. l2", "32.0", "16.0", "0.50", "48.0", "32.0"],
        ["net", "3", "l3 .. l3", "16.0", "8.0", "0.50", "32.0", "24.0"],
    ]


def test_profiles_are_cached_per_model_and_policy(tmp_path):
    path = str(tmp_path / "profiles.json")
    calls = []

    def fake(model, policy):
        calls.append((model, policy))
        return {"profile": FP32.to_dict(), "cpu_flops": 1e9, "device": "CPU", "load": [1.0]}

    first = pp.load_profiles(path, ["vgg16"], 4, 5, profile=fake)
    assert calls == [("vgg16", "float32"), ("vgg16", "mixed_bfloat16")]
    assert set(first) == {("vgg16", "float32"), ("vgg16", "mixed_bfloat16")}
    with open(path, encoding="utf-8") as f:
        assert sorted(json.load(f)) == ["vgg16 float32", "vgg16 mixed_bfloat16"]
    assert pp.load_profiles(path, ["vgg16"], 4, 5, profile=fake) == first
    assert len(calls) == 2  # read from the file
    pp.load_profiles(path, ["vgg16"], 8, 5, profile=fake)  # another batch size: profiled again
    assert len(calls) == 4


def test_arguments():
    args = pp.parse_args([])
    assert (args.models, args.batch_size, args.gpu_batch, args.micro_batches) == (
        ["vgg16", "resnet50"], 32, 128, 8)
    assert args.bf16_speedups == [1.0, 2.0, 4.0] and args.child is None
    assert pp.parse_args(["--bf16-speedups", "1,3"]).bf16_speedups == [1.0, 3.0]
    for bad in (["--bf16-speedups", "0"], ["--bf16-speedups", "2,2"], ["--models", "vgg"],
                ["--micro-batches", "0"], ["--gpu-tflops", "-1"], ["--policy", "float16"]):
        with pytest.raises(SystemExit):
            pp.parse_args(bad)
