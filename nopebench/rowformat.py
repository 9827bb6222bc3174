"""Reference implementation of the fp8_ds_mla KV-cache row (layout: geometry.py).

Pure torch, runs on CPU or GPU. This is the one definition every fast path (the CUDA cache
kernels, the decode kernels' dequantization) is checked against, byte for byte.

Row layout, `row_bytes` = 656 (or 528 for compact NoPE rows):
    0:512    512 float8_e4m3fn latent values, 4 tiles of 128
    512:528  4 float32 scales, one per tile
    528:656  64 bfloat16 RoPE values; all zero for NoPE (absent in 528-byte rows)
"""

from __future__ import annotations

import torch

from nopebench import geometry as g

FLT_MIN = torch.finfo(torch.float32).tiny  # smallest normal fp32: keeps all-zero tiles finite
# Rows packed or dequantized at a time on the CPU, where every fp32 intermediate would otherwise
# take 2 KB a row at once (2 GB each at 2**20 tokens). Rows are independent, so the result is
# the same bit for bit; on a GPU everything is one pass, as a timed reference should be.
CPU_CHUNK_ROWS = 1 << 16
POW2_FLOOR = 1e-4  # pow2 scales never go below 2**ceil(log2(1e-4)) = 2**-13
SCALE_FORMATS, ARBITRARY_FP32, POW2_FP32 = g.SCALE_FORMATS, g.ARBITRARY_FP32, g.POW2_FP32
ScaleFormat = g.ScaleFormat
POISON_BYTE = g.POISON_BYTE


def tile_scales(kv_c: torch.Tensor, scale_format: str) -> torch.Tensor:
    """Per-tile fp32 scales. kv_c: [T, 512] bf16 -> [T, 4] fp32.

    arbitrary_fp32: max(amax / 448, FLT_MIN) in fp32 (vLLM's writer, what GLM kernels read).
    pow2_fp32: 2 ** ceil(log2(max(amax / 448, 1e-4))), with the exponent taken exactly from
    frexp so a value just above a power of two never rounds down (log2 in fp32 would).
    """
    check_scale_format(scale_format)
    amax = kv_c.float().reshape(-1, g.N_TILES, g.TILE).abs().amax(dim=-1)
    # A tensor divisor: with a Python number torch's CUDA kernel multiplies by 1/448 instead,
    # which differs from the true divide in the last bit for about half of all bf16 maxima.
    ratio = amax / torch.full_like(amax, g.FP8_MAX)
    if scale_format == ARBITRARY_FP32:
        return torch.clamp_min(ratio, FLT_MIN)
    mantissa, exponent = torch.frexp(torch.clamp_min(ratio, POW2_FLOOR))
    # ratio = m * 2**e with m in [0.5, 1): ceil(log2) is e - 1 exactly when m == 0.5.
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype)
    return torch.ldexp(torch.ones_like(ratio), exponent)


