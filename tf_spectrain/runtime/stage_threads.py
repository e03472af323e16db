"""What the stage threads of an epoch do: walk their instruction lists and hand results on.

`StageThreads` runs each op of stage k (of replica r): it takes the stage's input from its
hand-offs (`Lane`), calls the `StageRunner`'s forward, backward or update, and passes the
result on. `runtime.executor.EpochRun` starts the threads and waits for the results.
"""

import tensorflow as tf

from tf_spectrain import schedule
from tf_spectrain.runtime.handoff import Board, Channel, PipelineAborted
from tf_spectrain.runtime.stall import Progress
from tf_spectrain.schedule import modes

__all__ = ["STOP", "Lane", "StageThreads", "to_host"]

STOP = "tf_spectrain.stop"  # the marker that follows the last fed mini-batch


def _first(pair):
    """The first item of a pair (a sort key)."""
    return pair[0]


def to_host(value):
    """The nest `value` with each tensor copied into this process' memory (others kept)."""
    # The caller's thread reads each mini-batch's loss, logits and layer losses; when they
    # live on a worker, a read there would block for ever if the worker hangs. A stage thread
    # (which the epoch can leave behind) copies them instead, once they are computed.
    return tf.nest.map_structure(lambda t: tf.constant(t.numpy()) if tf.is_tensor(t) else t,
                                 value)


class Lane:
    """One replica's hand-offs: activations, gradients, labels, results, losses, norms, flags.

    Args:
        abort: the epoch's abort event.
        n: the number of stages.
        r: the replica's index, or None for an unreplicated pipeline (names the hand-offs).
        clip_globally: whether the stages share their squared gradient norms (`norms`).
        shared_scale: whether the stages share one loss scale (`flags`).
    """

    def __init__(self, abort, n, r, clip_globally, shared_scale=False):
        of = "" if r is None else f" of replica {r}"
        self.activations = [Channel(abort, f"activations {k}->{k + 1}{of}") for k in range(n - 1)]
        self.gradients = [Channel(abort, f"gradients {k + 1}->{k}{of}") for k in range(n - 1)]
        self.labels = Channel(abort, f"labels 0->last{of}")
        self.results = Channel(abort, f"results{of}")
        self.losses = {}  # last stage: i -> [(scaled loss, logits, labels)] until its update
        self.norms = Board(abort, n, n, f"gradient norms{of}") if clip_globally else None
        # Sync mode's one loss scale: every stage's "gradient finite" flag of a mini-batch.
        self.flags = Board(abort, n, n, f"gradient flags{of}") if shared_scale else None


