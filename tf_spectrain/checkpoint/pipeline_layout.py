"""A pipeline's state by the wrapped model's variables: saved from its stages, restored into
stages cut anywhere (`tf_spectrain.checkpoint.layout` names the keys).

Stage k's placed copy (`pipe.stages[k]`) holds its variables in the order of the split
sub-model it was cloned from (`pipe._split[k]`, which shares the wrapped model's own
layers), so the two pair by position, and the sub-model's variables are the model's own
objects: that gives each stage variable its index in `pipe.model.variables`. Names differ
between copies and cuts, so nothing here pairs by name. Each optimizer variable's role
(one weight's slot, or a scalar) comes from `workflow.optimizer_view.variable_roles`.
Replica 0 is saved; a restore writes replica 0 and the pipeline then broadcasts it.
"""

import keras
import numpy as np
import tensorflow as tf

from tf_spectrain import partition, prediction
from tf_spectrain.checkpoint import layout
from tf_spectrain.checkpoint.format import CheckpointError
from tf_spectrain.workflow import optimizer_view

U_PRODUCT = "_u_product"
"""The scalar of Keras' `Nadam` (and `prediction.Nadam`) that depends on `beta_1`."""


def _model_indices(pipe):
    """`{id(variable): index}` over the wrapped model's variables."""
    return {id(v): i for i, v in enumerate(pipe.model.variables)}


def _indices(index, sub_model, copy=None):
    """The model indices of `sub_model`'s variables (paired by position with `copy`'s)."""
    variables = list(sub_model.variables)
    if copy is not None:
        copies = list(copy.variables)
        shapes = [tuple(v.shape) for v in variables], [tuple(v.shape) for v in copies]
        if shapes[0] != shapes[1]:
            raise ValueError(
                f"Stage '{copy.name}' does not hold the variables of the model's layers it "
                f"was copied from: shapes {shapes[1]}, expected {shapes[0]}."
            )
    missing = [v.path for v in variables if id(v) not in index]
    if missing:
        raise ValueError(f"Variables of no layer of the wrapped model: {missing}")
    return [index[id(v)] for v in variables]


def _optimizer_keys(k, optimizer, weights, indices):
    """The layout keys of stage k's optimizer variables, its slots keyed by model index."""
    by_weight = {id(w): i for w, i in zip(weights, indices)}
    roles = []
    for role in optimizer_view.variable_roles(optimizer):
        if role is not None and role[0] == "slot":
            i = by_weight.get(id(role[2]))
            role = None if i is None else ("slot", role[1], i)
        roles.append(role)
    return layout.optimizer_keys(k, roles)


def _live_layout(pipe):
    """Per stage of `pipe` (replica 0): `(variable indices, optimizer keys)`."""
    index = _model_indices(pipe)
    stages = []
    pairs = zip(pipe._split, pipe.stages, pipe.stage_optimizers)  # noqa: SLF001 - see top
    for k, (split, stage, optimizer) in enumerate(pairs):
        indices = _indices(index, split, stage)
        stages.append((indices, _optimizer_keys(k, optimizer, stage.variables, indices)))
    return stages


def save_arrays(pipe):
    """Every array of `pipe`'s state under its layout key, and the metadata to add.

    Args:
        pipe: a compiled `PipelineModel`, between epochs.

    Returns:
        `(arrays, metadata)`: a dict of NumPy arrays, and `{"layout": "model",
        "stage_variables": [...]}` (each stage's model variable indices).
    """
    arrays, held = {}, []
    for k, (indices, keys) in enumerate(_live_layout(pipe)):
        held.append(indices)
        variables = list(pipe.stages[k].variables) + list(pipe.stage_optimizers[k].variables)
        for v, key in zip(variables, [layout.variable_key(i) for i in indices] + keys):
            arrays[key] = _value(v)
        scale = pipe.runners[k].loss_scale
        for j, v in enumerate(scale.variables if scale is not None else ()):
            arrays[layout.loss_scale_key(k, j)] = _value(v)
    return arrays, {"layout": layout.MODEL_LAYOUT, "stage_variables": held}


def _value(variable):
    """A variable's value as a NumPy array."""
    return np.asarray(keras.ops.convert_to_numpy(variable.value))


