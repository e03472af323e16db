"""Tests of the NumPy reference of SPECTRAIN.md (`tests/spectrain_reference.py`).

Every expectation here comes from an independent source: finite differences, a plain
sequential SGD loop written below, the tables printed in SPECTRAIN.md, or an identity that
the page states (e.g. one predicted step equals one real step).
"""

import itertools

import numpy as np
import pytest
import spectrain_reference as ref

LAYERS = [5, 8, 7, 6, 3]  # four Dense layers


def _max_diff(params_a, params_b):
    return max(np.max(np.abs(a - b)) for pa, pb in zip(params_a, params_b)
               for a, b in zip(pa, pb))


def _train(mode, target="paper", momentum=0.9, lr=0.3, stage_sizes=(1, 2, 1), epochs=1,
           num_batches=6, **kwargs):
    params, batches = ref.make_problem(0, LAYERS, num_batches, 4)
    return ref.train_reference(params, list(stage_sizes), batches, mode=mode, lr=lr,
                               momentum=momentum, epochs=epochs, target=target, **kwargs)


ASYNC_CONFIGS = [("vanilla", "paper"), ("stash", "paper"), ("spectrain", "paper"),
                 ("spectrain", "consistent")]


# --- an independent sequential SGD loop ---------------------------------------------------


def _plain_sgd(params, batches, lr, momentum, epochs, weight_decay=None):
    """Whole-network backprop and Keras SGD, written without the reference module."""
    weights = [[np.array(w, dtype=np.float64), np.array(b, dtype=np.float64)]
               for w, b in params]
    velocity = [[np.zeros_like(w), np.zeros_like(b)] for w, b in weights]
    losses = []
    for _ in range(epochs):
        for x, y in batches:
            pre, post = [], [x]
            for layer, (w, b) in enumerate(weights):
                pre.append(post[-1] @ w + b)
                last = layer == len(weights) - 1
                post.append(pre[-1] if last else np.where(pre[-1] > 0, pre[-1], 0.0))
            probs = np.exp(pre[-1]) / np.exp(pre[-1]).sum(axis=1, keepdims=True)
            losses.append(float(np.mean(-np.log(probs[np.arange(len(y)), y]))))
            delta = (probs - np.eye(probs.shape[1])[y]) / len(y)
            grads = [None] * len(weights)
            for layer in range(len(weights) - 1, -1, -1):
                if layer < len(weights) - 1:
                    delta = np.where(pre[layer] > 0, delta, 0.0)
                grads[layer] = (post[layer].T @ delta, delta.sum(axis=0))
                delta = delta @ weights[layer][0].T
            for layer in range(len(weights)):
                for j in range(2):
                    if weight_decay is not None:
                        weights[layer][j] = weights[layer][j] * (1 - weight_decay * lr)
                    velocity[layer][j] = momentum * velocity[layer][j] - lr * grads[layer][j]
                    weights[layer][j] = weights[layer][j] + velocity[layer][j]
    return weights, losses


# --- schedule -----------------------------------------------------------------------------


def _parse(line):
    return [(token[0], int(token[1:])) for token in line.split()]


@pytest.mark.parametrize("num_stages, num_batches, expected", [
    # SPECTRAIN.md section 3, N = 3 (idle slots removed), continued to T = 6.
    (3, 6, ["F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"]),
    # Fewer mini-batches than stages: w_k = min(N - k, T).
    (4, 2, ["F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"]),
    (1, 3, ["F0 B0 F1 B1 F2 B2"]),
])
def test_stage_instructions_match_the_spec(num_stages, num_batches, expected):
    assert ref.stage_instructions(num_stages, num_batches) == [_parse(s) for s in expected]


def test_version_gaps_match_the_spec_table():
    # SPECTRAIN.md, the N = 4 table.
    s_f, s_b = [3, 2, 2, 1], [0, 0, 1, 1]
    assert [ref.version_gaps(4, k) for k in range(4)] == list(zip(s_f, s_b))
    assert [ref.version_gaps(4, k, "consistent") for k in range(4)] == [(3, 3), (2, 2),
                                                                        (1, 1), (0, 0)]


@pytest.mark.parametrize("mode, target", ASYNC_CONFIGS)
@pytest.mark.parametrize("stage_sizes", [(1, 2, 1), (1, 1, 1, 1)])
def test_passes_see_the_versions_the_spec_prescribes(mode, target, stage_sizes):
    rng = np.random.default_rng(1)
    trace = []
    _train(mode, target, stage_sizes=stage_sizes, epochs=2, trace=trace,
           pick=lambda ready: int(rng.choice(ready)))
    n = len(stage_sizes)
    assert len(trace) == 2 * 2 * n * 6  # F and B of 6 mini-batches, N stages, 2 epochs
    for event in trace:
        if event.kind == "F":
            assert event.updates == max(0, event.batch - (n - 1 - event.stage)), event
        else:
            assert event.updates == event.batch, event