def quantize_latent(kv_c: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp8_e4m3(x / scale): true fp32 divide, round-to-nearest-even, saturating at +-448.

    kv_c: [T, 512] bf16, scales: [T, 4] fp32 -> [T, 512] float8_e4m3fn.
    torch's cast maps overflow to NaN, so the clamp is what makes it saturating.
    """
    x = kv_c.float().reshape(-1, g.N_TILES, g.TILE) / scales.unsqueeze(-1)
    return x.clamp(-g.FP8_MAX, g.FP8_MAX).to(torch.float8_e4m3fn).view(-1, g.LATENT_DIM)


def pack_rows(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor | None,
    scale_format: str,
    row_bytes: int = g.FULL_ROW_BYTES,
) -> torch.Tensor:
    """Packed rows for T tokens. kv_c [T, 512] bf16, k_pe [T, 64] bf16 or None/[T, 0] (NoPE).

    Returns [T, row_bytes] uint8. NoPE rows in a 656-byte layout get bytes 528:656 zeroed.
    """
    rope_dim = check_write_inputs(kv_c, k_pe, row_bytes)
    scales = tile_scales(kv_c, scale_format)
    rows = torch.zeros(kv_c.shape[0], row_bytes, dtype=torch.uint8, device=kv_c.device)
    rows[:, : g.SCALE_OFFSET] = quantize_latent(kv_c, scales).view(torch.uint8)
    rows[:, g.SCALE_OFFSET : g.ROPE_OFFSET] = scales.contiguous().view(torch.uint8)
    if rope_dim:
        rows[:, g.ROPE_OFFSET :] = k_pe.contiguous().view(torch.uint8)
    return rows


def write_cache(
    cache: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    scale_format: str,
) -> None:
    """concat_and_cache_ds_mla: write token t's packed row to slot slot_mapping[t], in place.

    cache: [num_blocks, block_size, row_bytes] uint8; slot = block * block_size + offset.
    Slots < 0 are skipped. Every argument error raises ValueError before anything is written.
    """
    check_cache(cache)
    row_bytes = cache.shape[-1]
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != kv_c.shape[0]:
        raise ValueError(
            f"slot_mapping must be [T] with T = {kv_c.shape[0]}, got {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    devices = [t.device for t in (kv_c, k_pe, slot_mapping) if t is not None]
    if any(d != cache.device for d in devices):
        raise ValueError(
            "kv_c, k_pe, slot_mapping and cache must share a device, got "
            f"{[str(d) for d in devices]} and {cache.device}"
        )
    check_write_inputs(kv_c, k_pe, row_bytes)
    check_scale_format(scale_format)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    capacity = cache.shape[0] * cache.shape[1]
    if slots.numel():
        if int(slots.max()) >= capacity:
            raise ValueError(
                f"slot {int(slots.max())} out of range for a cache of {capacity} slots"
            )
        if torch.unique(slots).numel() != slots.numel():
            raise ValueError(
                "slot_mapping writes the same slot twice; which row wins would be unspecified"
            )
    flat = cache.view(capacity, row_bytes)
    step = CPU_CHUNK_ROWS if cache.device.type == "cpu" else max(1, kv_c.shape[0])
    for start in range(0, kv_c.shape[0], step):
        stop = start + step
        part = pack_rows(
            kv_c[start:stop], None if k_pe is None else k_pe[start:stop], scale_format, row_bytes
        )
        mask = keep[start:stop]
        flat[slot_mapping[start:stop][mask].long()] = part[mask]


def split_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Views of packed rows [N, row_bytes] uint8 -> (fp8 latent [N,512], scales [N,4] fp32,
    RoPE [N,64] bf16 or None for 528-byte rows)."""
    if (
        rows.dtype != torch.uint8
        or rows.dim() != 2
        or rows.shape[1] not in (g.NOPE_ROW_BYTES, g.FULL_ROW_BYTES)
    ):
        raise ValueError(
            f"rows must be uint8 [N, 528 or 656], got {rows.dtype} {tuple(rows.shape)}"
        )
    rows = rows.contiguous()
    latent = rows[:, : g.SCALE_OFFSET].view(torch.float8_e4m3fn)
    scales = rows[:, g.SCALE_OFFSET : g.ROPE_OFFSET].contiguous().view(torch.float32)
    rope = (
        rows[:, g.ROPE_OFFSET :].contiguous().view(torch.bfloat16)
        if rows.shape[1] == g.FULL_ROW_BYTES
        else None
    )
    return latent, scales, rope


def dequantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp8 -> float * scale -> bf16.

    rows [N, row_bytes] uint8 -> (latent [N, 512] bf16, RoPE [N, 64] bf16 or None)."""
    latent, scales, rope = split_rows(rows)
    values = latent.float().view(-1, g.N_TILES, g.TILE) * scales.unsqueeze(-1)
    return values.view(-1, g.LATENT_DIM).to(torch.bfloat16), rope


def read_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Packed rows at the given physical slots: [N] -> [N, row_bytes] uint8.

    Every slot must be in [0, capacity): a negative slot would silently wrap to the end of the
    cache under Python indexing, so -1 entries must be filtered out by the caller.
    """
    check_cache(cache)
    flat = cache.view(-1, cache.shape[-1])
    slots = slots.long()
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= flat.shape[0]):
        raise ValueError(
            f"slots must be in [0, {flat.shape[0]}), got min {int(slots.min())}, max "
            f"{int(slots.max())}"
        )
    return flat[slots]


