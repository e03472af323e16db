"""An independent NumPy reference of SPECTRAIN.md, for an MLP, used to check the real pipeline.

This module knows nothing of TensorFlow or of `tf_spectrain`: it re-derives the training
semantics of `/work/shared/SPECTRAIN.md` from the page alone, so that the library's pipeline
can be compared with it to float tolerance.

The network is a stack of Dense layers as in Keras, `y = x @ W + b` with `W` of shape
`(in, out)`, ReLU after every layer except the last, which gives logits. The loss is the batch
mean of softmax cross-entropy with integer labels (Keras
`SparseCategoricalCrossentropy(from_logits=True)`). Everything runs in float64.

Vocabulary (as in SPECTRAIN.md): `N` stages, stage `k`; `T` mini-batches per epoch,
mini-batch `i`; `F(i)` / `B(i)` forward / backward passes; `s` a version gap.

The asynchronous modes are simulated by an event loop over the per-stage instruction lists
of section 3: at each step it runs one stage whose next instruction has its inputs ready.
Which ready stage runs is chosen by `pick`; the result must not depend on it.

Micro-batches (`micro_batches = M`, every mode): mini-batch i of B examples is split, in
order, into M parts of sizes `B // M + (1 if j < B % M else 0)` (`micro_batch_sizes`), and
part j's loss weighs its share `b_j / B`, so the summed gradient is that of the mini-batch's
mean loss. In the asynchronous modes the schedule's unit stays the mini-batch: `F(i)` and
`B(i)` of a stage run the M micro-batches of i back to back, handing each on as it is done
(the event loop runs micro-batch passes, so neighbouring stages overlap within a
mini-batch); one update follows the last micro-batch of `B(i)`. Every micro-batch of a pass
therefore uses the weights that pass uses at `M = 1`; where the backward recomputes the
forward (vanilla, paper SpecTrain), each micro-batch recomputes its own.

The optimizer is Keras' SGD (nesterov off) by default: optional decoupled weight decay
`W = W - W * wd * lr`, then `m = momentum * m - lr * g; W = W + m`. At momentum 0 the buffer
holds the last step `-lr * g` (Keras keeps no buffer there, with the same weights), so one
predicted step still equals one real step, as SPECTRAIN.md section 4 states.

`optimizer="adam"` / `"adamw"` is Keras' Adam (docs/SPECTRAIN.md section 6c; Keras'
`adam.py`): at an update with `t = iterations + 1`, after the optional decoupled decay
`W = W - W * wd * lr` (`"adamw"` needs `weight_decay`), `m = m + (g - m)(1 - beta_1)`,
`v = v + (g^2 - v)(1 - beta_2)` (`amsgrad`: `v_hat = max(v_hat, v)` takes v's place) and
`W = W - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + eps)`. `"rmsprop"` is Keras'
RMSprop without momentum or centring: `v = rho v + (1 - rho) g^2; W = W - lr g / sqrt(v + eps)`.
The prediction is `W_hat = W + s * d` with section 6c's `d`: SGD's `m`; Adam's step re-evaluated
at the current count `t` and rate, `d = -lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + eps)
- lr wd W` (0 at `t = 0`); for RMSprop, or with `direction="last_update"`, the last applied
update `W_after - W_before` (0 before the first).
"""

import collections

import numpy as np

MODES = ("sync", "vanilla", "stash", "spectrain", "nesterov", "2bw")
TARGETS = ("paper", "consistent")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "nadam")
DIRECTIONS = ("auto", "last_update")

Rule = collections.namedtuple(
    "Rule", ["optimizer", "direction", "beta_1", "beta_2", "epsilon", "amsgrad", "rho",
             "momentum_decay"],
    defaults=("sgd", "auto", 0.9, 0.999, 1e-7, False, 0.9, 1.0),
)
Rule.__doc__ = """A stage optimizer's kind and constants (Keras' defaults), and its prediction rule.

Fields: `optimizer` in OPTIMIZERS; `direction` "auto" (section 6c's rule for the optimizer)
or "last_update"; Adam's `beta_1`, `beta_2`, `epsilon`, `amsgrad`; RMSprop's `rho` (and
`epsilon`); NAdam's `momentum_decay` (1.0: Keras' Nadam; 0.004: PyTorch's NAdam).
"""

Event = collections.namedtuple(
    "Event", ["epoch", "stage", "kind", "batch", "updates", "weights", "micro"],
    defaults=(0,),
)
Event.__doc__ = """One pass recorded by `train_reference(..., trace=[])`.

Fields: `epoch`; `stage` k; `kind` "F" or "B"; `batch` i (the mini-batch index in the epoch);
`updates`, the number of updates the stage had finished in this epoch before the pass;
`weights`, a tuple of copies of the arrays the pass used, `(W, b)` per layer, flattened;
`micro` j, the micro-batch of mini-batch i the pass ran (0..M-1; always 0 at `M = 1`,
and 0 when an `Event` is built without it). With `M` micro-batches there is one event per
micro-batch pass, so `(epoch, stage, kind, batch, micro)` identifies a pass.
"""


