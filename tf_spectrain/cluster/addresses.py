"""Worker addresses `host:port`: their rule, how they split, and the check of a list of them.

Addresses are compared as written (host names in lower case): `localhost:5000` and
`127.0.0.1:5000` are different addresses here, since telling that they are the same host
needs name resolution. Pure Python.
"""

from tf_spectrain import checks

MAX_PORT = 65535

_ADDRESS_RULE = (
    "host:port, with a non-empty host (an IPv6 address in brackets, as in [::1]:2222) and "
    f"a port that is an integer in [1, {MAX_PORT}]"
)


def split_address(address):
    """Splits a `"host:port"` string into its host and port (no checks).

    Args:
        address: the address; an IPv6 host is written in brackets (`"[::1]:2222"`).

    Returns:
        `(host, port_text)`; `port_text` is None when there is no colon.
    """
    host, colon, port = address.rpartition(":")
    if not colon:
        return address, None
    return host, port


def _address_problem(address):
    """What is wrong with one address, or None when it is valid."""
    if not address:
        return "an empty address"
    host, port = split_address(address)
    if port is None:
        return f"{address!r} has no port"
    if not host:
        return f"{address!r} has an empty host"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not bare or (":" in host and bare == host) or any(c in bare for c in "[] /"):
        return f"{address!r} has an invalid host {host!r}"
    if not port.isdigit():
        return f"{address!r} has a port {port!r} that is not an integer"
    if not 1 <= int(port) <= MAX_PORT:
        return f"{address!r} has a port {port} out of range"
    return None


def normalize_address(address):
    """The canonical `host:port` of a valid address: host in lower case, port without zeros."""
    host, port = split_address(address)
    return f"{host.lower()}:{int(port)}"


def check_addresses(name, addresses, shown):
    """Checks a list of worker addresses: each valid, none repeated, at least one.

    Args:
        name: the flag or argument, for messages (`"--cluster"`, `"TF_CONFIG"`).
        addresses: the list of address strings.
        shown: the value as the user gave it, for the "Received:" part.

    Returns:
        A tuple of normalised addresses.

    Raises:
        ValueError: if the list is empty, an address is malformed, or one is repeated.
    """
    rule = f"a comma-separated list of worker addresses, each {_ADDRESS_RULE}"
    if not addresses:
        raise ValueError(f"{label(name)} must be {rule}; it lists no address. "
                         f"{checks.received(name, shown)}")
    result = []
    for index, address in enumerate(addresses):
        text = address.strip() if isinstance(address, str) else address
        if not isinstance(text, str):
            raise TypeError(
                f"{label(name)} must list addresses as strings; task {index} is "
                f"{checks.show(address)} of type {type(address).__name__}. "
                f"{checks.received(name, shown)}"
            )
        problem = _address_problem(text)
        if problem:
            raise ValueError(f"{label(name)} must be {rule}; task {index} is {problem}. "
                             f"{checks.received(name, shown)}")
        normal = normalize_address(text)
        if normal in result:
            first = result.index(normal)
            raise ValueError(
                f"{label(name)} must list each worker once; tasks {first} and {index} are "
                f"both {normal!r} (each worker needs its own host:port). "
                f"{checks.received(name, shown)}"
            )
        result.append(normal)
    return tuple(result)


def label(name):
    """`name` as messages show it: a `--flag` or `TF_CONFIG` as it is, else in backquotes."""
    return name if name.startswith("--") or name == "TF_CONFIG" else f"`{name}`"
