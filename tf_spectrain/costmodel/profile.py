"""What the cost model knows about a model: per-layer times and sizes (pure Python).

A `ModelProfile` is a chain of `LayerProfile`s in the model's topological order, as
`tf_spectrain.partition` sees it, measured at one batch size. A cut after layer `p` ends a
stage there, as the cuts of `PipelineModel` do; `stage_costs` adds up each stage.

`tf_spectrain.costmodel.profile_model` measures a profile of a Keras model; a profile can
also be written by hand (as the tests do) or loaded with `ModelProfile.from_dict`.
"""

import dataclasses

from tf_spectrain import checks
from tf_spectrain.messages import did_you_mean


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """One layer: its compute times at the profile's batch size and its sizes.

    Args:
        name: the layer's name (a cut names the layer that ends a stage).
        forward_time: seconds of the layer's forward pass on a whole profiled batch, >= 0.
        backward_time: seconds of its backward pass (gradients of its weights and of its
            inputs) on a whole profiled batch, >= 0.
        output_bytes: bytes per example that cross a cut placed after this layer, >= 0:
            the layer's output in a chain; in a residual block also the tensors that skip
            over it. A pipeline sends this forward (activations) and the same amount back
            (their gradients).
        weight_bytes: bytes of the layer's trainable weights (what data parallelism
            all-reduces as gradients), >= 0.
        activation_bytes: bytes per example of the layer's own outputs (what a training
            step keeps for the backward), >= 0; 0 when unknown.

    Raises:
        TypeError, ValueError: if a field has the wrong type or is negative.
    """

    name: str
    forward_time: float
    backward_time: float
    output_bytes: float = 0.0
    weight_bytes: float = 0.0
    activation_bytes: float = 0.0

    def __post_init__(self):
        checks.check_instance("name", self.name, str)
        if not self.name:
            raise ValueError("`name` must be a non-empty string. Received: name=''")
        for field, what in (
            ("forward_time", "seconds"),
            ("backward_time", "seconds"),
            ("output_bytes", "bytes per example"),
            ("weight_bytes", "bytes"),
            ("activation_bytes", "bytes per example"),
        ):
            value = checks.check_number(field, getattr(self, field), 0.0, meaning=what)
            object.__setattr__(self, field, value)


@dataclasses.dataclass(frozen=True)
class StageCost:
    """The sums over one pipeline stage, at the profile's batch size.

    Attributes:
        index: the stage index `k`.
        first, last: positions of the stage's first and last layer.
        forward_time, backward_time: seconds per profiled batch.
        weight_bytes: bytes of the stage's trainable weights.
        input_bytes: bytes per example the stage receives (0 for stage 0).
        output_bytes: bytes per example it sends on (0 for the last stage).
    """

    index: int
    first: int
    last: int
    forward_time: float
    backward_time: float
    weight_bytes: float
    input_bytes: float
    output_bytes: float


