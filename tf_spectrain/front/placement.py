"""Where a `PipelineModel`'s stages run: devices, planned cuts, the stage copies, their weights.

`StagePlacement` is a mixin of `PipelineModel`. It resolves the stage devices the
constructor was given (one list, or with replicas one per copy of the pipeline), plans the
cuts of `cuts="auto"` (`costmodel.auto_partition`, with the pipeline's `options`), splits
the built model and places a copy of each stage on its device, in every replica
(`tf_spectrain.partition`). `use_cuts` re-cuts a planned pipeline; the `copy_weights_*`
methods and `sync_replicas` move weights between the wrapped model and the stages.

Placing stages creates layers whose initializers and seed generators draw from Python's
`random` (Keras' default seeds); it leaves Python's and NumPy's global random state as it
was, so what a user's script draws next (the next model's initial weights, a `PyDataset`'s
shuffled order) is what the same script draws in Keras.
"""

import contextlib
import random

import numpy as np

from tf_spectrain import checks, partition
from tf_spectrain import devices as devices_lib
from tf_spectrain.costmodel import autoplan
from tf_spectrain.partition import autocuts
from tf_spectrain.partition.cuts import check_cut_names
from tf_spectrain.partition.mirror import WeightMirror
from tf_spectrain.partition.model_memory import warn_if_model_on_stage_device
from tf_spectrain.runtime import replicas as replicas_lib

__all__ = ["StagePlacement"]


