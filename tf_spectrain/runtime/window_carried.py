"""What crosses a window boundary: the names of the carried values, what a window graph
returns of them, and what its caller hands to the next window.

Names count mini-batches from the first one the next window reports
(`kind/stage/batch-base/micro/replica`), so that every window of the same shape has the
same inputs and outputs and reuses one traced graph. A tensor that came in and goes on as
it is (held for a later pass) is not returned: a graph function's output comes back by way
of an Identity op on the caller's device, and `graphs.outputs_stay_put` places only what
the graph computes, so across hosts it would travel to the trainer and back. It is None in
the returned value, and the caller puts it back (`hand_on`).
"""

import tensorflow as tf


def encode(key, base):
    """The name of a carried value: `kind/stage/batch-base/micro/replica`."""
    kind, numbers = key[0], list(key[1:])
    numbers[1] -= base  # every key is (kind, stage, batch, ...)
    return "/".join([kind] + [str(n) for n in numbers])


def decode(name, base):
    """The key `encode` named."""
    kind, *numbers = name.split("/")
    numbers = [int(n) for n in numbers]
    numbers[1] += base
    return (kind, *numbers)


def arrivals(carried):
    """`{id(tensor): (name, index)}`: where each tensor of the window's `carried` came in
    (its value's name, its index in `tf.nest.flatten` of the value). None leaves are left
    out: every None has the same id."""
    return {id(t): (name, index) for name, value in carried.items()
            for index, t in enumerate(tf.nest.flatten(value)) if t is not None}


def outgoing(live, arrived, stop, notes):
    """The carried values a window graph returns: `live` (`{key: value}`) named for the
    window that starts at mini-batch `stop`, each tensor that came in (`arrived`) left out
    (None) and noted in `notes` as `("through", name, per leaf None or (name, index))`."""
    carried = {}
    for key, value in live.items():
        name, leaves = encode(key, stop), tf.nest.flatten(value)
        came = tuple(arrived.get(id(t)) for t in leaves)
        if any(came):
            notes.append(("through", name, came))
            value = tf.nest.pack_sequence_as(
                value, [None if c else t for c, t in zip(came, leaves)])
        carried[name] = value
    return carried


def hand_on(returned, notes, carried):
    """What a window hands to the next: its `returned` carried values with the tensors that
    came in `carried` and go on as they are put back (the notes' `"through"`)."""
    handed, came_in = dict(returned), {}
    for note in notes:
        if note[0] == "through":
            _, name, given = note
            leaves = tf.nest.flatten(handed[name])
            for index, g in enumerate(given):
                if g is not None:
                    if g[0] not in came_in:
                        came_in[g[0]] = tf.nest.flatten(carried[g[0]])
                    leaves[index] = came_in[g[0]][g[1]]
            handed[name] = tf.nest.pack_sequence_as(handed[name], leaves)
    return handed
