"""Windows: an epoch's op lists cut into runs of K mini-batches, one graph call each.

A pipeline that runs its schedule as graph functions (`runtime.window_epoch`) runs one
window per call: a piece of every stage's list, in one program order that respects every
dependency. `EpochWindows` cuts them. Pure Python, like the whole `tf_spectrain.schedule`
package.

A window *reports* the mini-batches whose last update of the epoch's "report stage" it holds:
the last stage in the asynchronous modes (whose update of mini-batch i follows its loss),
stage 0 in sync mode (whose update of i is the last op of i, so a sync window holds whole
mini-batches). Window w reports mini-batches `w*K .. w*K + K - 1`. It holds every op that
comes, in the order of (lock-step slot of `clock_table`, stage, position), no later than the
report stage's update of its last reported mini-batch (an update takes the slot of the
backward before it); and stage 0's forwards of a mini-batch enter together (a mini-batch is
fed whole). Such a prefix respects every dependency (a consumer's slot is after its
producer's) and each stage's own order, so ops of the asynchronous modes that span a cut (a
forward here, its backward in the next window) simply carry their state across; which
weights each pass uses is unchanged.

For N = 3, T = 4 asynchronous, K = 2 (`|` ends window 0, which reports mini-batches 0, 1):

    stage 0: F0 F1 F2 .  .  B0 | F3 B1 .  B2 .  B3
    stage 1: .  F0 F1 .  B0 F2 | B1 F3 B2 .  B3 .
    stage 2: .  .  F0 B0 F1 B1 | F2 B2 F3 B3 .  .

A stop (`stop`) keeps the mini-batches already fed (those whose first forward on stage 0
ran) and cuts the rest of their ops into windows as before: the schedule of a shorter epoch.
"""

import dataclasses

from tf_spectrain import checks
from tf_spectrain.schedule.clock import clock_table
from tf_spectrain.schedule.instructions import FORWARD, UPDATE


@dataclasses.dataclass(frozen=True)
class Window:
    """The ops of one window, in program order.

    Attributes:
        program: `(stage, Op)` pairs in an order that respects every dependency and each
            stage's own order (by lock-step slot, then stage; an update right after the
            backward before it).
        first: the first mini-batch the window reports.
        stop: one past the last mini-batch it reports.
        fed: the mini-batches whose inputs enter in this window (their first forward on
            stage 0 is here), in order.
    """

    program: tuple
    first: int
    stop: int
    fed: tuple

    @property
    def reported(self):
        """The reported mini-batches, a `range`."""
        return range(self.first, self.stop)

    @property
    def span(self):
        """The window in messages: "the window of mini-batches 4-7", "... of mini-batch 5",
        or, reporting none (the epoch's drain), "the window after mini-batch 7"."""
        if self.stop - self.first > 1:
            return f"the window of mini-batches {self.first}-{self.stop - 1}"
        if self.stop > self.first:
            return f"the window of mini-batch {self.first}"
        return f"the window after mini-batch {self.first - 1}"

    def shape(self):
        """The program with mini-batch indices counted from `first`: equal for windows that
        run the same ops on other mini-batches (so one traced graph serves them all)."""
        return tuple((k, op.kind, op.batch - self.first, op.micro) for k, op in self.program)

    def stage_position(self, k, done):
        """Where stage k is, once each stage has finished `done[s]` of its passes here.

        Args:
            k: a stage.
            done: per stage, its forwards and backwards of this window already finished.

        Returns:
            `(doing, waiting)`: stage k's next pass, e.g. "pass 3 of 8 of the window of
            mini-batches 4-7, the backward of micro-batch 5.0"; and what it waits for, e.g.
            "the gradient of micro-batch 5.0 from stage 2", or None when the neighbour's
            pass it needs is finished (or is not in this window); once all its passes
            here are finished, the other stages.
        """
        passes = [[op for s, op in self.program if s == stage and op.kind != UPDATE]
                  for stage in range(len(done))]
        mine = passes[k]
        span = self.span
        if done[k] >= len(mine):
            return f"its {len(mine)} passes of {span} finished", "the other stages to finish theirs"
        op = mine[done[k]]
        doing = (f"pass {done[k] + 1} of {len(mine)} of {span}, the {op.kind} of micro-batch "
                 f"{op.batch}.{op.micro}")
        source = k - 1 if op.kind == FORWARD else k + 1
        if not 0 <= source < len(done):
            return doing, None
        theirs = [(o.kind, o.batch, o.micro) for o in passes[source]]
        needed = (op.kind, op.batch, op.micro)
        if needed not in theirs or theirs.index(needed) < done[source]:
            return doing, None
        what = "activations" if op.kind == FORWARD else "gradient"
        return doing, f"the {what} of micro-batch {op.batch}.{op.micro} from stage {source}"


