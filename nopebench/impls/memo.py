"""One conversion of a cache per cache tensor, shared by every problem that reads it.

A benchmark prepares many problems (rotating index sets) over one cache, and an adapter that
needs the cache in another form (a bf16 copy, rows widened to 656 bytes) would otherwise build
a second copy of a gigabyte per problem.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

_CONVERTED: dict[int, dict] = {}


def memo_by_cache(kind: str, cache: torch.Tensor, rope_dim: int, build: Callable[[], T]) -> T:
    """`build()` once per cache tensor, contents version, kind and rope_dim.

    Entries belong to the tensor object and die with it, never keyed by its address alone: a
    freed cache's address is reused by the next one, whose contents differ. Only the newest
    conversion of a cache is kept (an older one is stale or of another kind), so at most one
    extra copy of each cache stays alive beyond those the prepared closures hold.
    """
    entry = _CONVERTED.get(id(cache))
    if entry is None or entry["tensor"]() is not cache:
        entry = _CONVERTED[id(cache)] = {"tensor": weakref.ref(cache), "items": {}}
        weakref.finalize(cache, _CONVERTED.pop, id(cache), None)
    key = (kind, cache._version, rope_dim)
    if key not in entry["items"]:
        entry["items"] = {key: build()}
    return entry["items"][key]
