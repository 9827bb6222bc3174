"""The `flashmla` registry entry: FlashMLA's sparse fp8 decode, the kernel vLLM's FLASHMLA_SPARSE
backend runs on Hopper (and on Blackwell data-center GPUs).

FlashMLA reads DeepSeek-V3.2 rows, 656 bytes (512 fp8 latent values, four fp32 tile scales, 64
bf16 RoPE values), with 576-wide queries. A NoPE problem therefore runs as the zero-padded shim
FlashMLA needs:
- compact 528-byte rows are widened to 656 bytes with zero RoPE tails, once per cache, in
  `prepare` (never timed). A row whose four scales are all 0xFF bytes (NaN: the poison of a slot
  no writer touched; a writer's scale is a finite positive float) keeps 0xFF in its tail too,
  so the widened cache is poisoned where the compact one is. 656-byte rows are read as they are;
- 512-wide queries get 64 zero lanes, and heads are padded with zero queries to 64 or 128 (the
  only head counts FlashMLA's SM90 kernels exist for); the output is sliced back. The padded
  query is built in `prepare` too, so the time is the kernel's alone.
The T query tokens are one batch of T query positions, q [1, T, heads, 576] with index rows
[1, T, W] (-1 = invalid), as vLLM's mixed-batch path calls the kernel. The first launch, in
`prepare` and so outside any CUDA-graph capture, fills the tile-scheduler metadata that every
later launch reuses.

Outputs: out [T, H, 512] bf16, a view of FlashMLA's padded output; lse [T, H] in natural log,
as FlashMLA's reference defines it (the kernel lays it out [1, heads, T]). FlashMLA gives a row
with no valid entry lse +inf, and vLLM treats that row's output as undefined: such rows (found
in `prepare`) get the reference's zeros and -inf after each launch.

FlashMLA comes from an installed FlashMLA package (`flash_mla`) or from vLLM's build of it
(`vllm._flashmla_C` with `vllm.third_party.flashmla.flash_mla_interface`), whichever imports
first; both expose the interface built around FlashMLASchedMeta.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nopebench import environment
from nopebench import geometry as g
from nopebench.errors import UnsupportedError
from nopebench.impls import memo
from nopebench.impls.interface import (
    DecodeOutput,
    DecodeProblem,
    DecodeRun,
    ImplSpec,
    Tolerance,
    device_refusal,
    gpu_refusal,
)

IMPL = "flashmla"
SMS = (90, 100)
NEED = "an SM90 (Hopper) or SM100 GPU"
HEAD_COUNTS = (64, 128)  # the h_q FlashMLA's sparse fp8 decode kernels are built for
SHIM_DIM = g.qk_dim(g.ROPE_DIM)  # 576: the query width FlashMLA's 656-byte rows need
UNWRITTEN = 0xFF  # the byte of a slot no writer touched (NaN as fp8 and as an fp32 scale)
# FlashMLA's sparse decode asserts `topk % TOPK_BLOCK_SIZE == 0` (seen on the H200 with a top-k
# width of 2051): index rows are padded with -1 to a multiple of this, a multiple of its block.
INDEX_ALIGN = 128

# FlashMLA's accuracy class, and why it differs from the strict one. FlashMLA multiplies each
# fp8 value by its tile's scale rounded to bf16; the reference multiplies by the fp32 scale and
# rounds the product. A bf16 scale is off by up to 2**-9 relative, the same for all 128 values of
# a tile, so FlashMLA attends over a slightly different cache (exactly the same one where scales
# are powers of two). Measured on one H200 (vLLM 0.33.0's build; NoPE problems fed as the shim):
# - the GPU tests' problems (200 active entries): cosine difference 1.0e-5 to 1.06e-5, 1.2% to
#   1.5% of elements outside abs 1e-3 / rel 2/128, natural-log LSE off by 1.2e-3 to 3.8e-3
#   (largest at 64 heads x 200 tokens). The reference run over bf16-rounded scales reproduces
#   these LSE errors to three digits on the CPU, and its outputs the same cosine and fractions
#   (tests/test_flashmla.py holds both sides to that);
# - the full bench-decode grid (2051 active): cosine difference up to 6.3e-6, at most 0.0046% of
#   elements outside, LSE off by up to 1.12e-3.
# The class keeps the element rule and allows 2% of elements outside it, a cosine difference of
# 2e-5 and an LSE error of 5e-3. The strict rule (FlashMLA's own test bound) is recorded beside it
# in every row (`passed_strict`). Reading only 2048 of a row's 2051 valid entries moves the
# cosine by ~1.5e-4, 7x past this class (tests/test_adapter_memo.py).
FLASHMLA_TOLERANCE = Tolerance(
    1e-3,
    2 / 128,
    2e-5,
    "FlashMLA's measured accuracy class (H200)",
    max_mismatch=2e-2,
    name="flashmla",
    lse_abs_tol=5e-3,
)


@dataclass(frozen=True)
class FlashMLA:
    """The two entry points of FlashMLA's interface, and where they came from."""

    source: str  # the package: "flash-mla" or "vllm"
    version: str | None
    get_mla_metadata: Callable
    flash_mla_with_kvcache: Callable