def _slots(op_lists):
    """Each op's position key `(slot, stage, index)`; an update takes its backward's slot."""
    table = clock_table(op_lists)
    slot_of = [{} for _ in op_lists]
    for k, row in enumerate(table):
        for slot, op in enumerate(row):
            if op is not None:
                slot_of[k][op.key] = slot
    keys = []
    for k, ops in enumerate(op_lists):
        last = -1
        stage_keys = []
        for index, op in enumerate(ops):
            if op.kind != UPDATE:
                last = slot_of[k][op.key]
            stage_keys.append((last, k, index))
        keys.append(stage_keys)
    return keys


class EpochWindows:
    """Cuts one epoch's op lists into windows of `size` reported mini-batches.

    Args:
        lists_for: a function `T -> op lists` giving every stage's list for an epoch of T
            mini-batches (e.g. `schedule.op_lists` with the pipeline's settings).
        num_batches: T, the epoch's mini-batches.
        size: K, the mini-batches each window reports (the last window may report fewer).
        report_stage: the stage whose updates decide what a window reports: the last one
            for the asynchronous schedules, 0 for sync mode.

    Raises:
        TypeError, ValueError: if `num_batches`, `size` or `report_stage` is not a valid int.
    """

    def __init__(self, lists_for, num_batches, size, report_stage):
        self.num_batches = checks.check_int("num_batches", num_batches, 1)
        self.size = checks.check_int("size", size, 1)
        self._lists_for = lists_for
        self._lists = lists_for(num_batches)
        self.report_stage = checks.check_int("report_stage", report_stage, 0,
                                             len(self._lists) - 1)
        self._keys = _slots(self._lists)
        self._done = [0] * len(self._lists)  # ops run so far, per stage
        self._reported = 0
        self._fed = 0  # mini-batches fed so far
        self._stopped = False

    @property
    def fed(self):
        """How many mini-batches have been fed so far (the epoch's length after a stop)."""
        return self._fed

    @property
    def reported(self):
        """How many mini-batches the windows cut so far report."""
        return self._reported

    def stop(self):
        """Feeds no further mini-batch: the next windows drain what has been fed.

        The epoch becomes one of `fed` mini-batches, whose op lists begin with the ops run
        so far; the next windows hold the rest of them, cut as before (each reports at
        most `size` mini-batches, so per-batch callbacks still see each window's), none
        if everything fed is done.
        """
        if self._stopped or self._fed == self.num_batches:
            self._stopped = True
            return
        self._stopped = True
        lists = self._lists_for(max(self._fed, 1))
        for k, (old, new) in enumerate(zip(self._lists, lists)):
            if old[: self._done[k]] != new[: self._done[k]]:
                raise RuntimeError(
                    f"stage {k}: the ops run so far are not the start of the shorter "
                    "epoch's list (a schedule that cannot stop early)"
                )
        self._lists, self.num_batches = lists, max(self._fed, 1)
        self._keys = _slots(lists)

    def __iter__(self):
        return self

    def __next__(self):
        """The next window; StopIteration once every op has been cut."""
        if all(d == len(ops) for d, ops in zip(self._done, self._lists)):
            raise StopIteration
        first = self._reported
        stop = min(first + self.size, self.num_batches)
        limit = None if stop == self.num_batches else self._cut_after(stop - 1)
        picked = []
        for k, ops in enumerate(self._lists):
            start = self._done[k]
            end = start
            while end < len(ops) and (limit is None or self._keys[k][end] <= limit):
                end += 1
            if k == 0:  # a mini-batch enters whole: its other micro-batches' forwards too
                while (end < len(ops) and start < end and ops[end].kind == FORWARD
                       and ops[end - 1].kind == FORWARD and ops[end].batch == ops[end - 1].batch):
                    end += 1
            picked += [(self._keys[k][n], k, ops[n]) for n in range(start, end)]
            self._done[k] = end
        picked.sort(key=lambda item: item[0])
        program = tuple((k, op) for _, k, op in picked)
        fed = tuple(op.batch for k, op in program
                    if k == 0 and op.kind == FORWARD and op.micro == 0)
        if fed:
            self._fed = max(self._fed, fed[-1] + 1)
        self._reported = stop
        return Window(program, first, stop, fed)

    def update_after(self, k, op, count, applies=None):
        """The mini-batch of stage k's `count`-th update after its `op` in the epoch's list
        (the update that brings the stage `count` versions past the pass), or None when the
        epoch ends first. With `applies` (a function of a mini-batch), only the updates it
        says apply count (mode 2bw's, `modes.applies_update`)."""
        ops = self._lists[k]
        seen = 0
        for later in ops[ops.index(op) + 1:]:
            if later.kind == UPDATE and (applies is None or applies(later.batch)):
                seen += 1
                if seen == count:
                    return later.batch
        return None

    def _cut_after(self, i):
        """The position key of the report stage's last op of mini-batch i (its update)."""
        k = self.report_stage
        for n, op in enumerate(self._lists[k]):
            if op.kind == UPDATE and op.batch == i:
                return self._keys[k][n]
        raise ValueError(f"stage {k} has no update of mini-batch {i}")  # not a valid list

