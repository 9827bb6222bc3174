"""The FlashInfer adapters convert a cache once, and never reuse a conversion for another
cache: a freed cache's address is reused by the next, whose contents differ (on the H200 this
produced wrong fa3 outputs in check-pagetable's graph-capture check)."""

from __future__ import annotations

import gc

import torch

from nopebench.sparse import flashinfer_adapters as fa
from nopebench.sparse.interface import DecodeProblem


def _problem() -> DecodeProblem:
    cache = torch.zeros(4, 64, 528, dtype=torch.uint8)
    return DecodeProblem(torch.zeros(1, 16, 512, dtype=torch.bfloat16), cache, torch.zeros(1, 8, dtype=torch.int32), 1.0, 0)


def test_conversion_is_shared_per_cache_and_rebuilt_when_it_changes():
    builds = []
    p = _problem()
    first = fa._memo_by_cache("bf16", p, lambda: builds.append(1) or object())
    again = fa._memo_by_cache("bf16", p, lambda: builds.append(1) or object())
    assert first is again and len(builds) == 1
    p.cache.add_(1)  # new contents, same tensor
    assert fa._memo_by_cache("bf16", p, lambda: builds.append(1) or object()) is not first and len(builds) == 2


def test_conversion_dies_with_its_cache():
    p = _problem()
    key = id(p.cache)
    fa._memo_by_cache("bf16", p, object)
    assert key in fa._CONVERTED
    del p
    gc.collect()
    assert key not in fa._CONVERTED
    q = _problem()  # may land at the same address: must not see the old conversion
    marker = object()
    assert fa._memo_by_cache("bf16", q, lambda: marker) is marker