def _check_interface(module, where: str) -> None:
    names = ("FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache")
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise ImportError(
            f"{where} lacks {', '.join(missing)} (an older FlashMLA interface, not supported)"
        )


def _from_flash_mla() -> FlashMLA:
    import flash_mla

    _check_interface(flash_mla, "flash_mla")
    version = (
        environment.package_version("flash_mla")
        or environment.package_version("flash-mla")
        or getattr(flash_mla, "__version__", None)
    )
    return FlashMLA(
        "flash-mla", version, flash_mla.get_mla_metadata, flash_mla.flash_mla_with_kvcache
    )


def _from_vllm() -> FlashMLA:
    import vllm
    import vllm._flashmla_C  # noqa: F401  (the compiled kernels: registers torch.ops._flashmla_C)
    from vllm.third_party.flashmla import flash_mla_interface as interface

    _check_interface(interface, "vllm.third_party.flashmla.flash_mla_interface")
    version = environment.package_version("vllm") or getattr(vllm, "__version__", None)
    return FlashMLA("vllm", version, interface.get_mla_metadata, interface.flash_mla_with_kvcache)


@functools.cache
def _load() -> tuple[FlashMLA | None, str | None]:
    """(FlashMLA, None) from the first source that imports, else (None, the refusal line)."""
    failures = []
    for where, loader in (("flash_mla", _from_flash_mla), ("vllm._flashmla_C", _from_vllm)):
        try:
            return loader(), None
        except Exception as exc:  # noqa: BLE001 - an import can fail in any way (a missing .so)
            first = str(exc).splitlines()[0] if str(exc) else ""
            failures.append(f"{where}: {type(exc).__name__}: {first}")
    return None, (
        f"{IMPL} needs FlashMLA: install flash-mla or vLLM (vllm._flashmla_C); "
        + "; ".join(failures)
    )


def import_error() -> str | None:
    """None when FlashMLA imports here, else the one-line refusal."""
    return _load()[1]


def library() -> FlashMLA:
    lib, reason = _load()
    if lib is None:
        raise UnsupportedError(reason)
    return lib


def flashmla_library() -> tuple[str, str | None]:
    lib, _ = _load()
    return ("flash-mla or vllm", None) if lib is None else (lib.source, lib.version)


def padded_heads(heads: int) -> int:
    """The head count FlashMLA runs for `heads` query heads: 64 up to 64, else 128."""
    for count in HEAD_COUNTS:
        if heads <= count:
            return count
    raise ValueError(f"{IMPL} takes at most {HEAD_COUNTS[-1]} heads, got {heads}")


def padded_query(q: torch.Tensor, padded: int) -> torch.Tensor:
    """q [T, H, 512 or 576] -> [1, T, padded, 576] bf16: q in the first H heads and its width,
    zeros elsewhere (the 64 RoPE lanes of a NoPE query, the padding heads)."""
    tokens, heads, dim = q.shape
    full = torch.zeros(1, tokens, padded, SHIM_DIM, dtype=torch.bfloat16, device=q.device)
    full[0, :, :heads, :dim] = q
    return full


def widen_rows(cache: torch.Tensor) -> torch.Tensor:
    """Compact NoPE rows [blocks, block_size, 528] -> 656-byte rows [blocks, block_size, 656]:
    bytes 0:528 copied, the 128-byte RoPE tail zero (what the cache write stores for a model
    without RoPE), or 0xFF where the row's four scales are 0xFF (a slot never written)."""
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[-1] != g.NOPE_ROW_BYTES:
        raise ValueError(
            f"expected compact rows uint8 [blocks, block_size, 528], got {cache.dtype} "
            f"{tuple(cache.shape)}"
        )
    blocks, block_size, _ = cache.shape
    wide = torch.zeros(blocks, block_size, g.FULL_ROW_BYTES, dtype=torch.uint8, device=cache.device)
    wide[..., : g.NOPE_ROW_BYTES] = cache
    unwritten = (cache[..., g.SCALE_OFFSET : g.ROPE_OFFSET] == UNWRITTEN).all(dim=-1)
    wide[..., g.ROPE_OFFSET :].masked_fill_(unwritten.unsqueeze(-1), UNWRITTEN)
    return wide


