"""Shared by the cost model tests: a four-layer chain profile with round numbers and a
`Hardware` shorthand."""

from tf_spectrain.costmodel import Hardware, LayerProfile, ModelProfile

L = LayerProfile


def hw(num_gpus=2, speed=1.0, bandwidth=10.0, latency=0.0, concurrency=None):
    return Hardware(num_gpus, speed, bandwidth, latency, concurrency)


# Four layers at profiled batch 1: (forward, backward, output bytes per example, weight bytes).
CHAIN = ModelProfile(
    [L("l0", 1, 2, 10, 100), L("l1", 1, 1, 20, 0), L("l2", 2, 2, 5, 40), L("l3", 1, 3, 0, 60)],
    batch_size=1,
    name="chain",
)