# --- gradients ----------------------------------------------------------------------------


def _numeric_gradient(function, array, eps=1e-6):
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        saved = array[index]
        array[index] = saved + eps
        up = function()
        array[index] = saved - eps
        down = function()
        array[index] = saved
        grad[index] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("final", [False, True])
def test_stage_vjp_matches_finite_differences(final):
    params, [(x, y)] = ref.make_problem(2, [4, 6, 5], 1, 3)
    weights = [w for pair in params for w in pair]
    upstream = np.random.default_rng(3).normal(size=(3, 5))

    def objective():
        out = ref.stage_forward(x, weights, final)[-1]
        if final:
            shifted = out - out.max(axis=1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            return -np.mean(log_probs[np.arange(len(y)), y])
        return np.sum(upstream * out)

    if final:
        logits = ref.stage_forward(x, weights, True)[-1]
        loss, upstream = ref.loss_and_gradient(logits, y)
        assert loss == pytest.approx(objective(), rel=1e-12)
    grads, d_x = ref.stage_vjp(x, weights, final, upstream)
    for grad, array in zip(grads + [d_x], weights + [x]):
        np.testing.assert_allclose(grad, _numeric_gradient(objective, array),
                                   rtol=1e-6, atol=1e-8)


# --- sync against plain sequential SGD ----------------------------------------------------


@pytest.mark.parametrize("stage_sizes, momentum, micro_batches, epochs, weight_decay", [
    ((1, 2, 1), 0.9, 1, 1, None),
    ((1, 1, 1, 1), 0.5, 1, 2, None),
    ((2, 2), 0.0, 1, 2, None),
    ((1, 2, 1), 0.9, 2, 2, None),
    ((4,), 0.9, 4, 1, None),
    ((1, 3), 0.9, 1, 2, 0.01),
])
def test_sync_equals_plain_sequential_sgd(stage_sizes, momentum, micro_batches, epochs,
                                          weight_decay):
    params, batches = ref.make_problem(4, LAYERS, 5, 8)
    got, losses = ref.train_reference(params, list(stage_sizes), batches, mode="sync", lr=0.2,
                                      momentum=momentum, epochs=epochs,
                                      micro_batches=micro_batches, weight_decay=weight_decay)
    want, want_losses = _plain_sgd(params, batches, 0.2, momentum, epochs, weight_decay)
    assert _max_diff(got, want) < 1e-10
    np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
    assert _max_diff(got, params) > 1e-2  # training moved the weights


# --- identities between modes -------------------------------------------------------------


@pytest.mark.parametrize("mode, target", ASYNC_CONFIGS)
def test_one_stage_equals_sync(mode, target):
    want, want_losses = _train("sync", stage_sizes=(4,), epochs=2)
    got, losses = _train(mode, target, stage_sizes=(4,), epochs=2)
    assert _max_diff(got, want) < 1e-12
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)


@pytest.mark.parametrize("mode, target, unlike", [
    ("spectrain", "paper", "vanilla"),
    ("spectrain", "consistent", "stash"),
])
def test_without_momentum_predictions_repeat_the_last_step(mode, target, unlike):
    # At momentum 0 the buffer is the last step -lr * g (SPECTRAIN.md's rule taken
    # literally), so SpecTrain still predicts and differs from the unpredicted mode.
    got, _ = _train(mode, target, momentum=0.0, lr=0.5)
    other, _ = _train(unlike, momentum=0.0, lr=0.5)
    assert _max_diff(got, other) > 1e-4


@pytest.mark.parametrize("mode, target", [("sync", "paper")] + ASYNC_CONFIGS)
def test_last_stage_uses_the_same_weights_forward_and_backward(mode, target):
    trace = []
    _train(mode, target, trace=trace)
    used = {}
    for event in trace:
        used.setdefault((event.stage, event.batch), {})[event.kind] = event.weights
    for batch in range(6):
        forward, backward = used[(2, batch)]["F"], used[(2, batch)]["B"]
        assert all(np.array_equal(f, b) for f, b in zip(forward, backward))
    for stage, batch in itertools.product(range(2), range(6)):
        forward, backward = used[(stage, batch)]["F"], used[(stage, batch)]["B"]
        gap = max(np.max(np.abs(f - b)) for f, b in zip(forward, backward))
        if mode == "stash" or target == "consistent":  # B reuses F's weights everywhere
            assert gap == 0.0
        elif mode != "sync" and batch >= 1:  # contrast: earlier stages see two versions
            assert gap > 1e-4, (stage, batch)


