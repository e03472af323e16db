"""Stage timelines as a Chrome trace (Perfetto, `chrome://tracing`): pure conversion.

`pipeline_trace` turns the stages' timelines (`StageRunner.timeline`: `(kind, key, start,
end)` per pass, `perf_counter` seconds, `key = (i, j)` for mini-batch i's micro-batch j,
None for an update) and the epoch's op lists (`tf_spectrain.schedule`) into the JSON object
of the trace-event format: one track (`tid`) per stage, a complete event (`"ph": "X"`,
microseconds) per pass, and a "wait" slice for every gap between a stage's passes, named
by what the next pass waited for. The measured busy fraction and bubble of each stage sit
beside the schedule's own in `otherData` and in the track names. `window_trace` draws
windows (`steps_per_execution > 1`), which run without per-pass times.

No TensorFlow here: `PipelineTrace` (`callbacks.trace`) feeds it, tests feed it tables.
"""

import collections

from tf_spectrain import schedule

__all__ = ["Slice", "match_passes", "pipeline_trace", "schedule_idle", "wait_reason",
           "window_trace"]

PASS = "pass"
WAIT = "wait"
_PID = 1

Slice = collections.namedtuple("Slice", "op start end")
"""One pass of a stage: its `schedule.Op` and its `perf_counter` start and end."""


def match_passes(timeline, ops, k=0):
    """Pairs each pass of a stage's timeline with its op of the schedule.

    A stage runs its ops in list order and records each pass in its timeline; ops of
    mini-batches never fed (a stopped epoch) leave no entry, so the timeline is a
    subsequence of the ops. Updates carry no key: their op gives the mini-batch.

    Args:
        timeline: the stage's `(kind, key, start, end)` tuples, in order.
        ops: the stage's `schedule.Op` list of the epoch.
        k: the stage's index (for the error message).

    Returns:
        A list of `Slice`s, one per timeline entry.

    Raises:
        ValueError: if an entry matches no op left in the list.
    """
    slices, position = [], 0
    for kind, key, start, end in timeline:
        while position < len(ops):
            op = ops[position]
            position += 1
            if op.kind == kind and (key is None or tuple(key) == (op.batch, op.micro)):
                slices.append(Slice(op, start, end))
                break
        else:
            raise ValueError(
                f"`timelines[{k}]` must follow stage {k}'s op list: its pass {kind} {key} "
                f"matches no op left in it. Received: {len(ops)} ops")
    return slices


def wait_reason(op, k, num_stages):
    """What `op` of stage k waits for before it can run: `(short name, description)`."""
    at = f"{op.batch}.{op.micro}"
    if op.kind == schedule.FORWARD:
        if k == 0:
            return f"wait input {at}", f"mini-batch {op.batch}'s micro-batch {op.micro} " \
                                       "from the data feed"
        return (f"wait activations {at} from stage {k - 1}",
                f"the activations of {at} from stage {k - 1}")
    if op.kind == schedule.BACKWARD:
        if k < num_stages - 1:
            return (f"wait gradient {at} from stage {k + 1}",
                    f"the gradient of {at} from stage {k + 1}")
        return "host", "no hand-off: Python and dispatch between the stage's own passes"
    return (f"wait before update {op.batch}",
            f"mini-batch {op.batch}'s learning rate from the training loop, and the other "
            "replicas' or stages' gradients where they are shared")


def schedule_idle(op_lists, batches=None):
    """Each stage's idle share of the schedule's lock-step clock table (`schedule.clock_table`).

    Args:
        op_lists: one `schedule.Op` list per stage.
        batches: None for the whole table, or `(start, stop)`: only the slots from the first
            to the last that runs a pass of mini-batches `start..stop-1`.

    Returns:
        A list of floats in [0, 1], one per stage (their mean is `schedule.bubble_fraction`
        of the whole table).
    """
    table = schedule.clock_table([list(ops) for ops in op_lists])
    slots = range(len(table[0]))
    if batches is not None:
        used = [s for s in slots for row in table
                if row[s] is not None and batches[0] <= row[s].batch < batches[1]]
        slots = range(min(used), max(used) + 1) if used else range(0)
    if not slots:
        return [0.0 for _ in table]
    return [sum(row[s] is None for s in slots) / len(slots) for row in table]


