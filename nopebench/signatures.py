"""Known failure signatures of NoPE sparse MLA, recognised wherever the harness meets them
(FlashInfer exceptions, server logs) and explained in one line: which upstream fix is missing."""

from __future__ import annotations

import re
from dataclasses import dataclass

WIDTH_SIGNATURES = ("sparse-block-tables-width", "trtllm-gen-page-table-width")


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
        re.compile(
            r"expects sparse block_tables shape \((\d+), (\d+), (\d+)\), got \((\d+), (\d+), "
            r"(\d+)\)"
        ),
        "the backend sized sparse_mla_top_k from index_topk instead of the top-k buffer width: "
        "the sparse page-table capacity fix (size from topk_indices_physical.shape[1]) is missing",
    ),
    # The same missing fix as FlashInfer's SM100 trtllm-gen shape check words it
    # (`_check_trtllm_gen_mla_shape`): "Expected page_table.shape == (512, 1, 2048), got
    # torch.Size([512, 1, 2176])".
    Signature(
        "trtllm-gen-page-table-width",
        re.compile(
            r"Expected page_table\.shape == \((\d+), (\d+), (\d+)\), "
            r"got (?:torch\.Size\(\[|\()(\d+), (\d+), (\d+)"
        ),
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
    if sig.name in WIDTH_SIGNATURES:
        expected, got = found.group(3), found.group(6)
        return f"{sig.explanation} (kernel expected width {expected}, buffer is {got})"
    return sig.explanation


class KnownFailure(RuntimeError):
    """An error recognised as one of the known upstream failures.

    The message keeps where it happened and the original text, then the one-line explanation,
    so a record or a log line says both what the dependency said and which fix is missing.
    """

    def __init__(self, where: str, original: str, signature: str, explanation: str) -> None:
        super().__init__(f"{where}: {original} [{signature}: {explanation}]")
        self.where = where
        self.original = original
        self.signature = signature
        self.explanation = explanation


def raise_if_known(exc: BaseException, where: str) -> None:
    """Raise KnownFailure (chained to `exc`) when `exc` carries a known signature; else return
    so the caller re-raises the original exception unchanged."""
    if isinstance(exc, KnownFailure):
        return
    text = str(exc)
    sig = match(text)
    if sig is not None:
        raise KnownFailure(where, text, sig.name, explain(text)) from exc