# --- schedule (pure) ----------------------------------------------------------------------


def stage_instructions(num_stages, num_batches):
    """Per-stage instruction lists of the asynchronous 1F1B schedule (SPECTRAIN.md section 3).

    Stage k runs `F(0) .. F(w_k - 1)`, then for each i: `B(i)`, `F(i + w_k)` (if it exists),
    with `w_k = min(N - k, T)` warm-up forwards.

    Args:
        num_stages: N, a positive int.
        num_batches: T, a positive int.

    Returns:
        A list of N lists of `(kind, i)` tuples, `kind` in {"F", "B"}.
    """
    programs = []
    for k in range(num_stages):
        warmup = min(num_stages - k, num_batches)
        program = [("F", i) for i in range(warmup)]
        for i in range(num_batches):
            program.append(("B", i))
            if i + warmup < num_batches:
                program.append(("F", i + warmup))
        programs.append(program)
    return programs


def version_gaps(num_stages, stage, target="paper"):
    """SpecTrain's version gaps `(s_f, s_b)` for one stage.

    Args:
        num_stages: N.
        stage: k, 0-based, k = 0 at the input.
        target: "paper" (`s_f = k // 2 + N - 1 - k`, `s_b = k // 2`) or "consistent"
            (`s_f = N - 1 - k`; the backward reuses the forward's weights, so `s_b = s_f`).

    Returns:
        A pair of ints `(s_f, s_b)`.
    """
    if target == "consistent":
        gap = num_stages - 1 - stage
        return gap, gap
    return stage // 2 + num_stages - 1 - stage, stage // 2


def micro_batch_sizes(batch_size, micro_batches):
    """Sizes of the micro-batches of one mini-batch, in order: the first ones larger.

    Args:
        batch_size: B, the mini-batch's number of examples.
        micro_batches: M, a positive int.

    Returns:
        A list of M ints `B // M + (1 if j < B % M else 0)`, summing to B (some are 0 when
        M > B; `train_reference` rejects that).
    """
    return [batch_size // micro_batches + (1 if j < batch_size % micro_batches else 0)
            for j in range(micro_batches)]


def split_mini_batch(x, y, micro_batches):
    """Splits a mini-batch, in order, into micro-batches sized by `micro_batch_sizes`.

    Args:
        x: (B, in) array of features.
        y: (B,) array of labels.
        micro_batches: M, a positive int, at most B.

    Returns:
        A list of M triples `(x_j, y_j, share_j)`, `share_j = b_j / B` the weight of part j's
        mean loss in the mini-batch's mean loss (1.0 exactly at M = 1).
    """
    parts, start = [], 0
    for size in micro_batch_sizes(len(x), micro_batches):
        parts.append((x[start:start + size], y[start:start + size], size / len(x)))
        start += size
    return parts


# --- the network, one stage at a time -----------------------------------------------------


def stage_forward(x, weights, final):
    """Runs one stage: Dense layers with ReLU after each, except after the network's last.

    Args:
        x: (B, in) array, the stage input.
        weights: flat list `[W0, b0, W1, b1, ...]` of the stage's layers.
        final: whether this stage holds the network's last layer (no ReLU after it).

    Returns:
        A list of activations: the input first, then each layer's output.
    """
    acts = [x]
    num_layers = len(weights) // 2
    for layer in range(num_layers):
        w, b = weights[2 * layer], weights[2 * layer + 1]
        z = acts[-1] @ w + b
        if not (final and layer == num_layers - 1):
            z = np.maximum(z, 0.0)
        acts.append(z)
    return acts


def loss_and_gradient(logits, labels):
    """Mean softmax cross-entropy with integer labels and its gradient w.r.t. the logits.

    Args:
        logits: (B, C) array.
        labels: (B,) int array.

    Returns:
        `(loss, d_logits)`: the batch-mean loss (float) and a (B, C) array.
    """
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(len(labels))
    loss = -log_probs[rows, labels].mean()
    d_logits = np.exp(log_probs)
    d_logits[rows, labels] -= 1.0
    return float(loss), d_logits / len(labels)


def stage_vjp(x, weights, final, upstream):
    """Vector-Jacobian product of one stage, recomputing its forward at `weights`.

    Args:
        x: (B, in) array, the stage input.
        weights: flat list `[W0, b0, ...]` at which the stage function is differentiated.
        final: whether this stage holds the network's last layer.
        upstream: the gradient w.r.t. the stage output (for the last stage: w.r.t. the
            logits, e.g. from `loss_and_gradient`).

    Returns:
        `(grads, d_x)`: grads as a flat list matching `weights`, and the gradient w.r.t. `x`.
    """
    acts = stage_forward(x, weights, final)
    num_layers = len(weights) // 2
    grads = [None] * len(weights)
    delta = upstream
    for layer in reversed(range(num_layers)):
        if not (final and layer == num_layers - 1):
            delta = delta * (acts[layer + 1] > 0.0)
        grads[2 * layer] = acts[layer].T @ delta
        grads[2 * layer + 1] = delta.sum(axis=0)
        delta = delta @ weights[2 * layer].T
    return grads, delta