def kv_cache(problem: DecodeProblem) -> torch.Tensor:
    """The cache as FlashMLA takes it: [blocks, block_size, 1, 656] float8_e4m3fn, the problem's
    own 656-byte rows or its compact rows widened (once per cache tensor and contents)."""
    rows = problem.cache
    if rows.shape[-1] == g.NOPE_ROW_BYTES:
        rows = memo.memo_by_cache("flashmla-656", rows, 0, lambda: widen_rows(problem.cache))
    return rows.view(torch.float8_e4m3fn).unsqueeze(-2)


def flashmla_unsupported(problem: DecodeProblem) -> str | None:
    reason = gpu_refusal(IMPL, SMS, NEED) or device_refusal(IMPL, problem) or import_error()
    if reason:
        return reason
    if problem.heads > HEAD_COUNTS[-1]:
        return f"{IMPL}: at most {HEAD_COUNTS[-1]} heads, got {problem.heads}"
    return None


def _lse_per_token(lse: torch.Tensor | None, tokens: int, padded: int, heads: int):
    """[T, heads] natural-log view of FlashMLA's lse: laid out [1, padded heads, T] as its
    interface documents, or [1, T, padded heads]; None for anything else."""
    if lse is None:
        return None
    if tuple(lse.shape) == (1, padded, tokens):
        return lse[0, :heads].transpose(0, 1)
    if tuple(lse.shape) == (1, tokens, padded):
        return lse[0, :, :heads]
    return None


def padded_indices(indices: torch.Tensor) -> torch.Tensor:
    """[T, W] -> [T, round_up(W, INDEX_ALIGN)], the new entries -1 (which bound nothing)."""
    width = g.round_up(indices.shape[1], INDEX_ALIGN)
    if width == indices.shape[1]:
        return indices.contiguous()
    padded = torch.full((indices.shape[0], width), -1, dtype=indices.dtype, device=indices.device)
    padded[:, : indices.shape[1]] = indices
    return padded


def flashmla_prepare(problem: DecodeProblem) -> DecodeRun:
    lib = library()
    tokens, heads, _ = problem.q.shape
    padded = padded_heads(heads)
    device = problem.q.device
    k_cache = kv_cache(problem)
    q = padded_query(problem.q, padded)
    indices = padded_indices(problem.indices).unsqueeze(0)  # [1, T, W rounded up]
    out = torch.empty(1, tokens, padded, g.LATENT_DIM, dtype=torch.bfloat16, device=device)
    sched_meta, _ = lib.get_mla_metadata()
    empty = (problem.indices < 0).all(dim=1)
    has_empty = bool(empty.any())  # host sync, here only
    out_rows = out[0, :, :heads]

    def launch() -> torch.Tensor | None:
        _, lse = lib.flash_mla_with_kvcache(
            q=q,
            k_cache=k_cache,
            block_table=None,
            cache_seqlens=None,
            head_dim_v=g.LATENT_DIM,
            tile_scheduler_metadata=sched_meta,
            num_splits=None,
            softmax_scale=problem.softmax_scale,
            causal=False,
            is_fp8_kvcache=True,
            indices=indices,
            out=out,
        )
        return lse

    launch()  # fills the tile-scheduler metadata, outside any graph capture

    def run() -> DecodeOutput:
        lse = _lse_per_token(launch(), tokens, padded, heads)
        if has_empty:
            out_rows.masked_fill_(empty.view(tokens, 1, 1), 0.0)
            if lse is not None:
                lse.masked_fill_(empty.view(tokens, 1), -math.inf)
        return DecodeOutput(out_rows, lse)

    return run


def flashmla_kernel(problem: DecodeProblem) -> str:
    """What FlashMLA runs for the problem: its head count (padded) and query width."""
    heads, padded = problem.heads, padded_heads(problem.heads)
    zeros = f" ({padded - heads} of them zero queries)" if padded > heads else ""
    compact = problem.cache.shape[-1] == g.NOPE_ROW_BYTES
    rows = "528-byte rows widened to 656" if compact else "656-byte rows"
    return f"sparse fp8 decode at {padded} heads{zeros}, 576-wide queries, {rows}"


def flashmla_spec() -> ImplSpec:
    return ImplSpec(
        IMPL,
        "FlashMLA sparse fp8 decode (SM90, SM100): 656-byte rows, 576-wide queries, heads "
        "padded to 64/128; NoPE runs as the zero-padded shim",
        flashmla_unsupported,
        flashmla_prepare,
        FLASHMLA_TOLERANCE,
        serving_backend="vLLM FLASHMLA_SPARSE",
        deployable="yes: the packed 656-byte rows as vLLM writes them; NoPE only as the shim",
        library=flashmla_library,
        kernel=flashmla_kernel,
    )
