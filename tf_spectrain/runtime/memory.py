"""What a stage keeps alive, in bytes: its weights, optimizer slots and in-flight passes.

`StageMemory` counts, for one `StageRunner`, the bytes of everything the stage holds:
- fixed: its variables (trainable and not) and its optimizer's variables (slots);
- while a micro-batch is in flight (from its forward to its backward): its inputs and the
  non-trainable state kept for a recompute, or the activations a kept tape holds (an
  estimate: the bytes of every layer output of the stage for that many examples, in the
  dtype the layers compute in), and the copies of the forward's weights kept for a
  backward that reuses them (one per weight version, shared by the micro-batches and
  mini-batches whose forwards ran at it; a copy of the current weights is counted from the
  stage's next update, as TensorFlow's variables copy on write).

The in-flight part is counted from the tensors the stage really keeps, pass by pass, so
its peak shows what the schedule and `recompute` keep alive (GPipe: all M micro-batches,
1F1B-flush: `min(N - k, M)`). It is an estimate of memory, not a measurement: framework
workspace, temporaries of a running pass and allocator slack are left out. On GPUs
`device_peak_bytes` reads what TensorFlow's allocator measured instead.
"""

import dataclasses

import tensorflow as tf

from tf_spectrain.partition.graph import read_graph

__all__ = ["MemoryEstimate", "StageMemory", "device_peak_bytes", "tensor_bytes"]


def tensor_bytes(tensors):
    """The bytes of a nest of tensors (or variables) with known shapes.

    Args:
        tensors: a tensor, variable, or a nest of them (other values count 0).

    Returns:
        The total bytes, an int.
    """
    total = 0
    for t in tf.nest.flatten(tensors):
        shape, dtype = getattr(t, "shape", None), getattr(t, "dtype", None)
        if shape is None or dtype is None:
            continue
        count = 1
        for dim in shape:
            count *= int(dim or 0)
        total += count * tf.as_dtype(dtype).size
    return total


def _activation_bytes_per_example(model):
    """Bytes per example of every layer output of a (stage) model, in their dtypes."""
    total = 0
    for call in read_graph(model).calls:
        for t in call.outputs:
            count = 1
            for dim in t.shape[1:]:
                count *= int(dim or 0)
            total += count * tf.as_dtype(t.dtype).size
    return total


def device_peak_bytes(device):
    """The peak bytes TensorFlow's allocator measured on `device`, or None where it cannot.

    TensorFlow tracks memory on GPUs (`tf.config.experimental.get_memory_info`); on CPU
    devices it does not, and this returns None.

    Args:
        device: a device name, e.g. `"/GPU:1"`.

    Returns:
        An int, or None.
    """
    spec = tf.DeviceSpec.from_string(device)
    if (spec.device_type or "").upper() not in ("GPU", "TPU"):
        return None
    name = f"{spec.device_type.upper()}:{spec.device_index or 0}"
    try:
        return int(tf.config.experimental.get_memory_info(name)["peak"])
    except (ValueError, RuntimeError, tf.errors.OpError):
        return None


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """One stage's bytes (see the module docstring).

    Attributes:
        weights: the stage's variables (trainable and not).
        slots: its optimizer's variables.
        peak_in_flight: the most bytes its in-flight micro-batches kept at one time (since
            the last `reset_peak`).
        peak_micro_batches: the most micro-batches in flight at one time.
        device_peak: the allocator's peak on the stage's device (GPUs), else None.
        peak_weight_copies: the most copies of its weights kept at one time for backwards
            with memory of their own (older or predicted versions; a copy of the current
            weights shares theirs until the next update).
    """

    weights: int
    slots: int
    peak_in_flight: int
    peak_micro_batches: int
    device_peak: int = None
    peak_weight_copies: int = 0

    @property
    def peak(self):
        """The estimated peak: weights + slots + the peak of what was in flight."""
        return self.weights + self.slots + self.peak_in_flight