# --- per-stage optimizer state ------------------------------------------------------------


class _Stage:
    """One stage's weights, optimizer slots (SGD's momentum, Adam's moments) and counts."""

    def __init__(self, weights, final, rule=None):
        self.weights = [np.array(w, dtype=np.float64) for w in weights]
        self.momentum = [np.zeros_like(w) for w in self.weights]  # SGD's m, Adam's m
        self.velocity = [np.zeros_like(w) for w in self.weights]  # Adam's / RMSprop's v
        self.velocity_hat = [np.zeros_like(w) for w in self.weights]  # amsgrad's max of v
        self.last_update = [np.zeros_like(w) for w in self.weights]  # W_after - W_before
        self.final = final
        self.rule = rule or Rule()
        self.updates = 0  # updates finished in the current epoch
        self.iterations = 0  # updates finished in the whole run (Keras' `iterations`)
        # Mode "nesterov" (SPECTRAIN.md 6e): Nesterov steps with this stage's coefficient.
        self.nesterov, self.coefficient = False, None
        self.u_product = 1.0  # NAdam's running product of its momentum schedule

    def predicted(self, gap, lr=None, weight_decay=None):
        """Returns `cur + gap * d` as new arrays (copies of `cur` when gap is 0).

        `lr` (the rate of the stage's next update) and `weight_decay` enter Adam's `d` only.
        """
        if self.rule.optimizer == "sgd" and self.rule.direction == "auto":
            return [w + gap * m for w, m in zip(self.weights, self.momentum)]
        if gap == 0:
            return [np.array(w) for w in self.weights]
        return [w + gap * d for w, d in zip(self.weights, self.directions(lr, weight_decay))]

    def directions(self, lr, weight_decay=None):
        """SPECTRAIN.md section 6c's `d` for each weight, from the state as it stands.

        Adam's `d` uses the rate `lr` of the next update and the decay `weight_decay`.
        """
        rule = self.rule
        if rule.direction == "last_update" or rule.optimizer == "rmsprop":
            return [np.array(u) for u in self.last_update]
        if rule.optimizer == "sgd":
            return [np.array(m) for m in self.momentum]
        t = self.iterations
        if t == 0:
            return [np.zeros_like(w) for w in self.weights]
        alpha = lr * np.sqrt(1 - rule.beta_2 ** t) / (1 - rule.beta_1 ** t)
        second = self.velocity_hat if rule.amsgrad else self.velocity
        ds = [-alpha * m / (np.sqrt(v) + rule.epsilon) for m, v in zip(self.momentum, second)]
        if weight_decay is not None:
            ds = [d - lr * weight_decay * w for d, w in zip(ds, self.weights)]
        return ds

    def apply(self, grads, lr, momentum, weight_decay, clip=None, scale=1.0):
        """Applies one step of the stage's optimizer (Keras SGD by default) to the weights.

        `clip` is `("clipnorm", c)` or `("clipvalue", c)` (per variable, as Keras clips);
        `scale` multiplies every gradient first (the global-norm clip's factor).
        """
        grads = [g * scale for g in grads]
        if clip is not None and clip[0] == "clipnorm":
            grads = [g * clip[1] / max(np.sqrt(np.sum(g * g)), clip[1]) for g in grads]
        elif clip is not None and clip[0] == "clipvalue":
            grads = [np.clip(g, -clip[1], clip[1]) for g in grads]
        before = [np.array(w) for w in self.weights]
        if self.rule.optimizer == "sgd":
            mu = momentum if self.coefficient is None else self.coefficient
            self._sgd_step(grads, lr, mu, weight_decay)
        elif self.rule.optimizer == "nadam" or self.nesterov:
            self._nadam_step(grads, lr, weight_decay)
        elif self.rule.optimizer == "rmsprop":
            self._rmsprop_step(grads, lr, weight_decay)
        else:
            self._adam_step(grads, lr, weight_decay)
        for u, w, w_before in zip(self.last_update, self.weights, before):
            u[...] = w - w_before
        self.updates += 1
        self.iterations += 1

    def _sgd_step(self, grads, lr, momentum, weight_decay):
        """Keras SGD (Nesterov's step in mode "nesterov"), decoupled weight decay first."""
        for w, m, g in zip(self.weights, self.momentum, grads):
            if weight_decay is not None:
                w -= w * weight_decay * lr
            # SPECTRAIN.md's rule, literally, also at momentum 0: the buffer then holds the
            # last step (-lr * g), so one predicted step still equals one real step.
            m[...] = m * momentum - g * lr
            w += m * momentum - g * lr if self.nesterov else m

    def _nadam_step(self, grads, lr, weight_decay):
        """NAdam as Keras' Nadam writes it, with the schedule
        `mu_t = beta_1 (1 - 0.5 * 0.96^(momentum_decay * t))`; decoupled weight decay first."""
        rule, t = self.rule, self.iterations + 1
        beta_1 = rule.beta_1 if self.coefficient is None else self.coefficient
        mu_t = beta_1 * (1 - 0.5 * 0.96 ** (rule.momentum_decay * t))
        mu_next = beta_1 * (1 - 0.5 * 0.96 ** (rule.momentum_decay * (t + 1)))
        self.u_product *= mu_t
        product, product_next = self.u_product, self.u_product * mu_next
        for w, m, v, g in zip(self.weights, self.momentum, self.velocity, grads):
            if weight_decay is not None:
                w -= w * weight_decay * lr
            m += (g - m) * (1 - beta_1)
            v += (g * g - v) * (1 - rule.beta_2)
            m_hat = mu_next * m / (1 - product_next) + (1 - mu_t) * g / (1 - product)
            v_hat = v / (1 - rule.beta_2 ** t)
            w -= m_hat * lr / (np.sqrt(v_hat) + rule.epsilon)

    def _adam_step(self, grads, lr, weight_decay):
        """Keras Adam (adam.py's update_step), decoupled weight decay first (AdamW)."""
        rule, t = self.rule, self.iterations + 1
        alpha = lr * np.sqrt(1 - rule.beta_2 ** t) / (1 - rule.beta_1 ** t)
        for n, (w, m, v, g) in enumerate(zip(self.weights, self.momentum, self.velocity,
                                             grads)):
            if weight_decay is not None:
                w -= w * weight_decay * lr
            m += (g - m) * (1 - rule.beta_1)
            v += (g * g - v) * (1 - rule.beta_2)
            if rule.amsgrad:
                self.velocity_hat[n][...] = np.maximum(self.velocity_hat[n], v)
                v = self.velocity_hat[n]
            w -= m * alpha / (np.sqrt(v) + rule.epsilon)

    def _rmsprop_step(self, grads, lr, weight_decay):
        """Keras RMSprop without momentum or centring, decoupled weight decay first."""
        rho, eps = self.rule.rho, self.rule.epsilon
        for w, v, g in zip(self.weights, self.velocity, grads):
            if weight_decay is not None:
                w -= w * weight_decay * lr
            v[...] = rho * v + (1 - rho) * (g * g)
            w -= lr * g / np.sqrt(v + eps)


