"""The checks of `StageTerms`' arguments: stage profiles and links (pure Python)."""

from tf_spectrain import checks
from tf_spectrain.costmodel.profile import ModelProfile


def check_profiles(profiles, num_stages):
    """`profiles` (one `ModelProfile`, or one per stage, all of the same layers) as a list of
    `num_stages`; raises TypeError or ValueError naming what is wrong."""
    if isinstance(profiles, ModelProfile):
        return [profiles] * num_stages
    if not isinstance(profiles, (list, tuple)) or not all(
        isinstance(p, ModelProfile) for p in profiles
    ):
        raise TypeError(
            "`profiles` must be a ModelProfile or a list of them, one per stage. "
            f"Received: profiles={profiles!r:.200}"
        )
    if len(profiles) != num_stages:
        raise ValueError(
            f"`profiles` must hold one profile per stage: {num_stages} stages but "
            f"{len(profiles)} profiles."
        )
    names = profiles[0].names
    for k, p in enumerate(profiles):
        if p.names != names:
            raise ValueError(
                f"`profiles` must all describe the same layers: profiles[{k}] ('{p.name}') "
                f"differs from profiles[0] ('{profiles[0].name}')."
            )
    return list(profiles)


def check_links(name, links, length, default):
    """`links` as `length` lists of `(bandwidth, latency)` pairs (None gives `default` each);
    raises TypeError or ValueError naming the bad value."""
    if links is None:
        return [list(default)] * length
    if not isinstance(links, (list, tuple)) or len(links) != length:
        raise ValueError(
            f"`{name}` must be a list of {length} lists of (bandwidth, latency), one per "
            f"{'hop' if name == 'hop_links' else 'stage'}. Received: {name}={links!r:.200}"
        )
    out = []
    for i, group in enumerate(links):
        checks.check_instance(f"{name}[{i}]", group, (list, tuple), " of (bandwidth, latency)")
        pairs = []
        for link in group:
            if not isinstance(link, (list, tuple)) or len(link) != 2:
                raise TypeError(
                    f"`{name}[{i}]` must hold (bandwidth, latency) pairs. Received: {link!r}"
                )
            bandwidth, latency = link
            pairs.append((
                checks.check_number(f"{name}[{i}] bandwidth", bandwidth, 0.0, strict=True,
                                    allow_inf=True, meaning="bytes per second"),
                checks.check_number(f"{name}[{i}] latency", latency, 0.0, meaning="seconds"),
            ))
        out.append(pairs)
    return out
