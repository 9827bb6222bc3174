"""The CUDA cache kernels behind the reference's signatures, and their host-side checks.

`write_cache` and `gather_upconvert` take exactly the arguments of `rowformat.write_cache` and
`rowformat.gather_upconvert` and reject the same bad calls with ValueError before anything is
launched: first the checks that read only shapes, dtypes and pointers, then the ones that read
values (the slots' range and uniqueness; the gather's request table), which synchronise with
the device exactly as the reference's do, and last the device itself, so every argument error
shows up on a CPU-only machine too.

`write_cache_unchecked` and `gather_upconvert_into` skip the value checks: no host
synchronisation, so a benchmark can capture them in a CUDA graph after one validated call.
The kernels stay memory-safe without them: a slot outside the cache is skipped, and a gather
row whose table entry points outside it comes back as NaN.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from nopebench import geometry as g
from nopebench import rowformat
from nopebench.cache_kernels.library import check, load_library

# The kernels' ScaleFormat enum (kernels/ds_mla_numerics.cuh) numbers the formats in this order.
SCALE_FORMAT_CODES = {name: code for code, name in enumerate(rowformat.SCALE_FORMATS)}
INDEX_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1
ALIGN = 16  # the kernels move cache rows and gathered rows in 16-byte pieces


@dataclass(frozen=True)
class WriteCall:
    """A write whose arguments passed every check that reads no values."""

    cache: torch.Tensor
    kv_c: torch.Tensor
    k_pe: torch.Tensor | None
    slot_mapping: torch.Tensor
    scale_format: str
    rope_dim: int


@dataclass(frozen=True)
class GatherCall:
    """A gather whose arguments passed every check that reads no values; index tensors int32."""

    cache: torch.Tensor
    block_table: torch.Tensor
    workspace_starts: torch.Tensor
    seq_starts: torch.Tensor | None
    total_rows: int
    rope_dim: int


# ---------------------------------------------------------------- public entry points


def write_cache(
    cache: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    scale_format: str,
) -> None:
    """concat_and_cache_ds_mla on the GPU: rowformat.write_cache's contract, bit for bit."""
    call = prepare_write(cache, kv_c, k_pe, slot_mapping, scale_format)
    check_slot_values(slot_mapping, cache.shape[0] * cache.shape[1])
    require_cuda(cache)
    launch_write(call)