# --- execution ----------------------------------------------------------------------------


def _weights_for(opts, stage, k, num_stages, kind, stashed):
    """The weights a pass uses, per the mode table of SPECTRAIN.md section 4."""
    mode, target = opts["mode"], opts["target"]
    stashing = (mode in ("stash", "nesterov", "2bw")
                or (mode == "spectrain" and target == "consistent"))
    if kind == "B" and stashing:
        return stashed
    if mode == "spectrain":
        s_f, s_b = version_gaps(num_stages, k, target)
        # Section 6c: `d` uses the rate of the stage's next update, its number `iterations`.
        return stage.predicted(s_f if kind == "F" else s_b, _rate(opts, stage.iterations),
                               opts["weight_decay"])
    return stage.predicted(0)  # vanilla, stash forward: the current weights


def nesterov_coefficient(base, k, num_stages):
    """Stage k's momentum (SGD) or `beta_1` (NAdam) in mode "nesterov" (SPECTRAIN.md 6e):
    `base + s_k (0.99 - base) / N` with the delay `s_k = N - 1 - k`; `base` from 0.99 up."""
    if base >= 0.99:
        return base
    return base + (num_stages - 1 - k) * (0.99 - base) / num_stages


def _record(trace, epoch, k, kind, i, stage, weights, micro=0):
    if trace is not None:
        copies = tuple(np.array(w) for w in weights)
        trace.append(Event(epoch, k, kind, i, stage.updates, copies, micro))