@contextlib.contextmanager
def _random_state_kept():
    """Restores Python's and NumPy's global random state on exit (see the module docstring)."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


class StagePlacement:
    """Placing a `PipelineModel`'s stages, and moving weights between them and its model.

    Reads the pipeline's `model`, `options`, `replicas`, `planned_cuts` and `_loop`; sets
    `cuts`, `num_stages`, `stages`, `devices`, `plans`, the `replica_*` lists and
    `partition_plan`, and clears what `compile` builds from the stages.
    """

    def _stage_devices(self, cuts, devices, num_stages, profile_batch_size):
        """Checks the constructor's devices and returns `(devices, profile_batch_size)`.

        With replicas it keeps the R lists of N device names (`_grid_devices`) and returns
        replica 0's; with `cuts="auto"` it resolves the devices (`autocuts.stage_devices`).
        """
        self._grid_devices = None  # with replicas: R lists of N device names
        # One stage per device unless the model has too few places to cut (autocuts).
        self._any_stage_count = self.planned_cuts and devices is None and num_stages is None
        if self.replicas > 1:
            if devices is None and num_stages is None and self.planned_cuts:
                devices = autocuts.stage_devices(None, None)  # every GPU, else every CPU
            stages = num_stages if self.planned_cuts else len(cuts) + 1
            self._grid_devices = replicas_lib.replica_devices(devices, self.replicas, stages)
            devices, num_stages = self._grid_devices[0], None
        if self.planned_cuts:
            devices = autocuts.stage_devices(devices, num_stages)
            profile_batch_size = checks.check_int("profile_batch_size", profile_batch_size, 1)
        elif devices is not None:
            partition.check_stage_devices(devices, len(cuts) + 1)
        if not self._any_stage_count:  # N is known: 2bw's `accumulate` is checked now
            self.options.updates_every(len(devices) if self.planned_cuts else len(cuts) + 1)
        return devices, profile_batch_size

    def _place(self, cuts, devices, profile_batch_size, memory_limit, link_bandwidth):
        """Plans the cuts (for `"auto"`), splits the (built) model and places its stages,
        leaving Python's and NumPy's global random generators as they were."""
        with _random_state_kept():
            self._plan_and_build(cuts, devices, profile_batch_size, memory_limit,
                                 link_bandwidth)

    def _plan_and_build(self, cuts, devices, profile_batch_size, memory_limit,
                        link_bandwidth):
        """`_place`'s work."""
        if self.planned_cuts:
            if self._any_stage_count and self.replicas == 1:
                devices = autocuts.devices_for_model(self.model, devices)
            if len(devices) > 1:
                self.partition_plan = autoplan.auto_partition(
                    self.model,
                    devices,
                    batch_size=profile_batch_size,
                    memory_limit=memory_limit,
                    link_bandwidth=link_bandwidth,
                    options=self.options,
                )
            cuts = [] if self.partition_plan is None else self.partition_plan.cuts
        self._build(list(cuts), devices)
        # An extra copy on an accelerator:
        warn_if_model_on_stage_device(self.model, self.all_devices)

    def _build(self, cuts, devices):
        """Splits the model at `cuts` and places the stages on `devices` (None: defaults)."""
        self._split = partition.split_model(self.model, cuts)
        self.cuts = list(cuts)
        self.num_stages = len(self._split)
        if devices is None:
            devices = devices_lib.default_devices(self.num_stages)
        self.stages = partition.place_stages(self._split, devices)
        self.devices = list(devices)
        grid = self._grid_devices or [self.devices]
        self.replica_devices = [self.devices] + [list(d) for d in grid[1:]]
        self.replica_stages = [self.stages] + [
            partition.place_stages(self._split, d) for d in grid[1:]]
        self._mirror = WeightMirror(self._split, self.replica_stages)
        self.replica_runners = None
        self.options.updates_every(self.num_stages)  # raises for 2bw's `accumulate` < N
        self.plans = self.options.pass_plans(self.num_stages)
        self.runners = None
        self._uncompiled_runners = None  # predict's, before compile
        self.optimizer = None
        self._evaluator = None

    def use_cuts(self, cuts):
        """Re-cuts a pipeline whose cuts were planned (`cuts="auto"`), before training.

        A restored checkpoint uses this to train at the cuts it was saved with (timings
        vary between runs, so a fresh plan may differ). The stages are rebuilt from the
        model's current weights on the same devices, and compiled again as before.

        Args:
            cuts: a list of `num_stages - 1` layer names.

        Raises:
            ValueError: if the cuts were given rather than planned and differ, the number
                of stages would change, or training has started.
            TypeError, ValueError: for cuts that are not layers of the model.
        """
        cuts = list(check_cut_names(cuts))
        if cuts == self.cuts:
            return
        if not self.planned_cuts:
            raise ValueError(
                f"This pipeline was built with the cuts {self.cuts}; only planned cuts "
                f"(cuts='auto') can be replaced. Received: cuts={cuts}"
            )
        if len(cuts) != len(self.cuts):
            raise ValueError(
                f"`cuts` must keep the pipeline's {self.num_stages} stages "
                f"({self.num_stages - 1} cuts). Received: cuts={cuts}"
            )
        if self._loop is not None:
            raise ValueError("`use_cuts` cannot re-cut a pipeline while `fit` runs.")
        # The wrapped model holds the true weights outside `fit` (which copies them to the
        # stages first); the new stages are built from them, so nothing is copied back.
        compiled = self._compiled_with
        self._build(cuts, self.devices)
        self.partition_plan = None
        if compiled is not None:
            self.compile(*compiled)

    @property
    def all_devices(self):
        """Every stage's device, replica 0's stages first (`replicas` x `num_stages`)."""
        return [d for devices in self.replica_devices for d in devices]

    def copy_weights_to_stages(self):
        """Brings the stages (of every replica) up to date with the wrapped model: copies
        the model's weights (BatchNorm statistics included) written since the two last
        agreed, every weight the first time (`partition.mirror.WeightMirror`)."""
        self._mirror.to_stages()

    def copy_weights_to_model(self):
        """Brings `model` up to date with the stages: copies replica 0's weights (BatchNorm
        statistics included) into it, unless it already holds them; a weight written into
        the model since the two last agreed wins and goes to the stages instead."""
        self._mirror.to_model()

    def stages_moved_on(self):
        """Notes that the stages' weights were set (a restore): `model` is behind until
        `copy_weights_to_model`, which then takes every weight from the stages."""
        self._mirror.moved_on(overriding=True)

    def epoch_trained(self):
        """After an epoch of training: each non-trainable weight (BatchNorm's statistics)
        set to its mean over the replicas, in every replica; `model` behind until
        `copy_weights_to_model` (which `fit` calls where something may read it)."""
        replicas_lib.average_non_trainable(self.replica_stages)
        self._mirror.moved_on()

    def sync_replicas(self):
        """Copies replica 0's weights and optimizer state into the other replicas.

        A restored checkpoint (which holds replica 0) calls it; nothing to do without
        replicas.
        """
        if self.replicas > 1:
            replicas_lib.broadcast_first(
                self.replica_stages,
                [[r.optimizer for r in runners] for runners in self._require_replica_runners()],
            )
