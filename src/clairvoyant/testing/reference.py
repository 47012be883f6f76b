"""Reference cache simulators, written the plain way, to check the runtime against.

``belady_hits`` is the offline optimum the loader's eviction must match (Belady's
MIN by bytes: on a miss, evict the resident whose next use is farthest away, by the rule
plan/evict.py's ``FarthestNextUse.key`` states, unless the incoming sample itself comes back last); ``lru_hits`` is what a
least-recently-used cache (MosaicML Streaming's ``cache_limit``) gets on the
same accesses. Both return one bool per access.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from ..plan.evict import FarthestNextUse


def _next_use(seq: Sequence[int]) -> list[float]:
    out: list[float] = [float("inf")] * len(seq)
    seen: dict[int, int] = {}
    for i in range(len(seq) - 1, -1, -1):
        out[i] = seen.get(seq[i], float("inf"))
        seen[seq[i]] = i
    return out


def belady_hits(seq: Sequence[int], sizes: Sequence[int], capacity: int,
                residents: dict[int, int] | None = None) -> list[bool]:
    """Hit or miss per access under the offline optimum, starting from ``residents`` (sample -> size,
    each next needed at its first access)."""
    seq = [int(s) for s in seq]
    nxt = _next_use(seq)
    first: dict[int, float] = {}
    for i, s in enumerate(seq):
        first.setdefault(s, i)
    cache: dict[int, float] = {}   # sample -> its next use
    used = 0
    for s, size in sorted((residents or {}).items(), key=lambda kv: first.get(kv[0], float("inf"))):
        if used + size <= capacity:
            cache[s] = first.get(s, float("inf"))
            used += size
    out = []
    for i, s in enumerate(seq):
        if s in cache:
            out.append(True)
            cache[s] = nxt[i]
            continue
        out.append(False)
        size = int(sizes[s])
        victims = []
        while used - sum(int(sizes[v]) for v in victims) + size > capacity:
            rest = [v for v in cache if v not in victims]
            if not rest:
                break
            far = min(rest, key=lambda v: FarthestNextUse.key(cache[v], v))   # the one eviction rule
            if cache[far] <= nxt[i]:
                break
            victims.append(far)
        if used - sum(int(sizes[v]) for v in victims) + size > capacity:
            continue   # bypass: everything resident is needed sooner than s
        for v in victims:
            used -= int(sizes[v])
            del cache[v]
        cache[s] = nxt[i]
        used += size
    return out


def lru_hits(seq: Sequence[int], sizes: Sequence[int], capacity: int) -> list[bool]:
    """Hit or miss per access of a least-recently-used cache of ``capacity`` bytes."""
    cache: OrderedDict[int, int] = OrderedDict()
    used, out = 0, []
    for s in (int(x) for x in seq):
        if s in cache:
            out.append(True)
            cache.move_to_end(s)
            continue
        out.append(False)
        size = int(sizes[s])
        if size > capacity:
            continue
        while used + size > capacity:
            used -= cache.popitem(last=False)[1]
        cache[s] = size
        used += size
    return out