def _run_pipeline_epoch(stages, batches, epoch, opts, pick, trace):
    """Runs one epoch of the asynchronous pipeline with an event loop; returns the losses.

    The loop's unit is a micro-batch pass `(kind, i, j)`: each pass `(kind, i)` of section 3
    becomes its M micro-batch passes, back to back, and the update follows `(B, i, M - 1)`.
    """
    num_stages, num_batches = len(stages), len(batches)
    num_micro = opts["micro_batches"]
    parts = [split_mini_batch(x, y, num_micro) for x, y in batches]
    programs = [[(kind, i, j) for kind, i in program for j in range(num_micro)]
                for program in stage_instructions(num_stages, num_batches)]
    position = [0] * num_stages
    inputs = [dict() for _ in range(num_stages)]  # x_k(i, j), kept from F(i) until B(i)
    grads_in = [dict() for _ in range(num_stages)]  # d_k(i, j), from stage k + 1
    stashed = [dict() for _ in range(num_stages)]  # forward weights, where B reuses them
    sums = [dict() for _ in range(num_stages)]  # gradient of B(i), summed over micro-batches
    groups = [[] for _ in range(num_stages)]  # 2bw: the gradients of the group so far
    losses = [0.0] * num_batches
    inputs[0] = {(i, j): part[0] for i in range(num_batches) for j, part in enumerate(parts[i])}
    for stage in stages:
        stage.updates = 0

    def ready(k):
        if position[k] == len(programs[k]):
            return False
        kind, i, j = programs[k][position[k]]
        if kind == "F":
            return (i, j) in inputs[k]
        return k == num_stages - 1 or (i, j) in grads_in[k]

    while any(position[k] < len(programs[k]) for k in range(num_stages)):
        candidates = [k for k in range(num_stages) if ready(k)]
        if not candidates:
            raise RuntimeError(f"Schedule deadlock at positions {position}.")
        k = pick(candidates)
        if k not in candidates:
            raise ValueError(
                f"`pick` must return one of the ready stages {candidates}. Received: {k!r}"
            )
        kind, i, j = programs[k][position[k]]
        position[k] += 1
        stage = stages[k]
        # Chosen anew for every micro-batch: no update falls inside a pass, so each
        # micro-batch of F(i) (of B(i)) gets the weights F(i) (B(i)) has at M = 1.
        weights = _weights_for(opts, stage, k, num_stages, kind, stashed[k].get(i))
        _record(trace, epoch, k, kind, i, stage, weights, j)
        _, labels, share = parts[i][j]
        if kind == "F":
            if j == 0:
                stashed[k][i] = weights
            out = stage_forward(inputs[k][(i, j)], weights, stage.final)[-1]
            if stage.final:
                losses[i] += share * loss_and_gradient(out, labels)[0]
            else:
                inputs[k + 1][(i, j)] = out
            continue
        if stage.final:
            logits = stage_forward(inputs[k][(i, j)], weights, True)[-1]
            upstream = share * loss_and_gradient(logits, labels)[1]
        else:
            upstream = grads_in[k].pop((i, j))
        grads, d_x = stage_vjp(inputs[k].pop((i, j)), weights, stage.final, upstream)
        if k > 0:
            grads_in[k - 1][(i, j)] = d_x
        sums[k][i] = grads if j == 0 else [a + g for a, g in zip(sums[k][i], grads)]
        if j < num_micro - 1:
            continue
        del stashed[k][i]
        grads = sums[k].pop(i)
        if opts["mode"] == "2bw":  # SPECTRAIN.md 6e: the mean of A mini-batches' gradients
            groups[k].append(grads)
            if (i + 1) % opts["accumulate"] and i < num_batches - 1:
                continue
            grads = [sum(parts) / len(groups[k]) for parts in zip(*groups[k])]
            groups[k].clear()
        stage.apply(grads, _rate(opts, epoch * num_batches + i), opts["momentum"],
                    opts["weight_decay"], opts["clip"])
    return losses


def _rate(opts, step):
    """The learning rate of the updates of mini-batch `step` (counted over all epochs)."""
    return opts["lr"](step) if callable(opts["lr"]) else opts["lr"]


def _run_sync_epoch(stages, batches, epoch, opts, trace):
    """Sequential SGD: each mini-batch (as M micro-batches) through all stages, then updates.

    Micro-batch j's loss weighs its share `b_j / B` (scaling its logits' gradient), and the
    stages sum the micro-batches' gradients.
    """
    losses = []
    num_micro = opts["micro_batches"]
    for stage in stages:
        stage.updates = 0
    for i, (x, y) in enumerate(batches):
        sums = [None] * len(stages)
        batch_loss = 0.0
        for j, (xm, ym, share) in enumerate(split_mini_batch(x, y, num_micro)):
            stage_inputs = [xm]
            for k, stage in enumerate(stages):
                _record(trace, epoch, k, "F", i, stage, stage.weights, j)
                stage_inputs.append(stage_forward(stage_inputs[-1], stage.weights, stage.final)[-1])
            loss, upstream = loss_and_gradient(stage_inputs[-1], ym)
            batch_loss += share * loss
            upstream = share * upstream
            for k in reversed(range(len(stages))):
                _record(trace, epoch, k, "B", i, stages[k], stages[k].weights, j)
                grads, upstream = stage_vjp(stage_inputs[k], stages[k].weights,
                                            stages[k].final, upstream)
                sums[k] = grads if sums[k] is None else [a + g for a, g in zip(sums[k], grads)]
        scale, clip = 1.0, opts["clip"]
        if clip is not None and clip[0] == "global_clipnorm":  # one norm over all stages
            norm = np.sqrt(sum(np.sum(g * g) for total in sums for g in total))
            scale, clip = clip[1] / max(norm, clip[1]), None
        for stage, total in zip(stages, sums):
            stage.apply(total, _rate(opts, epoch * len(batches) + i), opts["momentum"],
                        opts["weight_decay"], clip, scale)
        losses.append(batch_loss)
    return losses


