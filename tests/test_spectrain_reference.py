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
    (dict(micro_batches=5, mode="sync"), "micro_batches=5, len\\(batches\\[0\\]\\[0\\]\\)=4"),
    (dict(micro_batches=5), "must be at most every mini-batch's size"),
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


# --- micro-batches in every mode (issue 15) ------------------------------------------------


ALL_CONFIGS = [("sync", "paper")] + ASYNC_CONFIGS


def _batches(sizes, seed=0):
    """Mini-batches of the given sizes for LAYERS (the last may be smaller)."""
    _, [(x, y)] = ref.make_problem(seed, LAYERS, 1, sum(sizes))
    bounds = np.cumsum([0] + list(sizes))
    return [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("batch_size, micro_batches, expected", [
    (8, 1, [8]),
    (8, 4, [2, 2, 2, 2]),
    (7, 3, [3, 2, 2]),
    (10, 4, [3, 3, 2, 2]),
    (5, 5, [1, 1, 1, 1, 1]),
    (2, 3, [1, 1, 0]),  # train_reference rejects M > B
])
def test_micro_batch_sizes_first_ones_larger(batch_size, micro_batches, expected):
    assert ref.micro_batch_sizes(batch_size, micro_batches) == expected


@pytest.mark.parametrize("batch_size, micro_batches", [(8, 4), (7, 3), (6, 1)])
def test_split_mini_batch_keeps_the_order_and_weighs_by_size(batch_size, micro_batches):
    [(x, y)] = _batches([batch_size])
    parts = ref.split_mini_batch(x, y, micro_batches)
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    assert [p[2] for p in parts] == [len(p[1]) / batch_size for p in parts]
    assert sum(p[2] for p in parts) == pytest.approx(1.0, abs=1e-15)
    if batch_size % micro_batches == 0:  # an equal split is np.split's
        for part, want in zip(parts, np.split(x, micro_batches)):
            np.testing.assert_array_equal(part[0], want)


# Written by the module before micro-batches existed outside `sync` (commit 65f4b3c), for
# `_train(mode, target, epochs=2)`: sum and sum of squares of every final array, and the
# sum of the losses.
OLD_RESULTS = [
    ("sync", "paper", -1.6516780100136714, 35.11379510393528, 13.579116690358301),
    ("vanilla", "paper", -1.4460555991674462, 36.93535004168396, 13.597277296893246),
    ("stash", "paper", -2.5227324421979573, 34.22663121963789, 13.825937451235866),
    ("spectrain", "paper", 1.2307952202699897, 38.797457576041815, 13.634747167453263),
    ("spectrain", "consistent", -0.7707054141856472, 34.40882502150454, 13.62320423248721),
]


@pytest.mark.parametrize("mode, target, total, squares, loss_sum", OLD_RESULTS)
def test_one_micro_batch_gives_the_old_results(mode, target, total, squares, loss_sum):
    got, losses = _train(mode, target, epochs=2, micro_batches=1)
    default, default_losses = _train(mode, target, epochs=2)
    assert _max_diff(got, default) == 0.0 and losses == default_losses
    arrays = [a for pair in got for a in pair]
    assert sum(np.sum(a) for a in arrays) == pytest.approx(total, rel=1e-12, abs=1e-12)
    assert sum(np.sum(a * a) for a in arrays) == pytest.approx(squares, rel=1e-12)
    assert sum(losses) == pytest.approx(loss_sum, rel=1e-12)
    trace = []
    _train(mode, target, trace=trace)
    assert {e.micro for e in trace} == {0}
    assert len(trace) == 2 * 3 * 6  # one F and one B per stage and mini-batch


@pytest.mark.parametrize("mode, target", ALL_CONFIGS)
@pytest.mark.parametrize("stage_sizes", [(1, 2, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("sizes, micro_batches", [
    ([4] * 6, 2),
    ([4] * 6, 4),  # micro-batches of one example
    ([7] * 5, 3),  # uneven: 3, 2, 2
    ([7] * 5 + [5], 3),  # and a smaller last mini-batch: 2, 2, 1
])
def test_micro_batches_give_the_weights_of_whole_mini_batches(mode, target, stage_sizes,
                                                              sizes, micro_batches):
    # No batch-dependent layer, and every micro-batch of a pass uses that pass's weights:
    # summing the share-weighted gradients gives the mini-batch's gradient.
    params, _ = ref.make_problem(0, LAYERS, 1, 1)
    batches = _batches(sizes)
    kwargs = dict(mode=mode, target=target, lr=0.3, momentum=0.9, epochs=2)
    want, want_losses = ref.train_reference(params, list(stage_sizes), batches, **kwargs)
    got, losses = ref.train_reference(params, list(stage_sizes), batches,
                                      micro_batches=micro_batches, **kwargs)
    assert _max_diff(got, want) < 1e-12
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    assert _max_diff(got, params) > 1e-2  # training moved the weights


@pytest.mark.parametrize("mode, target", ASYNC_CONFIGS)
@pytest.mark.parametrize("stage_sizes", [(1, 2, 1), (1, 1, 1, 1)])
def test_micro_batches_of_a_pass_share_its_weights_and_version(mode, target, stage_sizes):
    rng = np.random.default_rng(2)
    params, _ = ref.make_problem(0, LAYERS, 1, 1)
    trace, num_micro, n = [], 3, len(stage_sizes)
    ref.train_reference(params, list(stage_sizes), _batches([7] * 5 + [5]), mode=mode,
                        target=target, lr=0.3, momentum=0.9, epochs=2,
                        micro_batches=num_micro, trace=trace,
                        pick=lambda ready: int(rng.choice(ready)))
    assert len(trace) == 2 * 2 * n * 6 * num_micro
    passes = {}
    for event in trace:
        passes.setdefault((event.epoch, event.stage, event.kind, event.batch), []).append(event)
    for (epoch, k, kind, i), events in passes.items():
        assert [e.micro for e in events] == list(range(num_micro))
        for event in events:
            assert all(np.array_equal(a, b) for a, b in zip(event.weights, events[0].weights))
            # SPECTRAIN.md section 3, for every micro-batch of the pass.
            want = max(0, i - (n - 1 - k)) if kind == "F" else i
            assert event.updates == want, event[:5] + (event.micro,)
        forward = passes[(epoch, k, "F", i)][0].weights
        same = all(np.array_equal(a, b) for a, b in zip(forward, events[0].weights))
        if mode == "stash" or target == "consistent" or k == n - 1:
            assert same
        elif kind == "B" and i >= 1:
            assert not same  # contrast: the weights do change between F(i) and B(i)
    # Each stage runs a pass's micro-batches back to back, in the section-3 order.
    for k, program in enumerate(ref.stage_instructions(n, 6)):
        order = [(e.kind, e.batch, e.micro) for e in trace if e.stage == k and e.epoch == 0]
        assert order == [(kind, i, j) for kind, i in program for j in range(num_micro)]


def test_micro_batches_are_handed_on_as_they_are_done():
    # A stage hands each micro-batch on as it is done, so neighbouring stages overlap
    # within a mini-batch: preferring the later stage (`pick=max`), stage k + 1 runs F(i, 0)
    # before stage k runs F(i, 1); preferring the earlier one (`pick=min`), stage k - 1
    # runs B(i, 0) before stage k runs B(i, 1).
    for pick, kind, neighbour in ((max, "F", 1), (min, "B", -1)):
        trace = []
        _train("vanilla", micro_batches=2, trace=trace, pick=pick)
        position = {(e.stage, e.kind, e.batch, e.micro): n for n, e in enumerate(trace)}
        stages = range(2) if kind == "F" else range(1, 3)
        for k, i in itertools.product(stages, range(6)):
            assert position[(k + neighbour, kind, i, 0)] < position[(k, kind, i, 1)], (kind, k, i)


def test_sync_trace_has_one_event_per_micro_batch():
    trace = []
    _train("sync", micro_batches=3, num_batches=2, trace=trace)  # 4 examples: 2, 1, 1
    got = [(e.kind, e.batch, e.micro, e.stage) for e in trace]
    want = [(kind, i, j, k) for i in range(2) for j in range(3)
            for kind, stages in (("F", range(3)), ("B", range(2, -1, -1))) for k in stages]
    assert got == want
    assert all(e.updates == e.batch for e in trace)


@pytest.mark.parametrize("mode, target", ASYNC_CONFIGS)
def test_micro_batch_result_does_not_depend_on_pick_order(mode, target):
    want, want_losses = _train(mode, target, micro_batches=3)
    for seed in range(2):
        rng = np.random.default_rng(seed)
        got, losses = _train(mode, target, micro_batches=3,
                             pick=lambda ready, rng=rng: int(rng.choice(ready)))
        assert _max_diff(got, want) == 0.0
        assert losses == want_losses


@pytest.mark.parametrize("micro_batches", [0, -1, 2.0, "2", True, None])
def test_bad_micro_batches_are_named(micro_batches):
    with pytest.raises(ValueError, match="`micro_batches` must be a positive int. "
                                         f"Received: micro_batches={micro_batches!r}"):
        _train("vanilla", micro_batches=micro_batches)


@pytest.mark.parametrize("mode", ["sync", "stash"])
def test_micro_batches_above_a_mini_batch_size_are_named(mode):
    batches = _batches([4, 4, 2])  # the last mini-batch would get an empty micro-batch
    params, _ = ref.make_problem(0, LAYERS, 1, 1)
    with pytest.raises(ValueError, match="micro_batches=3, len\\(batches\\[2\\]\\[0\\]\\)=2"):
        ref.train_reference(params, [1, 2, 1], batches, mode=mode, lr=0.1, momentum=0.9,
                            micro_batches=3)
    ref.train_reference(params, [1, 2, 1], batches, mode=mode, lr=0.1, momentum=0.9,
                        micro_batches=2)  # at most the smallest size is fine


# --- an independent 2-stage vanilla pipeline, without the event loop ----------------------


def _dense(x, layers, logits_last):
    """Forward through Dense layers; returns (pre-activations, layer inputs + output)."""
    pre, post = [], [x]
    for n, (w, b) in enumerate(layers):
        pre.append(post[-1] @ w + b)
        last = logits_last and n == len(layers) - 1
        post.append(pre[-1] if last else np.where(pre[-1] > 0, pre[-1], 0.0))
    return pre, post


def _dense_vjp(pre, post, layers, delta, logits_last):
    grads = [None] * len(layers)
    for n in range(len(layers) - 1, -1, -1):
        if not (logits_last and n == len(layers) - 1):
            delta = np.where(pre[n] > 0, delta, 0.0)
        grads[n] = [post[n].T @ delta, delta.sum(axis=0)]
        delta = delta @ layers[n][0].T
    return grads, delta


def _vanilla_two_stages(params, batches, lr, momentum, micro_batches):
    """SPECTRAIN.md's vanilla mode for N = 2, layers 0-1 on stage 0, written out by hand.

    Stage 1 runs F(i), B(i) back to back at W_1^(i). Stage 0 runs F(i) at
    W_0^(max(0, i - 1)) and B(i) at W_0^(i), recomputing each micro-batch's forward there.
    Micro-batches come from np.array_split (its first `B % M` parts are one larger).
    """
    stages = [[[np.array(a, dtype=np.float64) for a in pair] for pair in params[:2]],
              [[np.array(a, dtype=np.float64) for a in pair] for pair in params[2:]]]
    velocity = [[[np.zeros_like(a) for a in pair] for pair in stage] for stage in stages]
    history = [[[a.copy() for a in pair] for pair in stages[0]]]  # W_0^(n)
    losses = []
    for i, (x, y) in enumerate(batches):
        sums = [None, None]
        loss = 0.0
        for xm, ym in zip(np.array_split(x, micro_batches), np.array_split(y, micro_batches)):
            share = len(ym) / len(y)
            h = _dense(xm, history[max(0, i - 1)], False)[1][-1]  # F(i) on stage 0, stale
            pre, post = _dense(h, stages[1], True)
            logits = pre[-1] - pre[-1].max(axis=1, keepdims=True)
            probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
            loss += share * float(np.mean(-np.log(probs[np.arange(len(ym)), ym])))
            delta = share * (probs - np.eye(probs.shape[1])[ym]) / len(ym)
            grads = [_dense_vjp(pre, post, stages[1], delta, True)]
            grads.insert(0, _dense_vjp(*_dense(xm, stages[0], False), stages[0], grads[0][1],
                                       False))  # B(i) on stage 0 recomputes at W_0^(i)
            for k in range(2):
                g = grads[k][0]
                sums[k] = g if sums[k] is None else [[a + b for a, b in zip(p, q)]
                                                      for p, q in zip(sums[k], g)]
        for stage, vel, total in zip(stages, velocity, sums):
            for pair, vpair, gpair in zip(stage, vel, total):
                for j in range(2):
                    vpair[j] = momentum * vpair[j] - lr * gpair[j]
                    pair[j] = pair[j] + vpair[j]
        history.append([[a.copy() for a in pair] for pair in stages[0]])
        losses.append(loss)
    return [tuple(pair) for stage in stages for pair in stage], losses


def test_micro_batches_match_a_hand_written_vanilla_pipeline():
    params, _ = ref.make_problem(5, LAYERS, 1, 1)
    batches = _batches([7, 7, 7], seed=6)
    whole, whole_losses = _vanilla_two_stages(params, batches, 0.4, 0.9, 1)
    split, split_losses = _vanilla_two_stages(params, batches, 0.4, 0.9, 3)
    assert _max_diff(split, whole) < 1e-13
    np.testing.assert_allclose(split_losses, whole_losses, rtol=1e-13)
    for micro_batches in (1, 3, 7):
        got, losses = ref.train_reference(params, [2, 2], batches, mode="vanilla", lr=0.4,
                                          momentum=0.9, micro_batches=micro_batches)
        assert _max_diff(got, whole) < 1e-12, micro_batches
        np.testing.assert_allclose(losses, whole_losses, rtol=1e-12)
    sync, _ = ref.train_reference(params, [2, 2], batches, mode="sync", lr=0.4, momentum=0.9)
    assert _max_diff(whole, sync) > 1e-3  # contrast: stage 0's stale forward matters


# --- Adam, AdamW, RMSprop and the last-update rule (issue 16, SPECTRAIN.md section 6c) -----


def _network_gradients(weights, x, y):
    """Whole-network backprop of the mean cross-entropy; returns [(dW, db)] per layer."""
    pre, post = _dense(x, weights, True)
    logits = pre[-1] - pre[-1].max(axis=1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    delta = (probs - np.eye(probs.shape[1])[y]) / len(y)
    return _dense_vjp(pre, post, weights, delta, True)[0]


def _plain_adam(params, batches, lr, epochs, weight_decay=None, amsgrad=False,
                beta_1=0.9, beta_2=0.999, eps=1e-7):
    """Sequential Adam in the bias-corrected form, written apart from the reference.

    `W -= lr * m_hat / (sqrt(v_hat) + eps / sqrt(1 - beta_2^t))` is Keras' step
    `lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + eps)` (eps beside `sqrt(v)`,
    the paper's "epsilon hat"), after AdamW's decay `W -= W * wd * lr`.
    """
    weights = [[np.array(a, dtype=np.float64) for a in pair] for pair in params]
    m = [[np.zeros_like(a) for a in pair] for pair in weights]
    v = [[np.zeros_like(a) for a in pair] for pair in weights]
    v_max = [[np.zeros_like(a) for a in pair] for pair in weights]
    t = 0
    for _ in range(epochs):
        for x, y in batches:
            grads = _network_gradients(weights, x, y)
            t += 1
            for n, j in itertools.product(range(len(weights)), range(2)):
                g = grads[n][j]
                if weight_decay is not None:
                    weights[n][j] = weights[n][j] * (1 - weight_decay * lr)
                m[n][j] = beta_1 * m[n][j] + (1 - beta_1) * g
                v[n][j] = beta_2 * v[n][j] + (1 - beta_2) * g ** 2
                v_max[n][j] = np.maximum(v_max[n][j], v[n][j])
                m_hat = m[n][j] / (1 - beta_1 ** t)
                v_hat = (v_max if amsgrad else v)[n][j] / (1 - beta_2 ** t)
                weights[n][j] = weights[n][j] - lr * m_hat / (
                    np.sqrt(v_hat) + eps / np.sqrt(1 - beta_2 ** t))
    return weights


def test_adam_first_two_steps_equal_a_hand_computation():
    # One stage, two mini-batches: Keras' Adam written out per step.
    # Step 1: m = (1 - b1) g1, v = (1 - b2) g1^2, so W1 = W0 - lr g1 / (|g1| + eps / sqrt(1 - b2)).
    # Step 2: m = (1 - b1)(b1 g1 + g2), v = (1 - b2)(b2 g1^2 + g2^2),
    #         W2 = W1 - lr sqrt(1 - b2^2) / (1 - b1^2) m / (sqrt(v) + eps).
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-7
    params, batches = ref.make_problem(8, LAYERS, 2, 6)
    w0 = [list(pair) for pair in params]
    g1 = _network_gradients(w0, *batches[0])
    w1 = [[w - lr * g / (np.abs(g) + eps / np.sqrt(1 - b2)) for w, g in zip(pw, pg)]
          for pw, pg in zip(w0, g1)]
    g2 = _network_gradients(w1, *batches[1])
    w2 = []
    for pw, pg1, pg2 in zip(w1, g1, g2):
        layer = []
        for w, a, b in zip(pw, pg1, pg2):
            m, v = (1 - b1) * (b1 * a + b), (1 - b2) * (b2 * a * a + b * b)
            layer.append(w - lr * np.sqrt(1 - b2 ** 2) / (1 - b1 ** 2) * m / (np.sqrt(v) + eps))
        w2.append(layer)
    for steps, want in ((1, w1), (2, w2)):
        got, _ = ref.train_reference(params, [4], batches[:steps], mode="sync", lr=lr,
                                     optimizer="adam")
        assert _max_diff(got, want) < 1e-14
    assert _max_diff(w2, params) > 1e-2


@pytest.mark.parametrize("optimizer, weight_decay, amsgrad, stage_sizes, micro_batches, epochs", [
    ("adam", None, False, (1, 2, 1), 1, 1),
    ("adam", None, False, (1, 1, 1, 1), 2, 2),
    ("adamw", 0.05, False, (1, 2, 1), 1, 2),
    ("adam", 0.05, False, (4,), 4, 1),  # Keras' Adam takes a weight decay too
    ("adam", None, True, (1, 3), 1, 3),
    ("adamw", 0.05, True, (2, 2), 2, 2),
])
def test_sync_adam_equals_plain_sequential_adam(optimizer, weight_decay, amsgrad, stage_sizes,
                                                micro_batches, epochs):
    params, batches = ref.make_problem(4, LAYERS, 5, 8)
    got, _ = ref.train_reference(params, list(stage_sizes), batches, mode="sync", lr=0.02,
                                 epochs=epochs, micro_batches=micro_batches,
                                 weight_decay=weight_decay, optimizer=optimizer,
                                 amsgrad=amsgrad)
    want = _plain_adam(params, batches, 0.02, epochs, weight_decay, amsgrad)
    assert _max_diff(got, want) < 1e-10
    assert _max_diff(got, params) > 1e-2  # training moved the weights


def test_amsgrad_and_weight_decay_change_the_result():
    # Contrast for the table above: each option alone moves the weights measurably.
    params, batches = ref.make_problem(4, LAYERS, 5, 8)
    base = _plain_adam(params, batches, 0.02, 3)
    assert _max_diff(_plain_adam(params, batches, 0.02, 3, amsgrad=True), base) > 1e-4
    assert _max_diff(_plain_adam(params, batches, 0.02, 3, weight_decay=0.05), base) > 1e-4


def _plain_rmsprop(params, batches, lr, rho=0.9, eps=1e-7):
    """Sequential Keras RMSprop (no momentum, not centred), written apart from the reference."""
    weights = [[np.array(a, dtype=np.float64) for a in pair] for pair in params]
    v = [[np.zeros_like(a) for a in pair] for pair in weights]
    for x, y in batches:
        grads = _network_gradients(weights, x, y)
        for n, j in itertools.product(range(len(weights)), range(2)):
            v[n][j] = rho * v[n][j] + (1 - rho) * grads[n][j] ** 2
            weights[n][j] = weights[n][j] - lr * grads[n][j] / np.sqrt(v[n][j] + eps)
    return weights


def test_sync_rmsprop_equals_plain_sequential_rmsprop():
    params, batches = ref.make_problem(4, LAYERS, 5, 8)
    got, _ = ref.train_reference(params, [1, 2, 1], batches, mode="sync", lr=0.01,
                                 optimizer="rmsprop")
    assert _max_diff(got, _plain_rmsprop(params, batches, 0.01)) < 1e-10


# With N = 3, s_b = 0 on stages 0 and 1, so B(n) sees W^(n) itself, and F(j) uses
# W^(n) + s_f * d with n = j - (N - 1 - k) updates done. Section 6c's d, as a multiple of
# the last update u = W^(n) - W^(n-1) (constant rate unless noted):
# - Adam: d is the step at update n re-evaluated with the same rate: d = u.
# - AdamW: u = a - lr wd W^(n-1) and d = a - lr wd W^(n), so d = (1 - lr wd) u.
# - a schedule: d uses the rate of update n + 1: d = lr(n) / lr(n - 1) * u (no decay).
# - last_update (any optimizer), RMSprop: d = u.
def _schedule(step):
    return 0.02 / (1 + 0.5 * step)


@pytest.mark.parametrize("optimizer, weight_decay, amsgrad, lr, direction, factor", [
    ("adam", None, False, 0.02, "auto", lambda n: 1.0),
    ("adam", None, True, 0.02, "auto", lambda n: 1.0),
    ("adamw", 0.1, False, 0.02, "auto", lambda n: 1 - 0.02 * 0.1),
    ("adamw", 0.1, True, 0.02, "auto", lambda n: 1 - 0.02 * 0.1),
    ("adam", None, False, _schedule, "auto", lambda n: _schedule(n) / _schedule(n - 1)),
    ("adamw", 0.1, False, 0.02, "last_update", lambda n: 1.0),
    ("adam", None, False, _schedule, "last_update", lambda n: 1.0),
    ("rmsprop", None, False, 0.01, "auto", lambda n: 1.0),
    ("sgd", 0.01, False, 0.3, "last_update", lambda n: 1.0),
])
@pytest.mark.parametrize("stage", [0, 1])
def test_prediction_follows_the_rule_of_section_6c(stage, optimizer, weight_decay, amsgrad, lr,
                                                  direction, factor):
    trace = []
    params, batches = ref.make_problem(0, LAYERS, 6, 4)
    ref.train_reference(params, [1, 2, 1], batches, mode="spectrain", lr=lr,
                        momentum=0.9 if optimizer == "sgd" else None, optimizer=optimizer,
                        weight_decay=weight_decay, amsgrad=amsgrad, direction=direction,
                        trace=trace)
    used = {(e.stage, e.kind, e.batch): e.weights for e in trace}
    s_f, lag = {0: 2, 1: 1}[stage], 2 - stage
    for j in range(lag + 1):  # no update yet: d = 0, W_hat = W^(0)
        assert all(np.array_equal(a, b) for a, b in zip(used[(stage, "F", j)],
                                                      used[(stage, "B", 0)]))
    for j in range(lag + 1, 6):
        n = j - lag
        now, before = used[(stage, "B", n)], used[(stage, "B", n - 1)]
        for got, w, w_prev in zip(used[(stage, "F", j)], now, before):
            np.testing.assert_allclose(got, w + s_f * factor(n) * (w - w_prev),
                                       rtol=1e-12, atol=1e-14)
        assert max(np.max(np.abs(w - w_prev)) for w, w_prev in zip(now, before)) > 1e-4


@pytest.mark.parametrize("mode, target", ALL_CONFIGS)
def test_one_stage_adam_equals_sync_in_every_mode(mode, target):
    # On a single stage every gap is 0, so no mode predicts or goes stale.
    params, batches = ref.make_problem(0, LAYERS, 6, 4)
    kwargs = dict(lr=0.02, optimizer="adamw", weight_decay=0.1, epochs=2)
    want, _ = ref.train_reference(params, [4], batches, mode="sync", **kwargs)
    got, _ = ref.train_reference(params, [4], batches, mode=mode, target=target, **kwargs)
    assert _max_diff(got, want) < 1e-12


def _adam_run(mode, target="paper", stage_sizes=(1, 1, 1, 1), **kwargs):
    params, batches = ref.make_problem(0, LAYERS, 6, 4)
    options = dict(lr=0.02, optimizer="adamw", weight_decay=0.1, epochs=2)
    options.update(kwargs)
    return ref.train_reference(params, list(stage_sizes), batches, mode=mode, target=target,
                               **options)[0]


def test_adam_modes_differ_clearly():
    # Each mode changes the result: the comparisons of the real pipeline with this
    # reference can tell them apart.
    finals = {config: _adam_run(*config) for config in ALL_CONFIGS}
    for a, b in itertools.combinations(finals, 2):
        assert _max_diff(finals[a], finals[b]) > 1e-3, (a, b)


def test_adam_rule_and_last_update_rule_differ_only_by_rate_and_decay():
    # At a constant rate and without decay, Adam's d is its last step (d = u above), so the
    # two rules give the same training; a decaying schedule or AdamW's decay parts them.
    for target in ref.TARGETS:
        same = [_adam_run("spectrain", target, optimizer="adam", weight_decay=None,
                          direction=direction) for direction in ref.DIRECTIONS]
        assert _max_diff(*same) < 1e-12
        for options in (dict(lr=lambda step: 0.04 / (1 + step)),
                        dict(weight_decay=2.0, lr=0.05)):
            runs = [_adam_run("spectrain", target, direction=direction, **options)
                    for direction in ref.DIRECTIONS]
            assert _max_diff(*runs) > 1e-3, (target, options)


@pytest.mark.parametrize("mode, target", ASYNC_CONFIGS)
def test_adam_result_does_not_depend_on_pick_order(mode, target):
    want = _adam_run(mode, target, micro_batches=2)
    rng = np.random.default_rng(0)
    got = _adam_run(mode, target, micro_batches=2, pick=lambda ready: int(rng.choice(ready)))
    assert _max_diff(got, want) == 0.0


@pytest.mark.parametrize("mode, target", ALL_CONFIGS)
def test_adam_micro_batches_give_the_weights_of_whole_mini_batches(mode, target):
    # The summed share-weighted gradients are the mini-batch's; Adam sees the same sums.
    params, _ = ref.make_problem(0, LAYERS, 1, 1)
    batches = _batches([7] * 5 + [5])
    kwargs = dict(mode=mode, target=target, lr=0.02, optimizer="adamw", weight_decay=0.1,
                  epochs=2)
    want, _ = ref.train_reference(params, [1, 2, 1], batches, **kwargs)
    got, _ = ref.train_reference(params, [1, 2, 1], batches, micro_batches=3, **kwargs)
    assert _max_diff(got, want) < 1e-10
    assert _max_diff(got, params) > 1e-2


@pytest.mark.parametrize("overrides, message", [
    (dict(optimizer="adamz"), "`optimizer` must be one of .*Received: optimizer='adamz'"),
    (dict(optimizer="adam", direction="momentum"), "Received: direction='momentum'"),
    (dict(optimizer="sgd", momentum=None), "`momentum` is required with optimizer 'sgd'"),
    (dict(optimizer="adam", momentum=0.9),
     "applies to optimizer 'sgd' only. Received: momentum=0.9, optimizer='adam'"),
    (dict(optimizer="adamw"), "needs a float `weight_decay`.*Received: weight_decay=None"),
    (dict(optimizer="rmsprop", amsgrad=True), "amsgrad=True, optimizer='rmsprop'"),
])
def test_bad_optimizer_arguments_are_named(overrides, message):
    params, batches = ref.make_problem(0, LAYERS, 2, 4)
    kwargs = dict(stage_sizes=[1, 2, 1], batches=batches, mode="spectrain", lr=0.1)
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=message):
        ref.train_reference(params, **kwargs)
