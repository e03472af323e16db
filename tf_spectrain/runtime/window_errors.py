"""Which pass of a window graph an error came from: the passes' name scopes, read back.

Every pass of a window graph (`runtime.window_graph`) runs in a name scope that says its
stage, kind, mini-batch and replica (`pass_name`); `failed_op` reads them (or the stage's
nested function, or the layer) back from an error's message, so that
`runtime.window_epoch` can say which stage failed in which pass.
"""

import re

from tf_spectrain.runtime.passes import failed_function


def pass_name(k, kind, relative, micro, r):
    """The name scope of a pass: stage, kind, mini-batch from the window's first, micro-batch,
    replica (`failed_op` reads it back from an error)."""
    return f"stage{k}_{kind}_b{relative}_m{micro}_r{r}"


_PASS_NAME = re.compile(r"stage(\d+)_(forward|backward|update)_b(-?\d+)_m(\d+)_r(\d+)")


def failed_op(error, layers=()):
    """Where the op that raised `error` ran, as far as its message tells: `(stage, pass kind
    or None, mini-batch counted from the window's first or None, replica or None, layer or
    None)`, or None.

    An op of the window's own graph is named by its pass (`pass_name`); one inside a stage's
    nested graph function by the function (`passes.failed_function`: the stage and kind,
    not the mini-batch) or, where the message names only the op, by its layer.

    Args:
        error: the exception.
        layers: each stage's layer names, stage 0 first (to find a layer's stage).
    """
    text = str(error)
    first = re.search(r"\[\[(.*?)\]\]", text)
    where = first.group(1) if first else text
    match = _PASS_NAME.search(where)
    if match is not None:
        k, kind, relative, _, r = match.groups()
        return int(k), kind, int(relative), int(r), None
    inner = failed_function(where)
    if inner is not None:
        return inner[0], inner[1], None, None, None
    node = re.search(r"\{\{node ([^/}]+)", where)
    if node is not None:
        layer = re.sub(r"_\d+$", "", node.group(1))
        for k, names in enumerate(layers):
            if layer in names:
                return k, None, None, None, layer
    return None
