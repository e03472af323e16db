"""Stage 0's side of an epoch: which mini-batches are fed, and each replica's parts of them.

`Feed` reads each mini-batch once, splits it into R x M nearly equal parts (R replicas, M
micro-batches each) and hands replica r its M parts; each part's share of the mini-batch
scales its loss, so the parts' gradients add up to the mini-batch's. It also decides, once
per mini-batch and for every replica alike, whether the batch is fed after a stop was
requested, together with whether its `on_begin` runs (see `EpochRun.run`).
"""

import threading

import tensorflow as tf


def split_batch(x, parts, what="micro-batches"):
    """Splits a batch into `parts` nearly equal slices along the batch axis.

    Args:
        x: a tensor, or a list or tuple of tensors of the same batch size.
        parts: the number of slices, an int >= 1.
        what: what the slices are, for the error message.

    Returns:
        A list of `(slice, size)`; sizes differ by at most one (the first are larger), and
        each slice is a tensor, or a list of tensors when `x` is a list or tuple.

    Raises:
        ValueError: if the batch has fewer than `parts` examples.
    """
    xs = x if isinstance(x, (list, tuple)) else [x]
    n = int(xs[0].shape[0])
    _check_parts(n, parts, what)
    sizes = [n // parts + (1 if j < n % parts else 0) for j in range(parts)]
    pieces = [tf.split(t, sizes) for t in xs]
    out = []
    for j, size in enumerate(sizes):
        part = [p[j] for p in pieces]
        out.append((part if isinstance(x, (list, tuple)) else part[0], size))
    return out


def _check_parts(n, parts, what):
    """Raises if a mini-batch of n examples cannot be cut into `parts` slices of `what`."""
    if parts > n:
        raise ValueError(
            f"A mini-batch of {n} examples cannot be split into {parts} {what} "
            "(each needs at least one example). This is usually the last, smaller "
            "mini-batch of an epoch: choose a batch size that divides the number of "
            "examples (or drop the remainder), or fewer micro-batches."
        )


def check_split(n, parts, replicas, micro_batches):
    """Checks that a mini-batch of n examples splits into `parts = replicas x micro_batches`.

    Raises:
        ValueError: if `parts > n` (the message names what the parts are).
    """
    what = ("micro-batches" if replicas == 1 else
            f"parts ({replicas} replicas x {micro_batches} micro-batches)")
    _check_parts(n, parts, what)


def ran_out(i, num_batches):
    """The error for data that ran out after i of an epoch's `num_batches` mini-batches."""
    return ValueError(
        f"The training data ran out after {i} mini-batches of an epoch of {num_batches}. "
        "With `steps_per_epoch`, the dataset must yield at least steps_per_epoch * epochs "
        "batches (e.g. use `dataset.repeat()`)."
    )


class Feed:
    """The mini-batches of one epoch, read once and handed to every replica's stage 0.

    Args:
        batches: an iterator of `(x, y)` mini-batches.
        num_batches: the epoch's mini-batches (for the message when the data runs out).
        micro_batches: M.
        replicas: R.
    """

    def __init__(self, batches, num_batches, micro_batches, replicas=1):
        self.batches = batches
        self.num_batches = num_batches
        self.micro_batches = micro_batches
        self.replicas = replicas
        self._lock = threading.Lock()
        self._parts = {}  # i -> [replica r's M parts (x, y, share)], until all have taken
        self._taken = {}  # i -> how many replicas took their parts
        self._mine = [{} for _ in range(replicas)]  # r -> {i: its parts} until its last
        self.stop = threading.Event()
        # Whether mini-batch i is fed and whether its on_begin runs are decided together
        # under this lock, so that after a stop every fed batch, and only those, is begun.
        self._gate = threading.Lock()
        self._begun = -1  # the last mini-batch whose on_begin has run
        self._fed_upto = 0  # the last mini-batch fed (batch 0 always is)
        self._decided = {}  # i -> whether it is fed (the same answer for every replica)

    def part(self, r, i, j):
        """Replica r's micro-batch (i, j) as `(x, y, share)`; reads the data when needed.

        Raises:
            ValueError: if the data runs out, or a mini-batch is too small to split.
        """
        mine = self._mine[r]
        if j == 0:
            with self._lock:
                if i not in self._parts:
                    self._parts[i], self._taken[i] = self._read(i), 0
                mine[i] = self._parts[i][r]
                self._taken[i] += 1
                if self._taken[i] == self.replicas:
                    del self._parts[i], self._taken[i]
        x, y, share = mine[i][j]
        if j == self.micro_batches - 1:
            del mine[i]
        return x, y, share

    def _read(self, i):
        """Mini-batch i, split into R lists of M `(x, y, share)`."""
        try:
            x, y = next(self.batches)
        except StopIteration:
            raise ran_out(i, self.num_batches) from None
        parts, m = self.replicas * self.micro_batches, self.micro_batches
        if parts == 1:
            return [[(x, y, 1.0)]]
        n = int(tf.nest.flatten(x)[0].shape[0])
        check_split(n, parts, self.replicas, m)
        xs, ys = split_batch(x, parts), split_batch(y, parts)
        flat = [(xp, yp, size / n) for (xp, size), (yp, _) in zip(xs, ys)]
        return [flat[r * m:(r + 1) * m] for r in range(self.replicas)]

    def feeds(self, i):
        """Whether to feed mini-batch i > 0: no, once stopped, unless it was begun."""
        with self._gate:
            if i not in self._decided:
                fed = not (self.stop.is_set() and i > self._begun)
                if fed:
                    self._fed_upto = i
                self._decided[i] = fed
            return self._decided[i]

    def may_begin(self, i):
        """Whether `on_begin(i)` runs (batch i is, or may still be, fed); marks it begun."""
        with self._gate:
            if self.stop.is_set() and i > self._fed_upto:
                return False
            self._begun = i
            return True


def split_parts(x, parts):
    """Splits every tensor of the nest `x` into `parts` nearly equal slices (the first are
    larger, as `runtime.feed.split_batch`), with each slice's share of the batch.

    Returns:
        A list of `(slice nest, share)`, the share a float32 scalar tensor.
    """
    if parts == 1:
        return [(x, tf.constant(1.0, tf.float32))]
    flat = tf.nest.flatten(x)
    n = tf.shape(flat[0], out_type=tf.int64)[0]
    sizes = [n // parts + tf.cast(j < n % parts, tf.int64) for j in range(parts)]
    pieces = [tf.split(t, tf.stack(sizes)) for t in flat]
    out = []
    for j, size in enumerate(sizes):
        share = tf.cast(tf.cast(size, tf.float64) / tf.cast(n, tf.float64), tf.float32)
        out.append((tf.nest.pack_sequence_as(x, [p[j] for p in pieces]), share))
    return out


def batch_size(y):
    """The examples of a mini-batch, from its labels."""
    return tf.shape(tf.nest.flatten(y)[0])[0]