# --- validation ---------------------------------------------------------------------------


def _check_params(params):
    if not isinstance(params, (list, tuple)) or not params:
        raise ValueError(f"`params` must be a non-empty list of (W, b) pairs. Received: {params!r}")
    for layer, pair in enumerate(params):
        if len(pair) != 2:
            raise ValueError(
                f"`params[{layer}]` must be a (W, b) pair. Received {len(pair)} items."
            )
        w, b = np.asarray(pair[0]), np.asarray(pair[1])
        if w.ndim != 2 or b.shape != (w.shape[1],):
            raise ValueError(
                f"`params[{layer}]` must hold W of shape (in, out) and b of shape (out,). "
                f"Received: W.shape={w.shape}, b.shape={b.shape}"
            )
        if layer and np.shape(params[layer - 1][0])[1] != w.shape[0]:
            raise ValueError(
                f"`params[{layer}]` takes {w.shape[0]} inputs but layer {layer - 1} gives "
                f"{np.shape(params[layer - 1][0])[1]} outputs."
            )


def _check_arguments(params, stage_sizes, batches, mode, target, micro_batches, epochs,
                     momentum):
    _check_params(params)
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {TARGETS}. Received: target={target!r}")
    if target != "paper" and mode != "spectrain":
        raise ValueError(
            f"`target` applies to mode 'spectrain' only. Received: target={target!r}, "
            f"mode={mode!r}"
        )
    sizes = list(stage_sizes)
    bad_size = any(not isinstance(s, (int, np.integer)) or s < 1 for s in sizes)
    if not sizes or bad_size or sum(sizes) != len(params):
        raise ValueError(
            f"`stage_sizes` must be positive ints summing to the number of layers "
            f"({len(params)}). Received: stage_sizes={stage_sizes!r}"
        )
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"`epochs` must be a positive int. Received: epochs={epochs!r}")
    if momentum is not None and not 0 <= momentum <= 1:
        raise ValueError(f"`momentum` must be a float in [0, 1]. Received: momentum={momentum!r}")
    if (not isinstance(micro_batches, (int, np.integer)) or isinstance(micro_batches, bool)
            or micro_batches < 1):
        raise ValueError(
            f"`micro_batches` must be a positive int. Received: micro_batches={micro_batches!r}"
        )
    if not batches:
        raise ValueError("`batches` must be a non-empty list of (x, y) pairs. Received: []")
    for i, (x, y) in enumerate(batches):
        width = np.shape(params[0][0])[0]
        if np.ndim(x) != 2 or np.shape(x)[1] != width or np.shape(y) != (len(x),):
            raise ValueError(
                f"`batches[{i}]` must be (x, y) with x of shape (B, {width}) "
                f"and y of shape (B,). Received: x.shape={np.shape(x)}, y.shape={np.shape(y)}"
            )
        classes = np.shape(params[-1][0])[1]
        if len(y) and (not np.issubdtype(np.asarray(y).dtype, np.integer)
                       or np.min(y) < 0 or np.max(y) >= classes):
            raise ValueError(
                f"`batches[{i}]` labels must be ints in [0, {classes}). Received: "
                f"y={np.asarray(y)!r}"
            )
        if micro_batches > len(x):
            raise ValueError(
                f"`micro_batches` must be at most every mini-batch's size (a micro-batch "
                f"needs at least one example). Received: micro_batches={micro_batches}, "
                f"len(batches[{i}][0])={len(x)}"
            )


def _check_optimizer(optimizer, direction, momentum, weight_decay, amsgrad):
    if optimizer not in OPTIMIZERS:
        raise ValueError(
            f"`optimizer` must be one of {OPTIMIZERS}. Received: optimizer={optimizer!r}"
        )
    if direction not in DIRECTIONS:
        raise ValueError(
            f"`direction` must be one of {DIRECTIONS}. Received: direction={direction!r}"
        )
    if optimizer == "sgd" and momentum is None:
        raise ValueError("`momentum` is required with optimizer 'sgd'. Received: momentum=None")
    if optimizer != "sgd" and momentum is not None:
        raise ValueError(
            f"`momentum` applies to optimizer 'sgd' only. Received: momentum={momentum!r}, "
            f"optimizer={optimizer!r}"
        )
    if optimizer == "adamw" and weight_decay is None:
        raise ValueError(
            "`optimizer='adamw'` needs a float `weight_decay` (Keras' AdamW default is "
            "0.004). Received: weight_decay=None"
        )
    if amsgrad and optimizer not in ("adam", "adamw"):
        raise ValueError(
            f"`amsgrad` applies to optimizers 'adam' and 'adamw' only. Received: "
            f"amsgrad={amsgrad!r}, optimizer={optimizer!r}"
        )