def gather_upconvert(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    total_rows: int,
    rope_dim: int,
    seq_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """cp_gather_and_upconvert_fp8_kv_cache on the GPU: rowformat.gather_upconvert's contract."""
    call = prepare_gather(cache, block_table, workspace_starts, total_rows, rope_dim, seq_starts)
    # The reference's own value checks (request bounds, positions, block ids), same messages.
    rowformat.gather_plan(
        cache, block_table, workspace_starts, call.total_rows, rope_dim, seq_starts
    )
    require_cuda(cache)
    out = torch.empty(call.total_rows, g.UPCONVERT_DIM, dtype=torch.bfloat16, device=cache.device)
    launch_gather(_on_device(call), out)
    return out


def write_cache_unchecked(
    cache: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    scale_format: str,
) -> None:
    """write_cache without the value checks: no host sync, capturable in a CUDA graph."""
    call = prepare_write(cache, kv_c, k_pe, slot_mapping, scale_format)
    require_cuda(cache)
    launch_write(call)


def gather_upconvert_into(
    out: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    total_rows: int,
    rope_dim: int,
    seq_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """gather_upconvert into `out` without the value checks: no host sync, capturable."""
    call = prepare_gather(cache, block_table, workspace_starts, total_rows, rope_dim, seq_starts)
    require_cuda(cache)
    if (
        out.dtype != torch.bfloat16
        or tuple(out.shape) != (call.total_rows, g.UPCONVERT_DIM)
        or not out.is_contiguous()
    ):
        raise ValueError(
            f"out must be contiguous bf16 [{call.total_rows}, {g.UPCONVERT_DIM}], got {out.dtype} "
            f"{tuple(out.shape)}"
        )
    if out.device != cache.device or out.data_ptr() % ALIGN:
        raise ValueError(f"out must be on {cache.device} and 16-byte aligned")
    launch_gather(_on_device(call), out)
    return out


# ---------------------------------------------------------------- checks


def prepare_write(
    cache: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    scale_format: str,
) -> WriteCall:
    """Every check that reads no values: the reference's, plus the kernel's alignment needs."""
    if scale_format not in SCALE_FORMAT_CODES:
        raise ValueError(
            f"scale_format must be one of {tuple(SCALE_FORMAT_CODES)}, got {scale_format!r}"
        )
    _check_cache(cache)
    rope_dim = rowformat.check_write_inputs(kv_c, k_pe, cache.shape[-1])
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != kv_c.shape[0]:
        raise ValueError(
            f"slot_mapping must be [T] with T = {kv_c.shape[0]}, got {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype not in INDEX_DTYPES:
        raise ValueError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    devices = [t.device for t in (kv_c, k_pe, slot_mapping) if t is not None]
    if any(d != cache.device for d in devices):
        raise ValueError(
            "kv_c, k_pe, slot_mapping and cache must share a device, got "
            f"{[str(d) for d in devices]} and {cache.device}"
        )
    # The kernel reads rows through their row stride; elements within a row must be adjacent.
    kv_c = kv_c if kv_c.stride(-1) == 1 else kv_c.contiguous()
    k_pe = None if not rope_dim else (k_pe if k_pe.stride(-1) == 1 else k_pe.contiguous())
    return WriteCall(cache, kv_c, k_pe, slot_mapping.contiguous(), scale_format, rope_dim)


def check_slot_values(slot_mapping: torch.Tensor, capacity: int) -> None:
    """The reference's value checks on the slots: in range, no slot written twice (host sync)."""
    slots = slot_mapping[slot_mapping >= 0]
    if not slots.numel():
        return
    if int(slots.max()) >= capacity:
        raise ValueError(f"slot {int(slots.max())} out of range for a cache of {capacity} slots")
    if torch.unique(slots).numel() != slots.numel():
        raise ValueError(
            "slot_mapping writes the same slot twice; which row wins would be unspecified"
        )


def prepare_gather(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    total_rows: int,
    rope_dim: int,
    seq_starts: torch.Tensor | None,
) -> GatherCall:
    """Every gather check that reads no values."""
    _check_cache(cache)
    if rope_dim not in (0, g.ROPE_DIM):
        raise ValueError(f"rope_dim must be 0 or 64, got {rope_dim}")
    if rope_dim and cache.shape[-1] != g.FULL_ROW_BYTES:
        raise ValueError(f"rope_dim 64 needs 656-byte rows, cache has {cache.shape[-1]}")
    if block_table.dim() != 2 or block_table.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"block_table must be int32/int64 [R, max_blocks], got {block_table.dtype} "
            f"{tuple(block_table.shape)}"
        )
    num_req = block_table.shape[0]
    for name, t in (("workspace_starts", workspace_starts), ("seq_starts", seq_starts)):
        if t is None:
            continue
        if tuple(t.shape) != (num_req,):
            raise ValueError(f"{name} must be [{num_req}], got {tuple(t.shape)}")
        if t.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if isinstance(total_rows, bool):
        raise ValueError(f"total_rows must be an int, got {total_rows!r}")
    try:
        total_rows = operator.index(total_rows)
    except TypeError:
        raise ValueError(f"total_rows must be an int, got {type(total_rows).__name__}") from None
    if total_rows < 0:
        raise ValueError(f"total_rows must be >= 0, got {total_rows}")
    if num_req == 0 and total_rows:
        raise ValueError("total_rows > 0 with no requests")
    if max(num_req, block_table.shape[1], cache.shape[0]) > INT32_MAX:
        raise ValueError("requests, blocks per request and cache blocks must each fit in int32")
    return GatherCall(cache, block_table, workspace_starts, seq_starts, total_rows, rope_dim)


def require_cuda(cache: torch.Tensor) -> None:
    """Last check before a launch: the kernels run on a CUDA device only."""
    if cache.device.type != "cuda":
        raise ValueError(
            f"the CUDA cache kernels need tensors on a CUDA device, got {cache.device}"
        )


def _check_cache(cache: torch.Tensor) -> None:
    rowformat.check_cache(cache)
    if cache.shape[1] < 1:
        raise ValueError(f"cache block_size must be >= 1, got {cache.shape[1]}")
    if cache.data_ptr() % ALIGN:
        raise ValueError(
            f"cache must start on a {ALIGN}-byte boundary (its rows are moved in 16-byte pieces)"
        )


def _on_device(call: GatherCall) -> GatherCall:
    """Index tensors as contiguous int32 on the cache's device (a no-op when they already are).

    int32 holds every valid value: block ids, request starts and positions are bounded by the
    cache and the table, which prepare_gather limits to int32.
    """
    device = call.cache.device

    def as_i32(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=torch.int32).contiguous()

    table = call.block_table.to(device=device, dtype=torch.int32)
    if table.stride(-1) != 1:
        table = table.contiguous()
    return GatherCall(
        call.cache,
        table,
        as_i32(call.workspace_starts),
        as_i32(call.seq_starts),
        call.total_rows,
        call.rope_dim,
    )


# ---------------------------------------------------------------- launches


def _launch_context(t: torch.Tensor) -> tuple[int, int | None]:
    """(device index, stream handle) of a launch on t's device: torch's current stream, so the
    launch orders with torch's work and is captured by a CUDA graph. CPU tensors (only the
    host emulation of the kernels takes them, in tests) get (0, None)."""
    if t.device.type != "cuda":
        return 0, None
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(t.device).cuda_stream


def launch_write(call: WriteCall) -> None:
    tokens = call.kv_c.shape[0]
    if tokens == 0:
        return
    lib = load_library(call.cache.device)
    cache = call.cache
    k_pe = call.k_pe
    code = lib.nopecache_concat_and_cache_ds_mla(
        cache.data_ptr(),
        cache.shape[0] * cache.shape[1],
        cache.shape[2],
        call.kv_c.data_ptr(),
        call.kv_c.stride(0),
        k_pe.data_ptr() if k_pe is not None else None,
        k_pe.stride(0) if k_pe is not None else 0,
        call.rope_dim,
        call.slot_mapping.data_ptr(),
        int(call.slot_mapping.dtype == torch.int64),
        tokens,
        SCALE_FORMAT_CODES[call.scale_format],
        *_launch_context(cache),
    )
    check(lib, code, "concat_and_cache_ds_mla launch")


def launch_gather(call: GatherCall, out: torch.Tensor) -> None:
    if call.total_rows == 0:
        return
    lib = load_library(call.cache.device)
    cache = call.cache
    seq = call.seq_starts
    code = lib.nopecache_gather_upconvert(
        cache.data_ptr(),
        cache.shape[0],
        cache.shape[1],
        cache.shape[2],
        call.block_table.data_ptr(),
        call.block_table.stride(0),
        call.block_table.shape[1],
        call.workspace_starts.data_ptr(),
        seq.data_ptr() if seq is not None else None,
        call.block_table.shape[0],
        call.total_rows,
        call.rope_dim,
        out.data_ptr(),
        *_launch_context(cache),
    )
    check(lib, code, "gather_upconvert launch")
