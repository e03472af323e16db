"""Predicted speed of the synchronous pipeline (`mode="sync"`): GPipe or 1F1B-flush.

Each mini-batch fills the pipeline with M micro-batches and drains it before the one
update, so mini-batches never overlap and the time is a closed formula (no simulation).
Pure Python; docs/COSTMODEL.md gives the equations.
"""

from tf_spectrain import checks
from tf_spectrain.costmodel.predict import Estimate, check_micro_batches, pipeline_times
from tf_spectrain.costmodel.runtime_costs import runtime_floor
from tf_spectrain.costmodel.stage_terms import SCHEDULES


def predict_sync(
    profile, hardware, batch_size, cuts, micro_batches=1, schedule="gpipe", recompute=False,
    num_batches=None, runtime=None,
):
    """Predicts the synchronous pipeline (`mode="sync"`), one stage per device.

    Each mini-batch runs as `M` micro-batches of `batch / M` examples that fill the
    pipeline and drain it before the one update, so mini-batches never overlap. A
    micro-batch's forward on stage k takes `p_k = (F_k + S_k) / M` (its share of the
    stage's forward and of sending the activations on, the sender busy while it sends)
    and its backward `q_k = (B_k + G_k) / M` (with the recomputed forward, if any, and
    sending the input gradients back). Every forward precedes every backward on the last
    stage, so a mini-batch takes the two phases' fill, steady flow and drain:

        sum_k p_k + (M - 1) * max_k p_k  +  sum_k q_k + (M - 1) * max_k q_k

    With N equal stages that is `(M + N - 1) / M` times one stage's work: the bubble
    `(N - 1) / (M + N - 1)`. `schedule="1f1b"` (1F1B-flush) interleaves each stage's
    passes differently but is timed the same (the same `2 (M + N - 1)` lock-step slots);
    it differs in memory (`stage_terms.StageTerms`). When fewer devices can compute at
    once than there are stages, no mini-batch takes less than the total compute divided
    by `hardware.concurrency`.

    Args:
        profile: a `ModelProfile`.
        hardware: a `Hardware` with at least `len(cuts) + 1` devices.
        batch_size: examples per mini-batch, an int >= 1.
        cuts: layer names or positions, each ending a stage.
        micro_batches: `M`, an int >= 1; each hand-off pays the latency M times.
        schedule: one of `stage_terms.SCHEDULES`, "gpipe" or "1f1b".
        recompute: which stages recompute their forward in their backward: False (sync's
            `recompute="auto"`), "always" (every stage) or True (every stage but the
            last); see `pipeline_times`.
        num_batches: None, or `T` (an int >= 1) for an epoch of T mini-batches, T times
            one mini-batch.
        runtime: as `predict_pipeline`.

    Returns:
        An `Estimate` of kind `"sync"`.

    Raises:
        TypeError, ValueError: for invalid arguments or more stages than devices.
    """
    checks.check_one_of("schedule", schedule, SCHEDULES)
    forward, backward, send = pipeline_times(
        profile, hardware, batch_size, cuts, recompute, micro_batches=micro_batches
    )
    m, n = check_micro_batches(micro_batches), len(forward)
    ahead = [forward[k] + (send[k] if k < n - 1 else 0.0) for k in range(n)]
    back = [backward[k] + (send[k - 1] if k > 0 else 0.0) for k in range(n)]
    seconds = sum(
        (sum(phase) + (m - 1) * max(phase)) / m for phase in (ahead, back)
    )
    seconds = max(seconds, sum(forward + backward) / hardware.concurrency,
                  runtime_floor(runtime, hardware, range(n), len(profile)))
    busiest = max(range(n), key=lambda k: ahead[k] + back[k])
    epoch = None
    if num_batches is not None:
        num_batches = checks.check_int(
            "num_batches", num_batches, 1, meaning="mini-batches per epoch"
        )
        epoch = num_batches * seconds
    return Estimate(
        "sync",
        batch_size,
        seconds,
        forward[busiest] + backward[busiest],
        ahead[busiest] + back[busiest] - forward[busiest] - backward[busiest],
        epoch,
    )
