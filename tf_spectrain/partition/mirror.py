"""The wrapped model's weights and the stages' copies: moved only where one side needs them.

A pipeline trains its stages' copies of the weights, on the stage devices (maybe on other
hosts); the wrapped Keras model holds the weights a user and the callbacks read. Copying
every weight to the stages at each epoch's start and back at its end sends the whole model
over the links twice an epoch (seconds per epoch for VGG16 at 100 Mbit/s). `WeightMirror`
moves only what is needed:

- `to_stages()`, before the stages run (`fit`, each epoch, `evaluate`, `predict`): the
  model's weights written since the two sides last agreed (by a callback or the user),
  nothing if none was. A write is seen where it goes through the variable's `assign`,
  `assign_add` or `assign_sub` (as `set_weights`, `load_weights` and Keras' callbacks
  do; even of the same value), or where the value differs from a host copy taken when
  the sides agreed (a write to the underlying `tf.Variable`). The first call copies every
  weight.
- `to_model()`, where the model is read (a callback that may read it at an epoch's end,
  the end of `fit`, a restored checkpoint): the stages' weights (replica 0's), except
  those written into the model since the sides agreed, which win (they came after the
  training) and go to every replica's stages instead.
- `moved_on()`: the stages trained (or were restored: then they win); the model is behind.

The host copy costs one model's weights of host memory, and each call compares the model
with it (local work). BatchNorm statistics averaged over replicas are not this module's
business (`runtime.replicas.average_non_trainable`).
"""

import types
import weakref

import numpy as np

from tf_spectrain.partition.placement import copy_weights


def _values(variables):
    """Host copies (NumPy) of `variables`' values."""
    return [np.array(v.numpy(), copy=True) for v in variables]


def _same(a, b):
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


# id(variable) -> (weakref to it, [(weakref to a mirror, index)]): who hears of its writes.
# Keyed by id (Keras variables are not hashable) and checked against the weakref; the hooks
# are bound methods that look here, so a copy of a watched variable (`copy.deepcopy`, as
# `layer_copy` makes for a stage) gets hooks bound to itself, which nobody watches.
_WATCHED = {}


def _watch(variable, mirror, index):
    """Makes the variable's `assign`, `assign_add` and `assign_sub` tell `mirror` that weight
    `index` changed."""
    key = id(variable)
    entry = _WATCHED.get(key)
    if entry is None or entry[0]() is not variable:
        entry = _WATCHED[key] = (weakref.ref(variable, lambda _, key=key: _WATCHED.pop(key, None)),
                                 [])
        for name, write in _HOOKS.items():
            setattr(variable, name, types.MethodType(write, variable))
    entry[1].append((weakref.ref(mirror), index))


def _tell(variable):
    """Tells the live mirrors watching `variable` that it was written."""
    entry = _WATCHED.get(id(variable))
    if entry is None or entry[0]() is not variable:
        return
    for ref, index in list(entry[1]):
        mirror = ref()
        if mirror is None:
            entry[1].remove((ref, index))
        else:
            mirror.note_write(index)


def _assign(variable, *args, **kwargs):
    _tell(variable)
    return type(variable).assign(variable, *args, **kwargs)


def _assign_add(variable, *args, **kwargs):
    _tell(variable)
    return type(variable).assign_add(variable, *args, **kwargs)


def _assign_sub(variable, *args, **kwargs):
    _tell(variable)
    return type(variable).assign_sub(variable, *args, **kwargs)


_HOOKS = {"assign": _assign, "assign_add": _assign_add, "assign_sub": _assign_sub}


def _assign_quietly(variable, value):
    """Assigns without telling the watchers (the mirror's own copies)."""
    type(variable).assign(variable, value)


class WeightMirror:
    """Keeps a wrapped model's weights and its stages' copies in step, copying little.

    Args:
        sources: the wrapped model's stage sub-models (`partition.split_model`), which
            share its variables.
        replica_stages: per replica, the placed stage models (replica 0 first), each of the
            architecture of its source.
    """

    def __init__(self, sources, replica_stages):
        self._sources = list(sources)
        self._replica_stages = [list(stages) for stages in replica_stages]
        self._model = [v for m in self._sources for v in m.weights]
        self._copies = [[v for m in stages for v in m.weights]
                        for stages in self._replica_stages]
        self._agreed = None  # the model's values when the sides last agreed; None: never
        self._behind = False  # the stages moved on since
        self._written_now = set()  # weights written through the hooks since they agreed
        for index, variable in enumerate(self._model):
            _watch(variable, self, index)

    def note_write(self, index):
        """Notes that the model's weight `index` was written (its variable's watcher)."""
        self._written_now.add(index)

    @property
    def model_behind(self):
        """Whether the stages hold weights the model has not seen."""
        return self._behind

    def moved_on(self, overriding=False):
        """Notes that the stages changed (trained): the model is behind. `overriding`
        (a restore): the stages' weights also win over any written into the model."""
        self._behind = True
        if overriding:
            self._agreed = None

    def _written(self):
        """`{index: value}` of the model's weights written since the sides agreed."""
        if self._agreed is None:
            return {}
        now = {}
        for i, (v, before) in enumerate(zip(self._model, self._agreed)):
            value = v.numpy()
            if i in self._written_now or not _same(value, before):
                now[i] = np.array(value, copy=True)
        return now

    def _push(self, written):
        """Assigns the written model values to every replica's copies."""
        for i, value in written.items():
            for copies in self._copies:
                copies[i].assign(value)
            self._agreed[i] = value

    def to_stages(self):
        """Brings the stages up to date with the model's writes; returns how many weights
        were copied (every one the first time)."""
        if self._agreed is None:
            for stages in self._replica_stages:
                copy_weights(self._sources, stages)
            self._agreed = _values(self._model)
            self._written_now.clear()
            return len(self._model)
        written = self._written()
        self._push(written)
        self._written_now.clear()
        return len(written)

    def to_model(self):
        """Brings the model up to date with the stages (the model's own writes since the
        sides agreed win and go to the stages); returns how many weights it copied from the
        stages."""
        if not self._behind:
            return 0
        written = self._written()
        copied = 0
        for i, (v, stage_v) in enumerate(zip(self._model, self._copies[0])):
            if i not in written:
                _assign_quietly(v, stage_v.value)
                copied += 1
        self._push(written)  # none when the sides never agreed
        self._agreed = _values(self._model)
        self._behind = False
        self._written_now.clear()
        return copied