def gather_upconvert(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    total_rows: int,
    rope_dim: int,
    seq_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """cp_gather_and_upconvert_fp8_kv_cache: per-request gather into a bf16 workspace.

    Request r owns output rows [workspace_starts[r], workspace_starts[r+1]) (the last request
    runs to total_rows) and reads its tokens from position seq_starts[r] (default 0) on,
    through block_table[r, pos // block_size]. Output [total_rows, 576] bf16: 512 dequantized
    latent values, then the 64 RoPE lanes copied bit-exactly for rope_dim 64, or exactly zero
    for rope_dim 0 whatever the tail bytes hold.
    """
    plan = gather_plan(cache, block_table, workspace_starts, total_rows, rope_dim, seq_starts)
    flat = cache.view(-1, cache.shape[-1])
    out = torch.zeros(total_rows, g.UPCONVERT_DIM, dtype=torch.bfloat16, device=cache.device)
    step = CPU_CHUNK_ROWS if cache.device.type == "cpu" else max(1, total_rows)
    for start in range(0, total_rows, step):
        latent, rope = dequantize_rows(flat[plan[start : start + step]])
        out[start : start + step, : g.LATENT_DIM] = latent
        if rope_dim:
            out[start : start + step, g.LATENT_DIM :] = rope
    return out


def gather_plan(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    total_rows: int,
    rope_dim: int,
    seq_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The physical slot each gathered output row reads, [total_rows] int64, after checking
    every argument (ValueError on any inconsistency, before anything is read)."""
    check_cache(cache)
    if rope_dim not in (0, g.ROPE_DIM):
        raise ValueError(f"rope_dim must be 0 or 64, got {rope_dim}")
    if rope_dim and cache.shape[-1] != g.FULL_ROW_BYTES:
        raise ValueError(f"rope_dim 64 needs 656-byte rows, cache has {cache.shape[-1]}")
    if block_table.dim() != 2 or block_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"block_table must be int32/int64 [R, max_blocks], got {block_table.dtype} "
            f"{tuple(block_table.shape)}"
        )
    num_req = block_table.shape[0]
    if workspace_starts.shape != (num_req,):
        raise ValueError(
            f"workspace_starts must be [{num_req}], got {tuple(workspace_starts.shape)}"
        )
    if seq_starts is not None and seq_starts.shape != (num_req,):
        raise ValueError(f"seq_starts must be [{num_req}], got {tuple(seq_starts.shape)}")
    if total_rows < 0:
        raise ValueError(f"total_rows must be >= 0, got {total_rows}")
    starts = workspace_starts.long().cpu()
    bounds = torch.cat([starts, torch.tensor([total_rows])])
    if num_req and (int(starts[0]) != 0 or bool((bounds[1:] < bounds[:-1]).any())):
        raise ValueError(
            f"workspace_starts must start at 0 and be non-decreasing up to {total_rows}"
        )
    if num_req == 0 and total_rows:
        raise ValueError("total_rows > 0 with no requests")
    counts = bounds[1:] - bounds[:-1]
    request = torch.repeat_interleave(torch.arange(num_req), counts)
    offset = torch.arange(total_rows) - starts[request]
    base = seq_starts.long().cpu()[request] if seq_starts is not None else torch.zeros_like(offset)
    if bool((base < 0).any()):
        raise ValueError("seq_starts must be >= 0")
    pos = base + offset
    block_size = cache.shape[1]
    block_col = pos // block_size
    if total_rows and int(block_col.max()) >= block_table.shape[1]:
        raise ValueError(
            f"a request reads position {int(pos.max())}, past its block_table row of "
            f"{block_table.shape[1]} blocks"
        )
    blocks = block_table.long().cpu()[request, block_col]
    if total_rows and (int(blocks.min()) < 0 or int(blocks.max()) >= cache.shape[0]):
        raise ValueError(
            f"block_table holds a block id outside [0, {cache.shape[0]}) for a gathered position"
        )
    return (blocks * block_size + pos % block_size).to(cache.device)


def check_scale_format(scale_format: str) -> None:
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}, got {scale_format!r}")


def check_cache(cache: torch.Tensor) -> None:
    if cache.dtype != torch.uint8 or cache.dim() != 3:
        raise ValueError(
            f"cache must be uint8 [num_blocks, block_size, row_bytes], got {cache.dtype} "
            f"{tuple(cache.shape)}"
        )
    if cache.shape[-1] not in (g.NOPE_ROW_BYTES, g.FULL_ROW_BYTES):
        raise ValueError(f"cache rows must be 528 or 656 bytes, got {cache.shape[-1]}")
    if not cache.is_contiguous():
        raise ValueError("cache must be contiguous")


def check_write_inputs(kv_c: torch.Tensor, k_pe: torch.Tensor | None, row_bytes: int) -> int:
    """Validate writer inputs; return the RoPE width (0 or 64)."""
    if kv_c.dtype != torch.bfloat16 or kv_c.dim() != 2 or kv_c.shape[1] != g.LATENT_DIM:
        raise ValueError(
            f"kv_c must be bf16 [T, 512] (kv_lora_rank 512), got {kv_c.dtype} {tuple(kv_c.shape)}"
        )
    rope_dim = 0 if k_pe is None else k_pe.shape[-1]
    if k_pe is not None:
        if k_pe.dtype != torch.bfloat16 or k_pe.dim() != 2 or k_pe.shape[0] != kv_c.shape[0]:
            raise ValueError(
                f"k_pe must be bf16 [T, 64] or [T, 0], got {k_pe.dtype} {tuple(k_pe.shape)}"
            )
        if rope_dim not in (0, g.ROPE_DIM):
            raise ValueError(f"pe_dim must be 64 or 0 for fp8_ds_mla, got {rope_dim}")
    if row_bytes not in (g.NOPE_ROW_BYTES, g.FULL_ROW_BYTES):
        raise ValueError(f"row_bytes must be 528 or 656, got {row_bytes}")
    if rope_dim and row_bytes != g.FULL_ROW_BYTES:
        raise ValueError(
            "compact 528-byte rows hold no RoPE lanes: use 656-byte rows for pe_dim 64"
        )
    return rope_dim