def assignments(pipe, arrays, saved, path):
    """What to assign to `pipe`'s stage and optimizer variables (replica 0), checked.

    The checkpoint's stages may be cut elsewhere and be more or fewer: every variable and
    slot is found by its model index; the scalars of each stage (update count, learning
    rate) and its loss scale come from the saved stage `layout.stage_source` and
    `layout.loss_scale_source` choose, except that on another number of stages a Nadam's
    `_u_product` is recomputed for the stage's own `beta_1` (`nadam_u_product`).

    Args:
        pipe: the compiled `PipelineModel`.
        arrays: the checkpoint's arrays.
        saved: the checkpoint's metadata.
        path: the checkpoint, for messages.

    Returns:
        A list of `(variable, array)`.

    Raises:
        CheckpointError: a value is missing or of another shape, the checkpoint holds model
            values this model does not have, or an optimizer variable of no known role
            would have to move to other cuts.
    """
    if saved.get("layout") != layout.MODEL_LAYOUT:
        arrays = _from_format_1(pipe, arrays, saved, path)
    saved_stages = len(saved.get("cuts") or ()) + 1
    same_cuts = list(saved.get("cuts") or ()) == list(pipe.cuts)
    scales = [arrays.get(layout.loss_scale_key(s, 0), np.inf) for s in range(saved_stages)]
    found, used = [], set()
    for k, (indices, _) in enumerate(_live_layout(pipe)):
        source = layout.stage_source(k, saved_stages, pipe.num_stages)
        stage, optimizer = pipe.stages[k], pipe.stage_optimizers[k]
        keys = [layout.variable_key(i) for i in indices]
        keys += _optimizer_keys(source, optimizer, stage.variables, indices)
        variables = list(stage.variables) + list(optimizer.variables)
        scale = pipe.runners[k].loss_scale
        if scale is not None:
            s = layout.loss_scale_source(k, saved_stages, pipe.num_stages, scales)
            keys += [layout.loss_scale_key(s, j) for j in range(len(scale.variables))]
            variables += list(scale.variables)
        for v, key in zip(variables, keys):
            if "/optimizer_other/" in key and not same_cuts:
                raise CheckpointError(
                    f"Checkpoint {path}: the optimizer variable {v.path} has no known role "
                    f"(neither one weight's slot nor a scalar), so it can be restored only "
                    f"into the checkpoint's cuts {saved.get('cuts')}. Received: cuts="
                    f"{pipe.cuts}"
                )
            value = checked_array(arrays, key, v, path)
            if saved_stages != pipe.num_stages and key == layout.scalar_key(source, U_PRODUCT):
                count = checked_array(arrays, layout.scalar_key(source, "_iterations"),
                                      optimizer.iterations, path)
                value = nadam_u_product(optimizer, count, value)
            found.append((v, value))
            used.add(key)
    extra = sorted(k for k in arrays if k.startswith("model/") and k not in used)
    if extra:
        raise CheckpointError(
            f"Checkpoint {path} holds values this model does not have ({', '.join(extra[:5])}"
            f"{', ...' if len(extra) > 5 else ''}): it was written by a different model or "
            "optimizer."
        )
    return found


def nadam_u_product(optimizer, iterations, saved):
    """Nadam's running product of its momentum schedule after `iterations` updates at the
    optimizer's own `beta_1` (and `momentum_decay`: 1.0 for Keras' Nadam).

    Keras' Nadam keeps `prod_t = mu_1 ... mu_t`, `mu_t = beta_1 (1 - 0.5 * 0.96^(d t))`, in
    one scalar variable per optimizer (`_u_product`). In mode "nesterov" `beta_1` differs per
    stage (SPECTRAIN.md section 6e), so a stage re-cut from a checkpoint of another number
    of stages does not take the saved last stage's product (of another `beta_1`) but this:
    the value it would hold had it always run at its `beta_1`, with the update count it
    restores.

    Args:
        optimizer: the stage's optimizer (possibly wrapped).
        iterations: its restored update count (a scalar array).
        saved: the saved product it would otherwise take (a scalar array).

    Returns:
        A NumPy scalar array of `saved`'s dtype: `saved` itself unless `optimizer` is a
        `keras.optimizers.Nadam`.
    """
    inner = prediction.unwrapped(optimizer)
    if not isinstance(inner, keras.optimizers.Nadam):
        return saved
    decay = float(getattr(inner, "momentum_decay", 1.0))
    steps = np.arange(1, int(np.asarray(iterations)) + 1, dtype=np.float64)
    mu = float(inner.beta_1) * (1.0 - 0.5 * np.power(0.96, steps * decay))
    return np.asarray(np.prod(mu), dtype=saved.dtype)


def checked_array(arrays, key, variable, path):
    """The array of `key` in checkpoint `path`'s `arrays`, for `variable`.

    Raises:
        CheckpointError: it is missing, or has another shape than `variable`.
    """
    if key not in arrays:
        raise CheckpointError(
            f"Checkpoint {path} has no value for {key} ({variable.path}): it was written by "
            "a different model or optimizer."
        )
    value = arrays[key]
    if tuple(value.shape) != tuple(variable.shape):
        raise CheckpointError(
            f"Checkpoint {path}: {key} ({variable.path}) has shape {tuple(value.shape)} but "
            f"this model's variable has shape {tuple(variable.shape)}."
        )
    return value


def _from_format_1(pipe, arrays, saved, path):
    """A checkpoint by stage (format version 1) as layout `"model"`: its stages are the
    model cut at its cuts (this pipeline's own when they match, else split anew, with a
    throwaway optimizer per stage built on them to read the order of its variables)."""
    cuts = saved.get("cuts")
    if not isinstance(cuts, list):
        raise CheckpointError(f"Checkpoint {path} (format version 1) records no cuts.")
    if cuts == list(pipe.cuts):
        stage_keys = [([layout.variable_key(i) for i in indices], keys)
                      for indices, keys in _live_layout(pipe)]
        return layout.from_stage_layout(arrays, stage_keys, path)
    try:
        splits = partition.split_model(pipe.model, cuts)
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            f"Checkpoint {path} (format version 1) was cut after {', '.join(cuts)}, which "
            f"does not cut this model ({error})."
        ) from None
    index = _model_indices(pipe)
    stage_keys = []
    for k, split in enumerate(splits):
        indices = _indices(index, split)
        optimizer = prediction.clone_optimizer(pipe.stage_optimizers[0])
        with tf.device(pipe.devices[0]):
            optimizer.build(split.trainable_variables)
        keys = _optimizer_keys(k, optimizer, split.variables, indices)
        stage_keys.append(([layout.variable_key(i) for i in indices], keys))
    return layout.from_stage_layout(arrays, stage_keys, path)