# --- public entry points ------------------------------------------------------------------


def train_reference(params, stage_sizes, batches, *, mode, lr, momentum=None, epochs=1,
                    target="paper", micro_batches=1, weight_decay=None, clip=None, pick=min,
                    trace=None, optimizer="sgd", direction="auto", beta_1=0.9, beta_2=0.999,
                    epsilon=1e-7, amsgrad=False, rho=0.9, recut=None, momentum_decay=1.0,
                    accumulate=None):
    """Trains an MLP as a pipeline of stages, exactly as SPECTRAIN.md defines it.

    Args:
        params: list of `(W, b)` arrays per layer, the initial weights (not modified).
        stage_sizes: list of positive ints, the number of consecutive layers in each stage;
            its sum is the number of layers.
        batches: list of `(x, y)` mini-batches, x float (B, in), y int (B,), replayed in the
            same order every epoch.
        mode: "sync", "vanilla", "stash", "spectrain" or "nesterov" (SPECTRAIN.md 6e: the
            weights of "stash"; each stage's optimizer takes Nesterov's step, SGD's
            `nesterov=True` or NAdam for "adam"/"adamw", with its momentum or `beta_1`
            raised by its delay, `nesterov_coefficient`) or "2bw" (the weights of "stash";
            each stage updates once per `accumulate` mini-batches, with the mean of their
            gradients, at the rate of the group's last mini-batch; a group cut short by the
            epoch's end updates with what it has).
        lr: learning rate, or a function of the step (the mini-batch's index counted over
            all epochs) giving the learning rate of that mini-batch's updates.
        momentum: Keras SGD momentum in [0, 1] (at 0, `m` is the last step `-lr * g`);
            required with optimizer "sgd", None with the others.
        epochs: number of epochs; the pipeline drains at the end of each, while optimizer
            slots and update counts persist.
        target: "paper" or "consistent"; anything but "paper" needs mode "spectrain".
        micro_batches: M, the micro-batches per mini-batch, in every mode: the mini-batch
            is split in order into M parts of sizes `micro_batch_sizes(B, M)` (equal when M
            divides B, else the first ones one larger), each part's loss weighted by its
            share of B; at most the size of every mini-batch. In `sync`, the micro-batches
            run one after another through all stages (GPipe); in the asynchronous modes each
            `F(i)` / `B(i)` runs them back to back at the weights it uses at `M = 1` (section
            4 of SPECTRAIN.md), and one update per stage follows `B(i)`.
        weight_decay: optional Keras weight decay, `W = W - W * weight_decay * lr` on every
            weight (biases included) before each step.
        clip: None, or `("clipnorm", c)` / `("clipvalue", c)` (each variable's gradient,
            as Keras clips it), or `("global_clipnorm", c)` (mode "sync": one norm over the
            whole model's gradient).
        pick: callable choosing which ready stage the event loop runs next, given the list of
            ready stage indices; the result must not depend on it.
        trace: optional list; every pass (every micro-batch pass) is appended to it as an
            `Event`.
        optimizer: every stage's optimizer (each stage has its own slots and count):
            "sgd" (Keras SGD, nesterov off), "adam", "adamw" (Adam with the decoupled
            `weight_decay`, which it requires) or "rmsprop" (no momentum, not centred); see
            the module docstring for the update rules.
        direction: the prediction's `d` (docs/SPECTRAIN.md section 6c): "auto" (SGD's
            momentum, Adam's re-evaluated step, RMSprop's last update) or "last_update"
            (the last applied update `W_after - W_before` of any optimizer, 0 before the
            first).
        beta_1, beta_2, epsilon, amsgrad: Adam's constants (Keras' defaults); `epsilon` is
            also RMSprop's.
        rho: RMSprop's decay of the squared gradients.
        momentum_decay: NAdam's (optimizer "nadam", or "adam"/"adamw" in mode "nesterov"):
            the schedule `mu_t = beta_1 (1 - 0.5 * 0.96^(momentum_decay * t))`; 1.0 is
            Keras' Nadam, 0.004 PyTorch's NAdam (the paper's code).
        accumulate: mode "2bw": the mini-batches per update, at least the number of stages
            (None: that number).
        recut: None, or `(epoch, new_stage_sizes)`: before that epoch (the pipeline drained)
            the stages are re-cut as a checkpoint resumed on other stages re-cuts them
            (docs/SPECTRAIN.md section 6d): every weight keeps its value and slots, and
            every new stage takes the old last stage's update count.

    Returns:
        `(final_params, losses)`: the list of `(W, b)` float64 arrays after training, and the
        per-mini-batch losses as the last stage computed them in its forward, in order,
        `epochs * len(batches)` floats.

    Raises:
        ValueError: if an argument is invalid, naming it and what is valid.
    """
    _check_arguments(params, stage_sizes, batches, mode, target, micro_batches, epochs,
                     momentum)
    _check_optimizer(optimizer, direction, momentum, weight_decay, amsgrad)
    rule = Rule(optimizer, direction, beta_1, beta_2, epsilon, amsgrad, rho, momentum_decay)
    if clip is not None and clip[0] == "global_clipnorm" and mode != "sync":
        raise ValueError(f"`global_clipnorm` needs mode 'sync'. Received: mode={mode!r}")
    batches = [(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64))
               for x, y in batches]
    flat = [w for pair in params for w in pair]
    stages, start = [], 0
    for k, size in enumerate(stage_sizes):
        stages.append(_Stage(flat[2 * start:2 * (start + size)], k == len(stage_sizes) - 1,
                             rule))
        start += size
    if optimizer == "nadam" and mode == "spectrain":
        raise ValueError("optimizer 'nadam' has no prediction rule (mode 'spectrain'). "
                         f"Received: optimizer={optimizer!r}, mode={mode!r}")
    if mode == "nesterov":
        if optimizer not in ("sgd", "adam", "adamw"):
            raise ValueError("mode 'nesterov' takes optimizer 'sgd', 'adam' or 'adamw'. "
                             f"Received: optimizer={optimizer!r}")
        base = momentum if optimizer == "sgd" else beta_1
        for k, stage in enumerate(stages):
            stage.nesterov = True
            stage.coefficient = nesterov_coefficient(base, k, len(stages))
    if mode == "2bw":
        accumulate = len(stages) if accumulate is None else accumulate
        if (not isinstance(accumulate, (int, np.integer)) or isinstance(accumulate, bool)
                or accumulate < len(stages)):
            raise ValueError(
                f"mode '2bw' needs `accumulate` >= the number of stages ({len(stages)}), so "
                "that each stage holds at most two weight versions. Received: "
                f"accumulate={accumulate!r}")
    elif accumulate is not None:
        raise ValueError(f"`accumulate` applies to mode '2bw' only. Received: mode={mode!r}")
    opts = dict(mode=mode, target=target, lr=lr, momentum=momentum, accumulate=accumulate,
                weight_decay=weight_decay, micro_batches=micro_batches, clip=clip)
    losses = []
    for epoch in range(epochs):
        if recut is not None and epoch == recut[0]:
            stages = _recut(stages, recut[1])
        if mode == "sync":
            losses += _run_sync_epoch(stages, batches, epoch, opts, trace)
        else:
            losses += _run_pipeline_epoch(stages, batches, epoch, opts, pick, trace)
    final = [w for stage in stages for w in stage.weights]
    return [(final[j], final[j + 1]) for j in range(0, len(final), 2)], losses


