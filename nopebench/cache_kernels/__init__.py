"""CUDA implementation of the fp8_ds_mla cache write and gather/upconvert.

A plain CUDA library (cache_kernels/cuda/cache_kernels.cu) built by `nopebench build` or on first
use, called through ctypes. `write_cache` and `gather_upconvert` have exactly the reference's
signatures (nopebench.rowformat) and are held to it bit for bit by verify-layout.
"""

from __future__ import annotations

from nopebench.cache_kernels.ops import (
    gather_upconvert,
    gather_upconvert_into,
    write_cache,
    write_cache_unchecked,
)

__all__ = ["gather_upconvert", "gather_upconvert_into", "write_cache", "write_cache_unchecked"]
