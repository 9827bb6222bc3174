"""Load the CUDA cache library for the local GPU (building it on first use) through ctypes.

ctypes with raw pointers and torch's current stream is the whole binding: nothing here needs
torch's CUDA headers, so the same library builds on CPU-only machines (the CPU torch wheel
lacks the generated CUDA headers a torch extension would need).
"""

from __future__ import annotations

import ctypes
import threading

import torch

from nopebench.cache_kernels.build import build_library, target_for_capability
from nopebench.errors import UnsupportedError

ABI_VERSION = 2  # must equal kAbiVersion in cuda/cache_kernels.cuh

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

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Give every exported function its C signature (ctypes would guess int otherwise)."""
    for name, (args, result) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = result
    return lib


def load_library(device: torch.device) -> ctypes.CDLL:
    """The library built for `device`'s architecture, compiled once and then cached on disk."""
    if not torch.cuda.is_available():
        raise UnsupportedError("the CUDA cache kernels need a CUDA GPU; none is visible")
    major, minor = torch.cuda.get_device_capability(device)
    target = target_for_capability(major, minor)
    with _lock:
        if target not in _loaded:
            from nopebench.console import err_console

            result = build_library(target)
            if not result.cached:
                err_console.print(
                    f"built the CUDA cache kernels for {target} in {result.seconds:.1f} s: "
                    f"{result.library}"
                )
            lib = declare(ctypes.CDLL(str(result.library)))
            version = lib.nopecache_abi_version()
            if version != ABI_VERSION:
                raise UnsupportedError(
                    f"{result.library} has ABI {version}, expected {ABI_VERSION}: rebuild with "
                    "`nopebench build --force`"
                )
            _loaded[target] = lib
        return _loaded[target]


def check(lib: ctypes.CDLL, code: int, what: str) -> None:
    """Raise with the CUDA runtime's own words when a launcher returned an error."""
    if code:
        message = lib.nopecache_error_string(code).decode(errors="replace")
        raise RuntimeError(f"{what}: CUDA error {code} ({message})")
