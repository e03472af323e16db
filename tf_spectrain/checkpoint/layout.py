"""Where a pipeline's state lies in a checkpoint: by the model's variables, not by stage.

A pipeline checkpoint of layout `"model"` (written since issue 32) keys every array by
what it belongs to in the wrapped Keras model, so that it resumes with any cuts, number of
stages, devices or replicas:

| key                              | what                                                  |
|----------------------------------|-------------------------------------------------------|
| `model/variables/{i}`            | `model.variables[i]`: a weight, a BatchNorm statistic, |
|                                  | a dropout layer's random-generator state              |
| `model/slots/{name}/{i}`         | the optimizer slot `name` (`momentums`, `_velocities`, |
|                                  | `SpecTrain.last_updates`, ...) of `model.variables[i]` |
| `stage{k}/optimizer/{name}`      | stage k's optimizer scalar (`_iterations`,            |
|                                  | `_learning_rate`, Nadam's `_u_product`, ...)          |
| `stage{k}/optimizer_other/{j}`   | stage k's optimizer variable of no known role (rare:  |
|                                  | restored only into the same cuts)                     |
| `stage{k}/loss_scale/{j}`        | stage k's dynamic loss scale and its growth counter   |

The metadata records `layout: "model"`, the cuts and `stage_variables` (the indices `i`
each stage held). Checkpoints without `layout` (format version 1, by stage: the arrays
`stage{k}/variables/{j}` and `stage{k}/optimizer/{j}` in each stage's own order) are
converted with `from_stage_layout`. Pure Python: neither TensorFlow nor Keras.
"""

from tf_spectrain.checkpoint.format import CheckpointError

MODEL_LAYOUT = "model"


def variable_key(i):
    """The key of `model.variables[i]`."""
    return f"model/variables/{i}"


def slot_key(name, i):
    """The key of the optimizer slot `name` of `model.variables[i]`."""
    return f"model/slots/{name}/{i}"


def scalar_key(k, name):
    """The key of stage k's optimizer scalar `name`."""
    return f"stage{k}/optimizer/{name}"


def other_key(k, j):
    """The key of stage k's `j`-th optimizer variable, of no known role."""
    return f"stage{k}/optimizer_other/{j}"


def loss_scale_key(k, j):
    """The key of stage k's `j`-th loss-scale variable (0: the scale, 1: its counter)."""
    return f"stage{k}/loss_scale/{j}"


def optimizer_keys(k, roles):
    """The keys of stage k's optimizer variables, from their roles.

    Args:
        k: the stage.
        roles: one entry per optimizer variable: `("slot", name, i)` with `i` the index of
            the model variable the slot belongs to, `("scalar", name)`, or None.

    Returns:
        A list of keys, one per variable.
    """
    keys = []
    for j, role in enumerate(roles):
        if role is None:
            keys.append(other_key(k, j))
        elif role[0] == "slot":
            keys.append(slot_key(role[1], role[2]))
        else:
            keys.append(scalar_key(k, role[1]))
    return keys


def stage_source(k, saved_stages, num_stages):
    """The saved stage whose scalars stage k takes: k itself when the number of stages is
    the same, else the last saved stage (whose update count and learning rate the wrapped
    model's optimizer shows)."""
    return k if saved_stages == num_stages else saved_stages - 1


def loss_scale_source(k, saved_stages, num_stages, scales):
    """The saved stage whose loss scale stage k takes: k itself when the number of stages
    is the same, else the stage of the smallest saved scale (`scales`, one per saved stage:
    the scale no stage overflowed at)."""
    if saved_stages == num_stages:
        return k
    return min(range(saved_stages), key=lambda s: (scales[s], -s))


def from_stage_layout(arrays, stage_keys, path):
    """Converts a checkpoint of layout by stage (format version 1) to layout `"model"`.

    Args:
        arrays: the checkpoint's arrays (`stage{k}/variables/{j}`, `stage{k}/optimizer/{j}`,
            `stage{k}/loss_scale/{j}`).
        stage_keys: per saved stage, `(variable keys, optimizer keys)`: the layout-`"model"`
            key of each of its variables and optimizer variables, in that stage's order
            (the stages of the model cut at the saved cuts).
        path: the checkpoint, for messages.

    Returns:
        A new dict of the same arrays under layout-`"model"` keys.

    Raises:
        CheckpointError: a stage of the checkpoint holds another number of variables or
            optimizer variables than the model cut at its cuts has.
    """
    converted = {}
    for k, (variable_keys, optimizer_keys_) in enumerate(stage_keys):
        for part, keys in (("variables", variable_keys), ("optimizer", optimizer_keys_)):
            saved = sum(1 for key in arrays if key.startswith(f"stage{k}/{part}/"))
            if saved != len(keys):
                raise CheckpointError(
                    f"Checkpoint {path} (format version 1) holds {saved} {part} for stage "
                    f"{k}, but this model cut at the checkpoint's cuts has {len(keys)}: it "
                    "was written by a different model or optimizer."
                )
            for j, key in enumerate(keys):
                converted[key] = arrays[f"stage{k}/{part}/{j}"]
    converted.update({key: value for key, value in arrays.items() if "/loss_scale/" in key})
    return converted


def describe_cuts(cuts):
    """`"2 stages (cut after dense1)"`, or `"1 stage (uncut)"`, for messages."""
    cuts = list(cuts or ())
    n = len(cuts) + 1
    where = f"cut after {', '.join(cuts)}" if cuts else "uncut"
    return f"{n} stage{'s' if n > 1 else ''} ({where})"
