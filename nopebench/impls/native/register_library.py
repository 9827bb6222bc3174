"""The native register decode kernel (CUDA C++, `cuda/register_decode.cu`): its library, its
ctypes binding and its launch.

16 heads a CTA, the dequantized rows kept in registers as mma.sync fragments; one source for
NoPE rows (512-wide QK) and for RoPE or shim rows (576-wide), the width chosen per launch.
Built by the project's nvcc build (`cuda_build`) for the local GPU on first use, like the cache
kernels; called with raw pointers on torch's current stream, so CUDA graphs capture it.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from nopebench import cuda_build
from nopebench import geometry as g
from nopebench.cuda_build import Binding, CudaLibrary
from nopebench.errors import SystemFailedError, UnsupportedError
from nopebench.impls.native.constants import (
    REG_BLOCK_H,
    REG_BLOCK_N,
    REG_CTAS_PER_SM,
    REG_INDEX_CAP,
    REG_STAGES,
)
from nopebench.impls.native.plans import LaunchPlan

ABI_VERSION = 1  # must equal kAbiVersion in cuda/register_decode.cuh

REGISTER_LIBRARY = CudaLibrary(
    name="decode",
    label="native register decode kernel",
    source_dir=Path(__file__).resolve().parent / "cuda",
    source="register_decode.cu",
    filename="libnopedecode.so",
    # IEEE divide and subnormals kept; the dequantization's multiplies are explicit
    # round-to-nearest ones, which contraction never fuses.
    flags=("-ftz=false", "-prec-div=true"),
    min_sm=89,  # the e4m3x2 conversion
    # The kernel's shape, as the planner plans it (the source checks what it assumes of them).
    defines=(
        ("NOPEDECODE_HEADS", REG_BLOCK_H),
        ("NOPEDECODE_BLOCK_N", REG_BLOCK_N),
        ("NOPEDECODE_STAGES", REG_STAGES),
        ("NOPEDECODE_MIN_BLOCKS", REG_CTAS_PER_SM),
        ("NOPEDECODE_INDEX_CAP", REG_INDEX_CAP),
    ),
)


class Params(ctypes.Structure):
    """`nopedecode::Params`, field for field (its size is checked against the library's)."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("q_stride_t", ctypes.c_longlong),
        ("q_stride_h", ctypes.c_longlong),
        ("cache", ctypes.c_void_p),
        ("indices", ctypes.c_void_p),
        ("idx_stride_t", ctypes.c_longlong),
        ("out", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("part", ctypes.c_void_p),
        ("part_lse", ctypes.c_void_p),
        ("scale_log2", ctypes.c_float),
        ("row_bytes", ctypes.c_int),
        ("tokens", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("width", ctypes.c_int),
        ("per_split", ctypes.c_int),
        ("splits", ctypes.c_int),
    ]


_i32, _ptr = ctypes.c_int, ctypes.c_void_p
SIGNATURES = {
    "nopedecode_abi_version": ([], _i32),
    "nopedecode_params_bytes": ([], _i32),
    "nopedecode_index_cap": ([], _i32),
    "nopedecode_smem_bytes": ([_i32], _i32),  # rope
    "nopedecode_error_string": ([_i32], ctypes.c_char_p),
    # params, rope, stream
    "nopedecode_register_decode": ([ctypes.POINTER(Params), _i32, _ptr], _i32),
}
BINDING = Binding(REGISTER_LIBRARY, SIGNATURES, "nopedecode_abi_version", ABI_VERSION)
LOG2E = 1.4426950408889634


def load_library(device: torch.device) -> ctypes.CDLL:
    """The library for `device`'s architecture, checked against the binding (once a device:
    launches call this)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _checked_library(index)


def check_library(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` if its struct size and staged-index capacity are the ones this binding and the
    planner assume, else RuntimeError naming the first that is not."""
    if lib.nopedecode_params_bytes() != ctypes.sizeof(Params):
        raise RuntimeError(
            f"the decode library's Params is {lib.nopedecode_params_bytes()} bytes, the "
            f"binding's {ctypes.sizeof(Params)}"
        )
    if lib.nopedecode_index_cap() != REG_INDEX_CAP:
        raise RuntimeError(
            f"the decode library stages {lib.nopedecode_index_cap()} index entries a split, the "
            f"planner plans for {REG_INDEX_CAP}"
        )
    return lib


@functools.cache
def _checked_library(index: int) -> ctypes.CDLL:
    from nopebench.console import err_console

    capability = torch.cuda.get_device_capability(index)
    return check_library(cuda_build.load(BINDING, capability, err_console.print))


@functools.cache
def register_missing(device: int = 0) -> str | None:
    """None where the register kernel can run on this device, else why not, in one line (no
    GPU, an architecture without its instructions, no nvcc, a failed build)."""
    if not torch.cuda.is_available():
        return "the register kernel needs a CUDA GPU; none is visible"
    target = cuda_build.target_for_capability(*torch.cuda.get_device_capability(device))
    if not REGISTER_LIBRARY.builds_for(target):
        return f"the register kernel needs sm_{REGISTER_LIBRARY.min_sm} or newer, not {target}"
    try:
        load_library(torch.device("cuda", device))
    except (UnsupportedError, SystemFailedError, RuntimeError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def check_operands(q: torch.Tensor, cache: torch.Tensor, heads: int) -> None:
    """What this kernel needs beyond the decode contract (ValueError): whole 16-head blocks,
    q rows 8-byte aligned (8-byte loads), rows 16-byte aligned (16-byte copies)."""
    if heads % REG_BLOCK_H:
        raise ValueError(f"the register kernel takes heads in blocks of {REG_BLOCK_H}, not {heads}")
    if q.stride(0) % 4 or q.stride(1) % 4 or q.data_ptr() % 8:
        raise ValueError("the register kernel needs q's token and head rows 8-byte aligned")
    if cache.data_ptr() % 16 or not cache.is_contiguous():
        raise ValueError("the register kernel needs a contiguous, 16-byte aligned cache")


def launch(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    rope_dim: int,
    plan: LaunchPlan,
    out: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """One launch of `plan` (a `plan_register` one) on the current stream: into `out` =
    (out, lse) with one split, else into (part, part_lse), which the combine kernel then merges.
    CPU tensors go to the library's CPU emulator, where one is loaded (the tests')."""
    tokens, heads, _ = q.shape
    splits, per_split = plan.splits, plan.entries_per_split
    check_operands(q, cache, heads)
    if per_split % REG_BLOCK_N or per_split > REG_INDEX_CAP:
        raise ValueError(
            f"a split takes a multiple of {REG_BLOCK_N} entries, at most {REG_INDEX_CAP}, "
            f"not {per_split}"
        )
    o, lse = out
    expected = (
        (tokens, heads, g.LATENT_DIM) if splits == 1 else (splits, tokens, heads, g.LATENT_DIM)
    )
    if tuple(o.shape) != expected or not (o.is_contiguous() and lse.is_contiguous()):
        raise ValueError(f"the register kernel writes contiguous {expected} outputs")
    lib = load_library(q.device)
    params = Params(
        q=q.data_ptr(),
        q_stride_t=q.stride(0),
        q_stride_h=q.stride(1),
        cache=cache.data_ptr(),
        indices=indices.data_ptr(),
        idx_stride_t=indices.stride(0),
        out=o.data_ptr() if splits == 1 else None,
        lse=lse.data_ptr() if splits == 1 else None,
        part=o.data_ptr() if splits > 1 else None,
        part_lse=lse.data_ptr() if splits > 1 else None,
        scale_log2=softmax_scale * LOG2E,
        row_bytes=cache.shape[-1],
        tokens=tokens,
        heads=heads,
        width=indices.shape[1],
        per_split=per_split,
        splits=splits,
    )
    stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else None
    code = lib.nopedecode_register_decode(ctypes.byref(params), int(bool(rope_dim)), stream)
    if code:
        message = lib.nopedecode_error_string(code).decode(errors="replace")
        raise RuntimeError(f"register decode launch: CUDA error {code} ({message})")