class ModelProfile:
    """Per-layer times and sizes of a model, in topological order, at one batch size.

    Args:
        layers: a non-empty sequence of `LayerProfile` with distinct names.
        batch_size: the batch size the times were measured at, an int >= 1. The cost
            model scales times linearly with the batch size.
        name: a label for tables (e.g. the model's name).
        input_bytes: bytes per example of the model's inputs, >= 0 (what stage 0 keeps
            per mini-batch in flight); 0 when unknown.

    Raises:
        TypeError: if `layers` is not a sequence of `LayerProfile`.
        ValueError: if it is empty, repeats a name, or `batch_size` is not >= 1.
    """

    def __init__(self, layers, batch_size, name="model", input_bytes=0.0):
        if isinstance(layers, (str, bytes)) or not isinstance(layers, (list, tuple)):
            raise TypeError(
                "`layers` must be a list of LayerProfile, one per layer in model order. "
                f"Received: layers={layers!r}"
            )
        if not layers:
            raise ValueError("`layers` must hold at least one LayerProfile. Received: layers=[]")
        for i, layer in enumerate(layers):
            if not isinstance(layer, LayerProfile):
                raise TypeError(
                    "`layers` must contain only LayerProfile instances. "
                    f"Received: layers[{i}]={layer!r}"
                )
        names = [layer.name for layer in layers]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"Layer names must be distinct. Repeated: {repeated}")
        self.layers = tuple(layers)
        self.batch_size = checks.check_int(
            "batch_size", batch_size, 1, meaning="the batch size the profile was measured at"
        )
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a string. Received: name={name!r}")
        self.name = name
        self.input_bytes = checks.check_number(
            "input_bytes", input_bytes, 0.0, meaning="bytes per example"
        )
        self._index = {n: p for p, n in enumerate(names)}

    def __len__(self):
        return len(self.layers)

    def __repr__(self):
        return (
            f"ModelProfile(name={self.name!r}, layers={len(self.layers)}, "
            f"batch_size={self.batch_size})"
        )

    @property
    def names(self):
        """The layer names, in order."""
        return [layer.name for layer in self.layers]

    @property
    def forward_time(self):
        """Seconds of the whole model's forward pass on a profiled batch."""
        return sum(layer.forward_time for layer in self.layers)

    @property
    def backward_time(self):
        """Seconds of the whole model's backward pass on a profiled batch."""
        return sum(layer.backward_time for layer in self.layers)

    @property
    def weight_bytes(self):
        """Bytes of all trainable weights."""
        return sum(layer.weight_bytes for layer in self.layers)

    # --- cuts -------------------------------------------------------------------------

    def cut_positions(self, cuts):
        """Turns cut points into layer positions.

        Args:
            cuts: a list of layer names or of int positions (not mixed), each ending a
                stage, in model order; `len(cuts) + 1` stages. Position `p` ends a stage
                after layer `p`, so it must be in `0 .. len(self) - 2`.

        Returns:
            The list of positions, strictly increasing.

        Raises:
            TypeError: if `cuts` is not a list of names or ints.
            ValueError: for an unknown name, a position out of range, or cuts that repeat,
                go backwards or leave the last stage empty.
        """
        if isinstance(cuts, (str, bytes)):
            raise TypeError(
                "`cuts` must be a list of layer names or positions, not a single string. "
                f"Received: cuts={cuts!r}; did you mean cuts=[{cuts!r}]?"
            )
        if not isinstance(cuts, (list, tuple)):
            raise TypeError(
                f"`cuts` must be a list of layer names or int positions. Received: cuts={cuts!r}"
            )
        cuts = list(cuts)
        if all(isinstance(c, str) for c in cuts):
            positions = [self._position_of(name, cuts) for name in cuts]
        elif all(checks.is_int(c) for c in cuts):
            positions = [int(c) for c in cuts]
            last = len(self.layers) - 2
            for p in positions:
                if not 0 <= p <= last:
                    raise ValueError(
                        f"Cut positions must be in [0, {last}]: position p ends a stage after "
                        f"layer p, and the last layer ({len(self.layers) - 1}) must stay in "
                        f"the last stage. Received: cuts={cuts}"
                    )
        else:
            raise TypeError(
                "`cuts` must be all layer names (str) or all int positions. "
                f"Received: cuts={cuts!r}"
            )
        if any(b <= a for a, b in zip(positions, positions[1:])):
            raise ValueError(
                "`cuts` must be in model order without repeats (every stage needs a layer). "
                f"Received: cuts={cuts} (positions {positions})"
            )
        if positions and positions[-1] == len(self.layers) - 1:
            raise ValueError(
                f"`cuts` must leave at least one layer for the last stage, but "
                f"'{self.layers[-1].name}' is the last layer. Received: cuts={cuts}"
            )
        return positions

    def _position_of(self, name, cuts):
        if name not in self._index:
            names = self.names
            listed = names if len(names) <= 10 else names[:10] + [f"... ({len(names) - 10} more)"]
            raise ValueError(
                f"`cuts` must name layers of the profile '{self.name}'. Received: "
                f"cuts={cuts}"
                + (did_you_mean(name, names) or f"; '{name}' is not one. Layers: {listed}")
            )
        return self._index[name]

    def stage_costs(self, cuts):
        """Adds up the layers of each stage.

        Args:
            cuts: layer names or positions, as `cut_positions` takes them; `[]` makes one
                stage of the whole model.

        Returns:
            A list of `len(cuts) + 1` `StageCost`.

        Raises:
            TypeError, ValueError: as `cut_positions`.
        """
        bounds = [-1] + self.cut_positions(cuts) + [len(self.layers) - 1]
        stages = []
        for k, (before, last) in enumerate(zip(bounds, bounds[1:])):
            part = self.layers[before + 1 : last + 1]
            stages.append(
                StageCost(
                    index=k,
                    first=before + 1,
                    last=last,
                    forward_time=sum(layer.forward_time for layer in part),
                    backward_time=sum(layer.backward_time for layer in part),
                    weight_bytes=sum(layer.weight_bytes for layer in part),
                    input_bytes=0.0 if before < 0 else self.layers[before].output_bytes,
                    output_bytes=0.0 if k == len(bounds) - 2 else self.layers[last].output_bytes,
                )
            )
        return stages

    # --- serialisation ----------------------------------------------------------------

    def to_dict(self):
        """The profile as a JSON-friendly dict (`from_dict` reads it back)."""
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "input_bytes": self.input_bytes,
            "layers": [dataclasses.asdict(layer) for layer in self.layers],
        }

    @classmethod
    def from_dict(cls, config):
        """Builds a profile from `to_dict`'s output.

        Args:
            config: a dict with keys "layers" (a list of `LayerProfile` field dicts) and
                "batch_size", and optionally "name" (default "model") and "input_bytes".

        Returns:
            A `ModelProfile`.

        Raises:
            TypeError, ValueError: if `config` is not such a dict or holds invalid values.
        """
        if not isinstance(config, dict) or not {"layers", "batch_size"} <= set(config):
            raise TypeError(
                "`config` must be a dict with keys 'layers' and 'batch_size' (and optionally "
                f"'name'), as ModelProfile.to_dict returns. Received: {config!r:.200}"
            )
        layers = [LayerProfile(**layer) for layer in config["layers"]]
        return cls(
            layers,
            config["batch_size"],
            config.get("name", "model"),
            input_bytes=config.get("input_bytes", 0.0),
        )


