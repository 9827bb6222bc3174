"""Load the CUDA cache library for the local GPU (building it on first use) through ctypes.

ctypes with raw pointers and torch's current stream is the whole binding: nothing here needs
torch's CUDA headers, so the same library builds on CPU-only machines (the CPU torch wheel
lacks the generated CUDA headers a torch extension would need).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from nopebench import cuda_build
from nopebench.cuda_build import Binding, CudaLibrary, load
from nopebench.errors import UnsupportedError

ABI_VERSION = 2  # must equal kAbiVersion in cuda/cache_kernels.cuh

# Never fast math: the kernels must be bit-exact with the reference, which needs an IEEE
# divide, subnormals kept (no flush to zero) and no multiply-add contraction.
CACHE_LIBRARY = CudaLibrary(
    name="cache",
    label="CUDA cache kernels",
    source_dir=Path(__file__).resolve().parent / "cuda",
    source="cache_kernels.cu",
    filename="libnopecache.so",
    flags=("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false"),
)

_i32, _i64, _ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
SIGNATURES = {
    "nopecache_abi_version": ([], _i32),
    "nopecache_error_string": ([_i32], ctypes.c_char_p),
    # cache, num_slots, row_bytes, kv_c, kv_stride, k_pe, pe_stride, rope_dim, slot_mapping,
    # slot_is_int64, tokens, scale_format, device, stream
    "nopecache_concat_and_cache_ds_mla": (
        [_ptr, _i64, _i32, _ptr, _i64, _ptr, _i64, _i32, _ptr, _i32, _i64, _i32, _i32, _ptr],
        _i32,
    ),
    # cache, num_blocks, block_size, row_bytes, block_table, bt_stride, max_blocks,
    # workspace_starts, seq_starts, num_req, total_rows, rope_dim, out, device, stream
    "nopecache_gather_upconvert": (
        [_ptr, _i64, _i32, _i32, _ptr, _i64, _i32, _ptr, _ptr, _i32, _i64, _i32, _ptr, _i32, _ptr],
        _i32,
    ),
}
BINDING = Binding(CACHE_LIBRARY, SIGNATURES, "nopecache_abi_version", ABI_VERSION)


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The cache library's signatures on `lib` (a library loaded by hand, as the tests do)."""
    return cuda_build.declare(lib, SIGNATURES)


def load_library(device: torch.device) -> ctypes.CDLL:
    """The library built for `device`'s architecture, compiled once and then cached on disk."""
    if not torch.cuda.is_available():
        raise UnsupportedError("the CUDA cache kernels need a CUDA GPU; none is visible")
    from nopebench.console import err_console

    return load(BINDING, torch.cuda.get_device_capability(device), err_console.print)


def check(lib: ctypes.CDLL, code: int, what: str) -> None:
    """Raise with the CUDA runtime's own words when a launcher returned an error."""
    if code:
        message = lib.nopecache_error_string(code).decode(errors="replace")
        raise RuntimeError(f"{what}: CUDA error {code} ({message})")
