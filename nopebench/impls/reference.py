"""Reference sparse MLA decode over the packed fp8_ds_mla cache, and its registry entry.

Pure torch, fp32 accumulation, CPU or GPU: the one implementation every decode kernel is
compared with. It dequantizes exactly as `rowformat.dequantize_rows` (fp8 * scale -> bf16), so
a kernel is judged against the function of the dequantized cache, not of the original values.
"""

from __future__ import annotations

import math

import torch

from nopebench import geometry as g
from nopebench import rowformat
from nopebench.impls.interface import DecodeOutput, DecodeProblem, DecodeRun, ImplSpec


def sparse_decode_reference(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    rope_dim: int,
    max_chunk_bytes: int = 1 << 30,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each query token over the cache rows its index row names.

    q: [T, H, 512 + rope_dim] bf16 (rope_dim 0: NoPE; 64: RoPE or the zero-padded shim).
    cache: [num_blocks, block_size, row_bytes] uint8 packed rows (656, or 528 for NoPE).
    indices: [T, W] int32 physical slots; -1 entries are ignored, wherever they sit.
    Returns out [T, H, 512] bf16 = softmax(scale * q.K^T) @ V over the valid entries, and
    lse [T, H] fp32, the natural-log sum of exp(scale * q.K) (-inf, with zero output, for a
    row with no valid entry). K is the dequantized latent (plus the RoPE lanes when rope_dim
    is 64); V is the dequantized latent.
    """
    check_decode_args(q, cache, indices, rope_dim)
    tokens, heads, _ = q.shape
    width = indices.shape[1]
    rows = cache.view(-1, cache.shape[-1])
    out = torch.empty(tokens, heads, g.LATENT_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=q.device)
    per_token = max(1, width * (g.LATENT_DIM + rope_dim) * 4 * 3)
    step = max(1, max_chunk_bytes // per_token)
    for start in range(0, tokens, step):
        sl = slice(start, min(tokens, start + step))
        idx = indices[sl].long()
        valid = idx >= 0
        packed = rows[torch.where(valid, idx, 0).flatten()]
        latent, rope = rowformat.dequantize_rows(packed)
        # A -1 entry gathers row 0 as a stand-in; its values are zeroed so that whatever row 0
        # holds (NaN bytes in an unwritten cache) cannot reach the output through a zero weight.
        values = latent.float().view(idx.shape[0], width, g.LATENT_DIM)
        values = values.masked_fill(~valid.unsqueeze(-1), 0.0)
        keys = (
            values
            if not rope_dim
            else torch.cat([values, rope.float().view(idx.shape[0], width, g.ROPE_DIM)], dim=-1)
        )
        scores = torch.einsum("thd,twd->thw", q[sl].float(), keys) * softmax_scale
        scores = scores.masked_fill(~valid.unsqueeze(1), -math.inf)
        row_lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(
            scores - torch.where(torch.isfinite(row_lse), row_lse, 0.0).unsqueeze(-1)
        )
        weights = torch.where(valid.unsqueeze(1), weights, 0.0)
        out[sl] = torch.einsum("thw,twd->thd", weights, values).to(torch.bfloat16)
        lse[sl] = row_lse
    return out, lse


def check_decode_args(
    q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, rope_dim: int
) -> None:
    """Shape, dtype and device checks shared by every decode implementation (ValueError)."""
    if rope_dim not in (0, g.ROPE_DIM):
        raise ValueError(f"rope_dim must be 0 or 64, got {rope_dim}")
    if q.dtype != torch.bfloat16 or q.dim() != 3 or q.shape[-1] != g.qk_dim(rope_dim):
        raise ValueError(
            f"q must be bf16 [T, H, {g.qk_dim(rope_dim)}], got {q.dtype} {tuple(q.shape)}"
        )
    if (
        cache.dtype != torch.uint8
        or cache.dim() != 3
        or cache.shape[-1] not in (g.NOPE_ROW_BYTES, g.FULL_ROW_BYTES)
    ):
        raise ValueError(
            f"cache must be uint8 [blocks, block_size, 528 or 656], got {cache.dtype} "
            f"{tuple(cache.shape)}"
        )
    if rope_dim and cache.shape[-1] != g.FULL_ROW_BYTES:
        raise ValueError("decode with RoPE lanes needs 656-byte rows")
    if indices.dtype != torch.int32 or indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(
            f"indices must be int32 [T={q.shape[0]}, W], got {indices.dtype} {tuple(indices.shape)}"
        )
    if not (q.device == cache.device == indices.device):
        raise ValueError(
            f"q, cache and indices must share a device, got {q.device}, {cache.device}, "
            f"{indices.device}"
        )


def reference_of(
    problem: DecodeProblem, tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's output and log-sum-exp for the first `tokens` query tokens of `problem`
    (all of them by default)."""
    t = problem.q.shape[0] if tokens is None else tokens
    return sparse_decode_reference(
        problem.q[:t], problem.cache, problem.indices[:t], problem.softmax_scale, problem.rope_dim
    )


def _reference_prepare(problem: DecodeProblem) -> DecodeRun:
    """The reference needs no preparation; its closure is the whole computation."""

    def run() -> DecodeOutput:
        return DecodeOutput(*reference_of(problem))

    return run


def reference_spec() -> ImplSpec:
    return ImplSpec(
        name="reference",
        description="torch reference over the dequantized cache (fp32 accumulation; CPU or GPU)",
        unsupported=lambda problem: None,
        prepare=_reference_prepare,
        deployable="no: the reference every kernel is checked against",
    )