def _name(op, show_micro):
    """A pass's slice name: `"forward 3"`, `"backward 3.1"`, `"update 3"`."""
    if op.kind == schedule.UPDATE or not show_micro:
        return f"{op.kind} {op.batch}"
    return f"{op.kind} {op.batch}.{op.micro}"


def _us(seconds, origin):
    """`perf_counter` seconds as microseconds since `origin`, to the nanosecond."""
    return round((seconds - origin) * 1e6, 3)


def _complete(name, cat, k, start_us, end_us, args):
    """A complete event (`"ph": "X"`) on stage k's track."""
    return {"name": name, "cat": cat, "ph": "X", "ts": start_us,
            "dur": round(end_us - start_us, 3), "pid": _PID, "tid": k, "args": args}


def _metadata(name, args, tid=None):
    """A metadata event (`"ph": "M"`): process or track names and order."""
    event = {"name": name, "ph": "M", "pid": _PID, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def _stage_events(k, slices, num_stages, span, show_micro, recomputes):
    """Stage k's pass and wait slices over `span` (microseconds), and its busy microseconds."""
    events, busy, cursor = [], 0.0, span[0]
    for op, start, end in slices:
        reason, why = wait_reason(op, k, num_stages)
        if start > cursor:
            events.append(_complete(reason, WAIT, k, cursor, start, {"waits_for": why}))
        args = {"pass": op.kind, "mini_batch": op.batch}
        name = _name(op, show_micro)
        if op.kind != schedule.UPDATE:
            args["micro_batch"] = op.micro
        if op.kind == schedule.BACKWARD and recomputes is not None:
            args["recomputes_forward"] = bool(recomputes((op.batch, op.micro)))
            if args["recomputes_forward"]:
                name += " (recomputes)"
        events.append(_complete(name, PASS, k, start, end, args))
        busy += end - start
        cursor = max(cursor, end)
    if span[1] > cursor:
        events.append(_complete("idle: drained", WAIT, k, cursor, span[1],
                                {"waits_for": "the end of the epoch (the other stages)"}))
    return events, busy


def _mean(stages, key):
    """The mean of `key` over the stages' dicts (None without stages)."""
    return sum(s[key] for s in stages) / len(stages) if stages else None


def pipeline_trace(timelines, op_lists, devices=None, epoch_start=None, epoch_seconds=None,
                   batches=None, recomputes=None, title="pipeline"):
    """The trace-event JSON object of one epoch (or a window of its mini-batches).

    Args:
        timelines: per stage, its `(kind, key, start, end)` passes (`PipelineState.timelines`).
        op_lists: per stage, the epoch's `schedule.Op` list (`PipelineState.op_lists`).
        devices: per stage, its device name for the track name; None leaves it out.
        epoch_start: `perf_counter` time the epoch's training began; None: its first pass.
        epoch_seconds: the epoch's training wall time (`PipelineState.epoch_seconds`), so
            that the busy fraction is `Telemetry`'s utilisation; None: up to its last pass.
        batches: None for every pass, or `(start, stop)`: only the passes of mini-batches
            `start..stop-1`, over the time from the first of them to the last.
        recomputes: None, or per stage a function `(i, j) -> bool`: whether the backward
            of `(i, j)` recomputes its forward (it is inside the backward's slice, which
            the runtime times as one pass).
        title: the process name shown above the tracks.

    Returns:
        `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`, timestamps
        in microseconds since the start of the span. `otherData["stages"]` has per stage
        `stage`, `device`, `busy_seconds`, `busy_fraction`, `bubble` (1 - busy fraction)
        and `bubble_schedule` (its idle share of `schedule.clock_table`); `otherData` also
        has `span_seconds`, `bubble` and `bubble_schedule` (means over the stages).

    Raises:
        ValueError: if the timelines and op lists disagree, or `batches` is not a range.
    """
    if len(timelines) != len(op_lists):
        raise ValueError(f"`timelines` must have one entry per stage of `op_lists` "
                         f"({len(op_lists)}). Received: {len(timelines)} timelines")
    if batches is not None and not (len(batches) == 2 and 0 <= batches[0] < batches[1]):
        raise ValueError(f"`batches` must be (start, stop) with 0 <= start < stop. "
                         f"Received: batches={batches!r}")
    num_stages = len(op_lists)
    rows = [match_passes(t, ops, k) for k, (t, ops) in enumerate(zip(timelines, op_lists))]
    if batches is not None:
        rows = [[s for s in row if batches[0] <= s.op.batch < batches[1]] for row in rows]
    starts = [s.start for row in rows for s in row]
    ends = [s.end for row in rows for s in row]
    first = min(starts, default=epoch_start or 0.0)
    if batches is None and epoch_start is not None:
        first = min(first, epoch_start)
    if batches is None and epoch_seconds is not None:
        last = max([first + epoch_seconds] + ends)
    else:
        last = max(ends, default=first)
    span = (0.0, _us(last, first))
    show_micro = any(op.micro > 0 for ops in op_lists for op in ops)
    idle = schedule_idle(op_lists, batches) if starts else [0.0] * num_stages
    events = [_metadata("process_name", {"name": title})]
    stages = []
    for k, row in enumerate(rows):
        us_row = [Slice(s.op, _us(s.start, first), _us(s.end, first)) for s in row]
        rule = None if recomputes is None else recomputes[k]
        stage_events, busy = _stage_events(k, us_row, num_stages, span, show_micro, rule)
        fraction = busy / span[1] if span[1] > 0 else 0.0
        device = None if devices is None else str(devices[k])
        stages.append({"stage": k, "device": device, "busy_seconds": busy / 1e6,
                       "busy_fraction": fraction, "bubble": 1.0 - fraction,
                       "bubble_schedule": idle[k]})
        on = f" ({device})" if device else ""
        track = (f"stage {k}{on}, busy {fraction:.1%}, bubble {1 - fraction:.1%} "
                 f"(schedule {idle[k]:.1%})")
        events += [_metadata("thread_name", {"name": track}, k),
                   _metadata("thread_sort_index", {"sort_index": k}, k)] + stage_events
    other = {"title": title, "span_seconds": span[1] / 1e6, "batches": batches,
             "bubble": _mean(stages, "bubble"),
             "bubble_schedule": _mean(stages, "bubble_schedule"), "stages": stages}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def window_trace(windows, title="pipeline"):
    """The trace of an epoch run in windows: one slice per window, no per-pass times.

    Windows (`steps_per_execution = K > 1`) run every pass of K mini-batches in one graph
    call, so only the time each window ended is known (from `on_train_batch_end`).

    Args:
        windows: `(first, stop, start, end)` per window: mini-batches `first..stop-1`,
            between `perf_counter` times `start` and `end`.
        title: the process name shown above the track.

    Returns:
        A trace-event JSON object with one track (`tid` 0); `otherData["stages"]` is empty.
    """
    origin = windows[0][2] if windows else 0.0
    events = [_metadata("process_name", {"name": title}),
              _metadata("thread_name", {"name": "windows (no per-pass times)"}, 0)]
    for first, stop, start, end in windows:
        events.append(_complete(f"mini-batches {first}-{stop - 1}", "window", 0,
                                _us(start, origin), _us(end, origin),
                                {"first": first, "stop": stop}))
    other = {"title": title, "span_seconds": (windows[-1][3] - origin) if windows else 0.0,
             "batches": None, "bubble": None, "bubble_schedule": None, "stages": [],
             "note": "windows (steps_per_execution > 1) run all passes in one graph call: "
                     "no per-pass times; use steps_per_execution=1 or 'auto'"}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
