"""Pure functions for the fp8_ds_mla row and the sparse top-k buffer.

The row (one token, one KV head): bytes 0:512 hold 512 float8_e4m3fn latent values in four
tiles of 128, bytes 512:528 four fp32 scales (one a tile), bytes 528:656 64 bf16 RoPE values,
all zero when the model has no RoPE (a compact NoPE row stops at 528). The top-k index buffer is
wider than index_topk when the indexer pools candidates: round_up(index_topk + kpool - 1, 128).

Nothing here touches a device; every number the harness derives from a model config comes
from these functions, so tests and commands agree by construction.
"""

from __future__ import annotations

from typing import Literal, get_args

LATENT_DIM = 512  # kv_lora_rank: the only value the fp8_ds_mla row supports
TILE = 128  # latent values per fp32 scale
N_TILES = LATENT_DIM // TILE
ROPE_DIM = 64  # bf16 RoPE lanes a full row reserves
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_OFFSET = LATENT_DIM  # bytes 512:528 hold the four fp32 scales
ROPE_OFFSET = SCALE_OFFSET + 4 * N_TILES  # 528: bytes 528:656 hold 64 bf16 RoPE values
FULL_ROW_BYTES = ROPE_OFFSET + 2 * ROPE_DIM  # 656
NOPE_ROW_BYTES = ROPE_OFFSET  # 528: compact NoPE row, no RoPE tail
TOPK_ALIGN = 128
UPCONVERT_DIM = LATENT_DIM + ROPE_DIM  # 576 bf16 per gathered row
# The two scale formats: the one list of their names (configs, kernels and their ABI codes,
# which follow this order, take it from here).
ScaleFormat = Literal["arbitrary_fp32", "pow2_fp32"]
SCALE_FORMATS: tuple[str, ...] = get_args(ScaleFormat)
ARBITRARY_FP32, POW2_FP32 = SCALE_FORMATS
# An unused cache byte: 0xFF is NaN as float8_e4m3fn and, four of them, as an fp32 scale, so a
# kernel that reads a slot no index names shows NaN.
POISON_BYTE = 0xFF


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= `value`."""
    if multiple <= 0:
        raise ValueError(f"multiple must be positive, got {multiple}")
    return -(-value // multiple) * multiple


def topk_buffer_width(index_topk: int, index_kpool: int) -> int:
    """Physical width of the sparse top-k index buffer.

    kpool widens the indexer's candidate set by kpool - 1 entries, and the buffer is padded to
    a multiple of 128: round_up(index_topk + index_kpool - 1, 128). 2048 + 4 - 1 -> 2176.
    """
    if index_topk <= 0 or index_kpool <= 0:
        raise ValueError(
            f"index_topk and index_kpool must be positive, got {index_topk}, {index_kpool}"
        )
    return round_up(index_topk + index_kpool - 1, TOPK_ALIGN)


def max_active_topk(index_topk: int, index_kpool: int) -> int:
    """Most valid (non -1) entries a top-k row can hold: index_topk + index_kpool - 1."""
    return index_topk + index_kpool - 1


def qk_dim(rope_dim: int) -> int:
    """Width of absorbed queries and keys: 512 for NoPE, 576 with RoPE."""
    return LATENT_DIM + rope_dim


def row_bytes_read(rope_dim: int) -> int:
    """Bytes of a cache row a decode kernel must read: 528 for NoPE, 656 with RoPE."""
    return FULL_ROW_BYTES if rope_dim else NOPE_ROW_BYTES


def decode_flops(query_tokens: int, heads: int, active: int, d_qk: int) -> int:
    """FLOPs of sparse decode: 2*T*H*active*(d_qk + 512) (QK^T plus PV)."""
    return 2 * query_tokens * heads * active * (d_qk + LATENT_DIM)


def decode_bytes(query_tokens: int, heads: int, active: int, row_bytes: int, d_qk: int) -> int:
    """Fewest bytes sparse decode moves: the gathered rows, bf16 queries and bf16 outputs."""
    rows = query_tokens * active * row_bytes
    query = query_tokens * heads * d_qk * 2
    output = query_tokens * heads * LATENT_DIM * 2
    return rows + query + output


def cache_write_bytes(tokens: int, rope_dim: int, row_bytes: int) -> int:
    """Bytes concat_and_cache moves: bf16 latent and RoPE in, one packed row out per token."""
    return tokens * (2 * LATENT_DIM + 2 * rope_dim + row_bytes)


def gather_bytes(tokens: int, row_bytes_in: int) -> int:
    """Bytes gather/upconvert moves: the packed row in, 576 bf16 out per token."""
    return tokens * (row_bytes_in + 2 * UPCONVERT_DIM)
