"""What a stage keeps alive, in bytes: its weights, optimizer slots and in-flight passes.

`StageMemory` counts, for one `StageRunner`, the bytes of everything the stage holds:
- fixed: its variables (trainable and not) and its optimizer's variables (slots);
- while a micro-batch is in flight (from its forward to its backward): its inputs and the
  non-trainable state kept for a recompute, or the activations a kept tape holds (an
  estimate: the bytes of every layer output of the stage for that many examples, in the
  dtype the layers compute in), and the copies of the forward's weights kept for a
  backward that reuses them (one per mini-batch, shared by its micro-batches).

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
    """

    weights: int
    slots: int
    peak_in_flight: int
    peak_micro_batches: int
    device_peak: int = None

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
        self._shared = {}  # mini-batch i -> [bytes of its weight copy, micro-batches using it]
        self._now = 0
        self.peak_in_flight = 0
        self.peak_micro_batches = 0

    def kept(self, key, inputs, tape_examples=0, state=(), weight_copy=None):
        """Counts what the forward of `key = (i, j)` keeps until its backward.

        Args:
            key: `(i, j)`.
            inputs: the input tensors kept.
            tape_examples: the examples whose activations a kept tape holds (0: no tape).
            state: the non-trainable values kept for a recompute.
            weight_copy: the forward's weights kept for the backward (shared by the
                micro-batches of mini-batch i), or None.
        """
        own = (tensor_bytes(inputs) + tensor_bytes(list(state))
               + tape_examples * self.activations_per_example)
        self.kept_bytes(key, own, None if weight_copy is None else tensor_bytes(weight_copy))

    def kept_bytes(self, key, own, weight_copy=None):
        """Counts what the forward of `key = (i, j)` keeps, given in bytes (see `kept`).

        Args:
            key: `(i, j)`.
            own: the bytes of its own inputs, state and activations.
            weight_copy: the bytes of the weight copy it shares with the other
                micro-batches of mini-batch i, or None.
        """
        self._kept[key] = own
        self._now += own
        if weight_copy is not None:
            entry = self._shared.get(key[0])
            if entry is None:
                entry = self._shared[key[0]] = [weight_copy, 0]
                self._now += entry[0]
            entry[1] += 1
        self.peak_in_flight = max(self.peak_in_flight, self._now)
        self.peak_micro_batches = max(self.peak_micro_batches, len(self._kept))

    def released(self, key):
        """Counts the backward of `key`: what its forward kept is freed."""
        self._now -= self._kept.pop(key, 0)
        entry = self._shared.get(key[0])
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                self._now -= entry[0]
                del self._shared[key[0]]

    def clear(self):
        """Forgets every in-flight micro-batch (an aborted epoch); keeps the peaks."""
        self._kept.clear()
        self._shared.clear()
        self._now = 0

    def reset_peak(self):
        """Starts a new peak from what is in flight now."""
        self.peak_in_flight = self._now
        self.peak_micro_batches = len(self._kept)

    def estimate(self):
        """Returns the stage's `MemoryEstimate` (reads the device's peak on GPUs)."""
        return MemoryEstimate(
            weights=self.weights,
            slots=self.slots,
            peak_in_flight=self.peak_in_flight,
            peak_micro_batches=self.peak_micro_batches,
            device_peak=device_peak_bytes(self.device),
        )