class StageMemory:
    """Counts the bytes one stage keeps alive (see the module docstring).

    Args:
        model: the stage's sub-model.
        optimizer: its optimizer (built).
        device: its device name (for `device_peak_bytes`).
    """

    def __init__(self, model, optimizer, device):
        self.device = device
        self.weights = tensor_bytes(list(model.variables))
        self.slots = tensor_bytes(list(optimizer.variables))
        self.activations_per_example = _activation_bytes_per_example(model)
        self._kept = {}  # key -> bytes of that micro-batch's own tensors
        self._shared = {}  # copy -> [bytes of a weight copy, micro-batches using it]
        self._copy_of = {}  # key -> the copy it uses
        self._now = 0
        self.peak_in_flight = 0
        self.peak_micro_batches = 0
        self.peak_weight_copies = 0

    def kept(self, key, inputs, tape_examples=0, state=(), weight_copy=None, current=False):
        """Counts what the forward of `key = (i, j)` keeps until its backward.

        Args:
            key: `(i, j)`.
            inputs: the input tensors kept.
            tape_examples: the examples whose activations a kept tape holds (0: no tape).
            state: the non-trainable values kept for a recompute.
            weight_copy: the forward's weights kept for the backward (a list, the same
                object for every pass that shares the copy), or None.
            current: the copy is of the current weights. TensorFlow's variables copy on
                write, so it shares their memory until the stage's next update (`updated`)
                and is counted from then.
        """
        own = (tensor_bytes(inputs) + tensor_bytes(list(state))
               + tape_examples * self.activations_per_example)
        copy = None if weight_copy is None else (tensor_bytes(weight_copy), id(weight_copy))
        self.kept_bytes(key, own, *(copy or (None,)), current=current)

    def kept_bytes(self, key, own, weight_copy=None, copy=None, current=False):
        """Counts what the forward of `key = (i, j)` keeps, given in bytes (see `kept`).

        Args:
            key: `(i, j)`.
            own: the bytes of its own inputs, state and activations.
            weight_copy: the bytes of the weight copy it shares with other passes, or None.
            copy: what names that copy (passes naming the same share it); None for the
                mini-batch `i` (the micro-batches of a mini-batch share one).
            current: as in `kept`.
        """
        self._kept[key] = own
        self._now += own
        if weight_copy is not None:
            copy = key[0] if copy is None else copy
            entry = self._shared.get(copy)
            if entry is None:
                entry = self._shared[copy] = [weight_copy, 0, not current]
                self._now += entry[0] if entry[2] else 0
            entry[1] += 1
            self._copy_of[key] = copy
        self._note_peaks()

    def updated(self):
        """Counts the stage's update: copies of the weights it had now hold memory of their own."""
        for entry in self._shared.values():
            if not entry[2]:
                entry[2] = True
                self._now += entry[0]
        self._note_peaks()

    def _note_peaks(self):
        """Raises the peaks to what is kept now."""
        self.peak_in_flight = max(self.peak_in_flight, self._now)
        self.peak_micro_batches = max(self.peak_micro_batches, len(self._kept))
        self.peak_weight_copies = max(self.peak_weight_copies, self._own_copies())

    def _own_copies(self):
        """The weight copies kept that no longer share the weights' memory."""
        return sum(1 for entry in self._shared.values() if entry[2])

    def released(self, key):
        """Counts the backward of `key`: what its forward kept is freed."""
        self._now -= self._kept.pop(key, 0)
        copy = self._copy_of.pop(key, None)
        entry = self._shared.get(copy)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                self._now -= entry[0] if entry[2] else 0
                del self._shared[copy]

    def clear(self):
        """Forgets every in-flight micro-batch (an aborted epoch); keeps the peaks."""
        self._kept.clear()
        self._shared.clear()
        self._copy_of.clear()
        self._now = 0

    def reset_peak(self):
        """Starts a new peak from what is in flight now."""
        self.peak_in_flight = self._now
        self.peak_micro_batches = len(self._kept)
        self.peak_weight_copies = self._own_copies()

    def estimate(self):
        """Returns the stage's `MemoryEstimate` (reads the device's peak on GPUs)."""
        return MemoryEstimate(
            weights=self.weights,
            slots=self.slots,
            peak_in_flight=self.peak_in_flight,
            peak_micro_batches=self.peak_micro_batches,
            device_peak=device_peak_bytes(self.device),
            peak_weight_copies=self.peak_weight_copies,
        )


def per_example_bytes(tensors):
    """The bytes of one example of `tensors` (their static shapes past the batch axis)."""
    total = 0
    for t in tensors:
        count = 1
        for dim in t.shape[1:]:
            count *= int(dim or 0)
        total += count * t.dtype.size
    return total