def test_vanilla_backward_uses_the_weights_a_later_forward_sees():
    # B(i) and F(i + N - 1 - k) both see exactly i updates (SPECTRAIN.md section 3).
    trace = []
    _train("vanilla", trace=trace)
    used = {(e.stage, e.kind, e.batch): e.weights for e in trace}
    for k in range(3):
        for i in range(6 - (2 - k)):
            backward, forward = used[(k, "B", i)], used[(k, "F", i + 2 - k)]
            assert all(np.array_equal(b, f) for b, f in zip(backward, forward))


@pytest.mark.parametrize("momentum", [0.9, 0.0])
@pytest.mark.parametrize("stage", [0, 1])
def test_prediction_repeats_the_last_real_step(stage, momentum):
    # With N = 3, s_b = 0 on stages 0 and 1, so B(n) uses W^(n) itself. F(j) then uses
    # W^(n) + s_f * m with n = j - (N - 1 - k) and m = W^(n) - W^(n-1), Keras' sign.
    trace = []
    _train("spectrain", momentum=momentum, trace=trace)
    used = {(e.stage, e.kind, e.batch): e.weights for e in trace}
    s_f = {0: 2, 1: 1}[stage]
    lag = 2 - stage
    for j in range(lag + 1, 6):
        n = j - lag
        now, before = used[(stage, "B", n)], used[(stage, "B", n - 1)]
        for got, w, w_prev in zip(used[(stage, "F", j)], now, before):
            np.testing.assert_allclose(got, w + s_f * (w - w_prev), rtol=1e-12, atol=1e-12)


def test_modes_differ_clearly():
    configs = [("sync", "paper")] + ASYNC_CONFIGS
    finals = {config: _train(*config, lr=0.5)[0] for config in configs}
    for a, b in itertools.combinations(configs, 2):
        assert _max_diff(finals[a], finals[b]) > 1e-3, (a, b)


@pytest.mark.parametrize("mode, target", ASYNC_CONFIGS)
def test_result_does_not_depend_on_pick_order(mode, target):
    want, want_losses = _train(mode, target, epochs=2)
    baseline = []
    _train(mode, target, trace=baseline)
    orders = {tuple((e.stage, e.kind, e.batch) for e in baseline)}
    pickers = [max] + [
        (lambda rng: lambda ready: int(rng.choice(ready)))(np.random.default_rng(seed))
        for seed in range(3)
    ]
    for pick in pickers:
        trace = []
        got, losses = _train(mode, target, epochs=2, pick=pick, trace=trace)
        orders.add(tuple((e.stage, e.kind, e.batch) for e in trace if e.epoch == 0))
        assert _max_diff(got, want) == 0.0
        assert losses == want_losses
    assert len(orders) > 2  # the pick orders really interleaved the stages differently


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (dict(mode="gpipe"), "`mode` must be one of"),
    (dict(mode="stash", target="consistent"), "applies to mode 'spectrain' only"),
    (dict(target="future"), "`target` must be one of"),
    (dict(stage_sizes=[1, 2]), "summing to the number of layers \\(4\\)"),
    (dict(stage_sizes=[2, 0, 2]), "`stage_sizes` must be positive ints"),
    (dict(micro_batches=3, mode="sync"), "must divide every batch size"),
    (dict(micro_batches=2), "needs mode 'sync'"),
    (dict(epochs=0), "`epochs` must be a positive int"),
    (dict(momentum=1.5), "momentum=1.5"),
    (dict(batches=[]), "`batches` must be a non-empty list"),
])
def test_bad_arguments_are_named(overrides, message):
    params, batches = ref.make_problem(0, LAYERS, 2, 4)
    kwargs = dict(stage_sizes=[1, 2, 1], batches=batches, mode="spectrain", lr=0.1,
                  momentum=0.9)
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=message):
        ref.train_reference(params, **kwargs)


def test_bad_labels_and_shapes_are_named():
    params, batches = ref.make_problem(0, LAYERS, 2, 4)
    x, y = batches[0]
    with pytest.raises(ValueError, match="labels must be ints in \\[0, 3\\)"):
        ref.train_reference(params, [4], [(x, y + 3)], mode="sync", lr=0.1, momentum=0.0)
    with pytest.raises(ValueError, match="x of shape \\(B, 5\\)"):
        ref.train_reference(params, [4], [(x[:, :2], y)], mode="sync", lr=0.1, momentum=0.0)
    with pytest.raises(ValueError, match="takes 7 inputs but layer 0 gives 8"):
        ref.train_reference([params[0], params[2]], [2], batches, mode="sync", lr=0.1,
                            momentum=0.0)