class StageThreads:
    """The work of every stage thread of one epoch, for one pipeline or R replicas of it.

    Stage k's thread (`main(r, k)`) executes `op_lists[k]` in order. Activations go from
    stage k to k+1 and gradients from k+1 to k through blocking `Channel`s, so data
    dependencies, not timing, order the work. Stage 0 takes each micro-batch from the feed
    and sends its labels straight to the last stage, which puts each mini-batch's
    `(scaled_loss, logits, labels)` parts on its lane's `results` after the update. Once the
    feed stops, a `STOP` marker follows the last fed mini-batch down the pipeline (and onto
    `results`), and every stage skips the passes of the mini-batches never fed.

    Args:
        grid: R lists of N `StageRunner`s, replica 0 first.
        op_lists: one op list per stage.
        feed: the epoch's `runtime.feed.Feed`.
        keep: for each stage, a function `(i, j) -> bool` (see `StageRunner.forward`).
        failure: the epoch's `runtime.handoff.FailureBox`.
        label: names the epoch in error notes, e.g. "epoch 3", or None.
        clip_globally: each update waits for every stage's squared norm (`Lane.norms`).
        shared_scale: each update waits for every stage's "gradient finite" flag.

    Attributes:
        lanes: each replica's `Lane`.
        ready: with replicas, per stage the `Board` on which its R copies post their
            gradients before the all-reduce; None otherwise.
        rates: None, or a `Board` of each mini-batch's learning rate (the caller posts it).
        accumulate: mini-batches per applied update (mode "2bw"; else 1, see
            `schedule.modes.applies_update`).
        remote: True when stages run on workers: the last stage then hands the caller
            local copies of its results (`to_host`).
        fed: the number of mini-batches fed, once the feed stopped early; else None.
        progress: the epoch's `runtime.stall.Progress`: every finished pass beats it.
        where: R lists of N `runtime.stall.Where` records, what each thread is on.
    """

    def __init__(self, grid, op_lists, feed, keep, failure, label=None, clip_globally=False,
                 shared_scale=False):
        self.grid, self.op_lists, self.feed, self.keep = grid, op_lists, feed, keep
        self.failure, self.label = failure, label
        n, num_replicas = len(grid[0]), len(grid)
        abort = failure.abort
        self.lanes = [Lane(abort, n, r if num_replicas > 1 else None, clip_globally,
                           shared_scale) for r in range(num_replicas)]
        # The R copies of stage k enter their gradients' all-reduce together, once all of
        # them are ready: a replica that failed leaves the others waiting here (where an
        # abort wakes them), not in the collective.
        self.ready = ([Board(abort, num_replicas, num_replicas, f"replicas of stage {k}")
                       for k in range(n)] if num_replicas > 1 else None)
        self.rates = None
        self.accumulate = 1
        self.remote = False
        self.fed = None
        self.progress = Progress()
        self.where = self.progress.stage_records(grid)

    def main(self, r, k):
        """The thread of stage k of replica r: its whole op list; a failure is recorded."""
        self.progress.attach()  # a trace in this thread stops the stall clock
        try:
            self._walk(r, k)
        except BaseException as error:  # anything, even KeyboardInterrupt: re-raised in the caller
            self.failure.record(error, None)  # _walk's note says where
        finally:
            self.progress.detach()

    def _walk(self, r, k):
        """Runs stage k's ops in order, skipping those of mini-batches never fed."""
        stop_at = None
        ops, where = self.op_lists[k], self.where[r][k]
        for position, op in enumerate(ops):
            if self.failure.abort.is_set():
                raise PipelineAborted("aborted")
            if stop_at is not None and op.batch >= stop_at:
                continue
            where.at(f"op {position + 1} of {len(ops)}, the {op.kind} of "
                     + (f"mini-batch {op.batch}" if op.kind == schedule.UPDATE
                        else f"micro-batch {op.batch}.{op.micro}"))
            try:
                stopped = self._run_op(r, k, op)
                self.progress.beat()
            except PipelineAborted:
                raise
            except BaseException as error:
                if hasattr(error, "add_note"):
                    where = f" of {self.label}" if self.label else ""
                    copy = f" of replica {r}" if len(self.grid) > 1 else ""
                    error.add_note(
                        f"(tf_spectrain: stage {k}{copy} on {self.grid[r][k].device} failed "
                        f"in the {op.kind} pass of mini-batch {op.batch}{where})"
                    )
                raise
            if stopped is not None:
                stop_at = stopped
        if stop_at is not None:
            self.grid[r][k].flush()  # 2bw: the unfinished group's gradients

    def _await(self, r, k, what, fetch):
        """`fetch()`, with stage k of replica r's record saying it waits for `what`."""
        where = self.where[r][k]
        where.waits(what)
        value = fetch()
        where.runs()
        return value

    def _stop_here(self, lane, k, i):
        """Passes the stop marker on from stage k: mini-batch i and later are not fed."""
        if k == 0:
            self.fed = i
        if k < len(self.grid[0]) - 1:
            lane.activations[k].put(STOP)
            if k == 0:
                lane.labels.put(STOP)
        else:
            lane.results.put(STOP)

    def _run_op(self, r, k, op):
        """Runs one op of stage k of replica r; returns the first batch not fed, once stopping."""
        if op.kind == schedule.FORWARD:
            return self._forward(r, k, op)
        if op.kind == schedule.BACKWARD:
            lane = self.lanes[r]
            last = k == len(self.grid[0]) - 1
            grads_out = None if last else self._await(
                r, k, f"the gradient of micro-batch {op.batch}.{op.micro} from stage {k + 1}",
                lane.gradients[k].get)
            grads_in = self.grid[r][k].backward((op.batch, op.micro), grads_out)
            if k > 0:
                lane.gradients[k - 1].put(grads_in)
        else:
            self._update(r, k, op.batch)
        return None

    def _forward(self, r, k, op):
        """The forward of `op` on stage k of replica r; the first batch not fed, once stopping."""
        runner, lane = self.grid[r][k], self.lanes[r]
        last = k == len(self.grid[0]) - 1
        key = (op.batch, op.micro)
        if k == 0:
            if op.micro == 0 and op.batch > 0 and not self.feed.feeds(op.batch):
                self._stop_here(lane, k, op.batch)
                return op.batch
            x, y, share = self._await(r, k, f"mini-batch {op.batch} from the data",
                                      lambda: self.feed.part(r, op.batch, op.micro))
            if not last:
                lane.labels.put((y, share))
        else:
            handed = self._await(
                r, k, f"the activations of micro-batch {key[0]}.{key[1]} from stage {k - 1}",
                lane.activations[k - 1].get)
            if isinstance(handed, str) and handed == STOP:
                self._stop_here(lane, k, op.batch)
                return op.batch
            x, share = handed
        if last:
            if k > 0:
                y, share = self._await(r, k, f"the labels of micro-batch {key[0]}.{key[1]} "
                                       "from stage 0", lane.labels.get)
            loss, logits = runner.forward(key, x, self.keep[k](key), labels=y, scale=share)
            if self.remote:
                loss, logits = to_host((loss, logits))
            self._penalty_to_host(runner, op.batch)
            lane.losses.setdefault(op.batch, []).append((loss, logits, y))
        else:
            # Every stage weighs its layer losses by the micro-batch's share, so that
            # a mini-batch's M micro-batches add them up once, as the loss is.
            outputs = runner.forward(key, x, self.keep[k](key), scale=share)
            # Before the hand-on: the mini-batch may be reported (its penalties read) as
            # soon as the next stages are done with it.
            self._penalty_to_host(runner, op.batch)
            lane.activations[k].put((outputs, share))
        return None

    def _penalty_to_host(self, runner, i):
        """With remote stages, the layer losses the forward of mini-batch i just made, copied
        to this host: the caller reads them, and a remote read there could hang."""
        if self.remote:
            penalties = runner.penalties.get(i)
            if penalties:
                penalties[-1] = to_host(penalties[-1])

    def _update(self, r, k, i):
        """Mini-batch i's update on stage k of replica r, once the stages it waits for agree."""
        runner, lane = self.grid[r][k], self.lanes[r]
        rate = None if self.rates is None else self._await(
            r, k, f"mini-batch {i}'s learning rate from the training loop",
            lambda: self.rates.wait(i))[0]
        if self.ready is not None:
            self.ready[k].post(i, (r, runner.pending_gradient))
            ready = self._await(r, k, f"the other replicas' gradients of mini-batch {i}",
                                lambda: self.ready[k].wait(i))
            gathered = [g for _, g in sorted(ready, key=_first)]
            runner.reduce_pending(gathered)  # the sum over the replicas, in every copy
        squares = None
        if lane.norms is not None:
            mine = runner.pending_square_norm()
            squares = self._await(r, k, f"every stage's gradient norm of mini-batch {i}",
                                  lambda: _gathered(lane.norms, i, k, mine))
        finite = None
        if lane.flags is not None:  # sync mode's one loss scale: all stages decide together
            flag = runner.pending_finite()
            finite = self._await(r, k, f"every stage's gradient check of mini-batch {i}",
                                 lambda: _gathered(lane.flags, i, k, flag))
        runner.update(learning_rate=rate, squares=squares, finite=finite,
                      apply=modes.applies_update(i, self.feed.num_batches, self.accumulate))
        if k == len(self.grid[0]) - 1:
            lane.results.put((i, lane.losses.pop(i)))


def _gathered(board, i, k, value):
    """Posts stage k's `value` of mini-batch i on `board`; every stage's, stage 0's first."""
    board.post(i, (k, value))
    return [x for _, x in sorted(board.wait(i), key=_first)]