def scale_stage(layers, first, last, forward, forward_backward):
    """Scales `layers[first..last]` (in place) so that they add up to a stage's measured
    forward and forward + backward seconds (a layer list of a `ModelProfile`).

    Per-layer times do not add up to a whole stage's: each layer timed alone pays a call's
    overhead, and a stage moves memory differently (docs/COSTMODEL.md, "Planned cuts").
    """
    part = layers[first : last + 1]
    predicted_f = sum(layer.forward_time for layer in part)
    predicted_b = sum(layer.backward_time for layer in part)
    rf = forward / predicted_f if predicted_f > 0 else 1.0
    rb = max(forward_backward - forward, 0.0) / predicted_b if predicted_b > 0 else 1.0
    for i in range(first, last + 1):
        layers[i] = dataclasses.replace(
            layers[i], forward_time=layers[i].forward_time * rf,
            backward_time=layers[i].backward_time * rb,
        )


def calibrate_stages(profile, cuts, measured):
    """`profile` with each stage's layers scaled to the stage's measured times.

    Args:
        profile: a `ModelProfile`.
        cuts: the stages' cuts (as `ModelProfile.cut_positions` takes them).
        measured: one `(forward_seconds, forward_backward_seconds)` per stage, at the
            profile's batch size (e.g. `costmodel.measure_stages`).

    Returns:
        A new `ModelProfile`.

    Raises:
        ValueError: if `measured` does not have one pair per stage.
    """
    stages = profile.stage_costs(cuts)
    if len(measured) != len(stages):
        raise ValueError(
            f"`measured` must give one (forward, forward + backward) pair per stage "
            f"({len(stages)}). Received: {len(measured)} pairs"
        )
    layers = list(profile.layers)
    for stage, (f, fb) in zip(stages, measured):
        scale_stage(layers, stage.first, stage.last, f, fb)
    return ModelProfile(layers, profile.batch_size, profile.name, profile.input_bytes)
