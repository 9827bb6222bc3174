"""Known failure signatures of NoPE sparse MLA, recognised wherever the harness meets them
(FlashInfer exceptions, server logs) and explained in one line: which upstream fix is missing."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    name: str
    pattern: re.Pattern[str]
    explanation: str


SIGNATURES = (
    Signature(
        "cache-write-pe-dim",
        re.compile(r"pe_dim must be 64 for fp8_ds_mla"),
        "the fp8_ds_mla cache write rejects pe_dim 0: the NoPE cache-write fix "
        "(concat_and_cache_mla accepting pe_dim in {64, 0}, zeroing the RoPE tail) is missing",
    ),
    Signature(
        "sparse-block-tables-width",
        re.compile(r"expects sparse block_tables shape \((\d+), (\d+), (\d+)\), got \((\d+), (\d+), (\d+)\)"),
        "the backend sized sparse_mla_top_k from index_topk instead of the top-k buffer width: "
        "the sparse page-table capacity fix (size from topk_indices_physical.shape[1]) is missing",
    ),
)


def match(text: str) -> Signature | None:
    """The first known signature found in `text` (an exception message or a log), or None."""
    for sig in SIGNATURES:
        if sig.pattern.search(text):
            return sig
    return None


def explain(text: str) -> str | None:
    """One line naming the missing fix for a known failure in `text`, or None."""
    sig = match(text)
    if sig is None:
        return None
    found = sig.pattern.search(text)
    if sig.name == "sparse-block-tables-width":
        expected, got = found.group(3), found.group(6)
        return f"{sig.explanation} (kernel expected width {expected}, buffer is {got})"
    return sig.explanation