def _recut(stages, stage_sizes):
    """New stages of `stage_sizes` layers holding the same weights and slots, each with the
    last old stage's update count."""
    fields = ("weights", "momentum", "velocity", "velocity_hat", "last_update")
    flat = {f: [a for stage in stages for a in getattr(stage, f)] for f in fields}
    if sum(stage_sizes) * 2 != len(flat["weights"]):
        raise ValueError(f"`recut` must keep the layers. Received: stage sizes {stage_sizes}")
    new, start = [], 0
    for k, size in enumerate(stage_sizes):
        stage = _Stage(flat["weights"][2 * start:2 * (start + size)],
                       k == len(stage_sizes) - 1, stages[0].rule)
        for f in fields:
            setattr(stage, f, [np.array(a) for a in flat[f][2 * start:2 * (start + size)]])
        stage.iterations, stage.u_product = stages[-1].iterations, stages[-1].u_product
        new.append(stage)
        start += size
    return new


def make_problem(seed, layer_sizes, num_batches, batch_size):
    """A random MLP and classification batches, for tests.

    Args:
        seed: int seed of the NumPy generator.
        layer_sizes: widths `[in, hidden..., classes]`, at least two entries.
        num_batches: number of mini-batches.
        batch_size: examples per mini-batch.

    Returns:
        `(params, batches)`: a list of `(W, b)` float64 arrays (Glorot-uniform W, small random
        b), and a list of `(x, y)` with x float64 (batch_size, in), y int64 labels.
    """
    if len(layer_sizes) < 2:
        raise ValueError(
            f"`layer_sizes` needs an input and an output width. Received: {layer_sizes!r}"
        )
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        params.append((rng.uniform(-limit, limit, (fan_in, fan_out)),
                       rng.normal(0.0, 0.1, fan_out)))
    batches = [(rng.normal(size=(batch_size, layer_sizes[0])),
                rng.integers(0, layer_sizes[-1], batch_size))
               for _ in range(num_batches)]
    return params, batches
