"""Sparse page-table metadata for one decode step.

Pure, vectorised torch functions (CPU or GPU, no host synchronisation unless stated) that turn
the indexer's output into what FlashInfer's sparse MLA kernels take:

- the sizing of the sparse page table: after the upstream fix, `sparse_mla_top_k` and
  `max_seq_len` come from the physical top-k buffer width (`indices.shape[1]`, 2176 for
  GLM-5.3-Flash), not from `index_topk` (2048). The pre-fix rule is kept, named as such, so
  the harness can reproduce FlashInfer's rejection of it;
- logical top-k positions -> physical cache slots through the block table, `-1` preserved;
- valid counts, front-compacted rows (the trtllm-gen kernels read the first `len` entries)
  and the CSR of valid slots (FlashInfer's SM90 fa3 path takes no `-1` entries).

The buffer width itself is `geometry.topk_buffer_width` (one definition in the project).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INVALID = -1  # a padding / out-of-range entry of a top-k row
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PageTableSizing:
    """What a backend passes FlashInfer for one decode step, beside its index buffer.

    buffer_width: physical width W of the top-k index buffer handed to the kernel.
    sparse_mla_top_k, max_seq_len: the page-table capacity the backend declares. FlashInfer's
    SM120 path requires block_tables of exactly (B, 1, sparse_mla_top_k), so any value other
    than W is rejected there.
    """

    rule: str
    buffer_width: int
    sparse_mla_top_k: int
    max_seq_len: int

    def block_tables_shape(self, query_tokens: int) -> tuple[int, int, int]:
        """The shape FlashInfer will demand for block_tables, one request per query token."""
        return (query_tokens, 1, self.sparse_mla_top_k)

    def mismatch(self) -> str | None:
        """None when the declared capacity is the buffer width, else one line saying why not."""
        if self.sparse_mla_top_k == self.buffer_width and self.max_seq_len == self.buffer_width:
            return None
        return (
            f"{self.rule} sizing declares sparse_mla_top_k={self.sparse_mla_top_k}, "
            f"max_seq_len={self.max_seq_len} for a top-k buffer {self.buffer_width} wide"
        )


def sizing_from_buffer(topk_indices_physical: torch.Tensor | int) -> PageTableSizing:
    """The fixed rule: capacity = physical buffer width (`topk_indices_physical.shape[1]`).

    `-1` entries pad each row and bound its active length, so declaring the full width is
    always safe; the kernel never reads past a row's valid entries.
    """
    width = (
        topk_indices_physical
        if isinstance(topk_indices_physical, int)
        else int(topk_indices_physical.shape[1])
    )
    if width <= 0:
        raise ValueError(f"top-k buffer width must be positive, got {width}")
    return PageTableSizing("fixed", width, width, width)


def prefix_sizing(index_topk: int, buffer_width: int) -> PageTableSizing:
    """The pre-fix rule (the bug): capacity = the model's index_topk, whatever the buffer is.

    Kept only to reproduce the upstream failure; equal to the fixed rule exactly when kpool
    does not widen the buffer (DeepSeek-V3.2: 2048 == 2048).
    """
    if index_topk <= 0 or buffer_width <= 0:
        raise ValueError(
            f"index_topk and buffer_width must be positive, got {index_topk}, {buffer_width}"
        )
    return PageTableSizing("pre-fix", buffer_width, index_topk, index_topk)


def logical_to_physical(
    topk_logical: torch.Tensor,
    block_table: torch.Tensor,
    req_of_token: torch.Tensor,
    block_size: int,
    num_blocks: int | None = None,
) -> torch.Tensor:
    """Physical cache slot of every top-k entry: [T, W] -> [T, W] int32, -1 padded.

    slot = block_table[req, idx // block_size] * block_size + idx % block_size, where req is
    the request of query token t (`req_of_token[t]`). An entry becomes -1 when the logical
    index is negative, when idx // block_size is past the end of the request's block table,
    when the block id found there is negative, or (if `num_blocks` is given) when it is
    >= num_blocks. Nothing is read out of bounds in any of those cases.
    """
    if topk_logical.dim() != 2 or topk_logical.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"topk_logical must be int32/int64 [T, W], got {topk_logical.dtype} "
            f"{tuple(topk_logical.shape)}"
        )
    if block_table.dim() != 2 or block_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"block_table must be int32/int64 [R, max_blocks], got {block_table.dtype} "
            f"{tuple(block_table.shape)}"
        )
    if req_of_token.shape != (topk_logical.shape[0],):
        raise ValueError(
            f"req_of_token must be [T={topk_logical.shape[0]}], got {tuple(req_of_token.shape)}"
        )
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    device = topk_logical.device
    if block_table.device != device or req_of_token.device != device:
        raise ValueError("topk_logical, block_table and req_of_token must share a device")
    tokens, width = topk_logical.shape
    requests, max_blocks = block_table.shape
    if tokens and requests == 0:
        raise ValueError("req_of_token names requests but block_table has none")
    if max_blocks == 0 or tokens == 0 or width == 0:
        return torch.full((tokens, width), INVALID, dtype=torch.int32, device=device)
    req = req_of_token.long()
    if int(req.min()) < 0 or int(req.max()) >= requests:  # host sync: a bad table is a caller bug
        raise ValueError(f"req_of_token holds a request outside [0, {requests})")
    idx = topk_logical.long()
    column = torch.div(idx, block_size, rounding_mode="floor")
    in_table = (idx >= 0) & (column < max_blocks)
    rows = block_table.long()[req]  # [T, max_blocks]
    block = torch.gather(rows, 1, column.clamp(0, max_blocks - 1))
    valid = in_table & (block >= 0)
    if num_blocks is not None:
        valid &= block < num_blocks
    slot = block * block_size + torch.remainder(idx, block_size)
    slot = torch.where(valid, slot, INVALID)
    if slot.numel() and int(slot.max()) > INT32_MAX:  # host sync: conversion is host-side work
        raise ValueError(f"physical slot {int(slot.max())} does not fit int32")
    return slot.to(torch.int32)


def valid_counts(indices: torch.Tensor) -> torch.Tensor:
    """Number of valid (>= 0) entries per row: [T, W] -> [T] int32."""
    _check_indices(indices)
    return (indices >= 0).sum(dim=1, dtype=torch.int32)


def compact_to_front(indices: torch.Tensor) -> torch.Tensor:
    """Each row's valid entries moved to its front in their original order, -1 after them.

    [T, W] -> [T, W] int32. Kernels that take a per-row length (trtllm-gen's native NoPE path)
    read only the first `valid_counts` entries, so -1 must not sit between valid ones.
    """
    _check_indices(indices)
    invalid = (indices < 0).to(torch.int8)
    order = torch.sort(invalid, dim=1, stable=True).indices
    compact = torch.gather(indices, 1, order)
    return torch.where(compact >= 0, compact, INVALID).to(torch.int32)


@dataclass(frozen=True)
class CsrMetadata:
    """Valid slots of every query token as CSR, one request per query token, page_size 1.

    qo_indptr [T+1] = 0..T; kv_indptr [T+1] prefix sums of kv_len; kv_indices [nnz] the valid
    slots row by row in their original order; kv_len [T]. All int32 on the indices' device.
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_len: torch.Tensor


def csr_of_valid(indices: torch.Tensor) -> CsrMetadata:
    """CSR of the valid entries of a -1 padded [T, W] index buffer (host sync: nnz is data)."""
    _check_indices(indices)
    tokens = indices.shape[0]
    valid = indices >= 0
    kv_len = valid.sum(dim=1, dtype=torch.int32)
    kv_indptr = torch.zeros(tokens + 1, dtype=torch.int32, device=indices.device)
    kv_indptr[1:] = torch.cumsum(kv_len, dim=0, dtype=torch.int32)
    return CsrMetadata(
        qo_indptr=torch.arange(tokens + 1, dtype=torch.int32, device=indices.device),
        kv_indptr=kv_indptr,
        kv_indices=indices[valid].to(torch.int32),
        kv_len=kv_len,
    )


def _check_indices(indices: torch.Tensor) -> None:
    if indices.dim() != 2 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"indices must be int32/int64 [T, W], got {indices.dtype} {tuple(indices.shape)}"
        )
