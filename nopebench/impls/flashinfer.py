"""Adapters from a DecodeProblem to FlashInfer's sparse MLA kernels (flashinfer-python 0.7.x).

One adapter per kernel family; each `prepare` does the host work (cache conversion, plan(),
workspaces) and returns a closure that only launches, so it can be captured in a CUDA graph.

- flashinfer-sm120 (SM120/121): `trtllm_batch_decode_with_kv_cache_mla(backend="sparse")` on
  the packed fp8_ds_mla cache as is. GLM53_NOPE for 512-wide queries (needs
  kv_scale_format="arbitrary_fp32"), GLM_NSA (arbitrary_fp32) or DSv3.2 (pow2_fp32) for 576.
  block_tables is the -1 padded index buffer [T, 1, W] and sparse_mla_top_k = max_seq_len = W:
  the fixed sizing. No per-row lengths: the kernel bounds each row by its -1 entries.
- flashinfer-trtllm (SM100/103): trtllm-gen over a bf16 copy of the dequantized cache
  (trtllm-gen has no per-128-channel fp8 scales). Rows are compacted to the front and their
  valid counts passed as seq_lens and, for NoPE, as sparse_mla_top_k_lens, which that kernel
  requires. FlashInfer documents zero-length rows as unsupported, so an empty row gets one
  dummy entry (slot 0, length 1) and its output is zeroed after the launch.
  Not run on hardware by this project yet (no SM100 machine).
- flashinfer-fa3-bf16 / flashinfer-fa3-fp8 (SM90): BatchMLAPagedAttentionWrapper(backend="fa3"),
  page_size 1, one request per query token, the CSR of its valid slots (plan() synchronises
  with the host; it runs in prepare). bf16: the cache dequantized once into ckv [N,1,512] and
  kpe [N,1,rope]. fp8: the fp8 latent bytes as float8_e4m3fn ckv [N,1,512] with
  ckv_scale_arr [N,1,4] fp32, one scale per 128 channels per token, indexed by physical slot
  (FlashInfer's repack_fp8_kv_to_bf16 computes bf16(float(fp8) * scale), the same
  dequantization as the reference); kpe is fp8 too with one per-tensor kpe_scale, so the fp8
  path is exact only for NoPE or the zero-padded shim and refuses caches with real RoPE lanes.
  Rows with no valid slot get kv_len 0 and their output is set to zeros (lse -inf) after the
  launch, the reference's definition.
"""

from __future__ import annotations

import functools
import math

import torch

from nopebench import environment, rowformat
from nopebench import geometry as g
from nopebench.impls import memo, metadata
from nopebench.impls.interface import (
    DecodeOutput,
    DecodeProblem,
    DecodeRun,
    ImplSpec,
    Tolerance,
    device_refusal,
    gpu_refusal,
)

SM120_SMS = (120, 121)
SM100_SMS = (100, 103)
SM90_SMS = (90,)
SPARSE_WORKSPACE_BYTES = 512 << 20  # SM120 split-K scratch: T x heads x splits x 512 bf16
TRTLLM_WORKSPACE_BYTES = 128 << 20  # vLLM's size for the same kernels; zeroed (semaphores)
FA3_WORKSPACE_BYTES = 128 << 20  # FlashInfer's documented starting point for the MLA wrapper
# FlashInfer only uses qk_nope_head_dim as a cache key on these paths (SM120 ignores it);
# pass the value of the geometry each query width stands for.
QK_NOPE_HEAD_DIM = {0: 256, g.ROPE_DIM: 128}


@functools.cache
def flashinfer_import_error() -> str | None:
    """None when `flashinfer.mla` imports here, else the one-line reason."""
    try:
        _mla()
    except Exception as exc:
        return f"flashinfer is not importable ({type(exc).__name__}: {exc})"
    return None


def _mla():
    import flashinfer.mla

    return flashinfer.mla


def _common_refusal(
    impl: str, sms: tuple[int, ...], need: str, problem: DecodeProblem
) -> str | None:
    return (
        gpu_refusal(impl, sms, need)
        or device_refusal(impl, problem)
        or (f"{impl}: {flashinfer_import_error()}" if flashinfer_import_error() else None)
    )


# --- SM120/121: backend "sparse" on the packed cache -------------------------------------------


def sm120_unsupported(problem: DecodeProblem) -> str | None:
    impl = "flashinfer-sm120"
    reason = _common_refusal(impl, SM120_SMS, "an SM120/SM121 GPU", problem)
    if reason:
        return reason
    if problem.rope_dim == 0 and problem.kv_scale_format != "arbitrary_fp32":
        return (
            f"{impl}: GLM53_NOPE (512-wide queries) needs kv_scale_format arbitrary_fp32, "
            f"got {problem.kv_scale_format}"
        )
    if problem.rope_dim and problem.cache.shape[-1] != g.FULL_ROW_BYTES:
        return f"{impl}: 576-wide queries need 656-byte rows"
    if problem.heads > 128:
        return f"{impl}: at most 128 heads, got {problem.heads}"
    return None


def sm120_prepare(problem: DecodeProblem) -> DecodeRun:
    mla = _mla()
    tokens, heads, dim = problem.q.shape
    sizing = metadata.sizing_from_buffer(problem.indices)
    query = problem.q.unsqueeze(1)  # [T, 1, H, D]: one request per query token
    block_tables = problem.indices.unsqueeze(1).contiguous()  # [T, 1, W], -1 padded
    workspace = torch.zeros(SPARSE_WORKSPACE_BYTES, dtype=torch.uint8, device=problem.q.device)
    out = torch.empty(tokens, 1, heads, g.LATENT_DIM, dtype=torch.bfloat16, device=problem.q.device)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=problem.q.device)

    def run() -> DecodeOutput:
        mla.trtllm_batch_decode_with_kv_cache_mla(
            query=query,
            kv_cache=problem.cache,
            workspace_buffer=workspace,
            qk_nope_head_dim=QK_NOPE_HEAD_DIM[problem.rope_dim],
            kv_lora_rank=g.LATENT_DIM,
            qk_rope_head_dim=problem.rope_dim,
            block_tables=block_tables,
            seq_lens=None,
            max_seq_len=sizing.max_seq_len,
            sparse_mla_top_k=sizing.sparse_mla_top_k,
            out=out,
            bmm1_scale=problem.softmax_scale,
            bmm2_scale=1.0,
            backend="sparse",
            kv_scale_format=problem.kv_scale_format,
            lse=lse,
            return_lse=True,
            return_lse_base="basee",
        )
        return DecodeOutput(out.view(tokens, heads, g.LATENT_DIM), lse)

    return run


# --- SM100/103: trtllm-gen over a bf16 cache ----------------------------------------------------


def trtllm_unsupported(problem: DecodeProblem) -> str | None:
    impl = "flashinfer-trtllm"
    reason = _common_refusal(impl, SM100_SMS, "an SM100/SM103 GPU", problem)
    if reason:
        return reason
    if problem.cache.shape[1] not in (32, 64):
        return f"{impl}: trtllm-gen needs block size 32 or 64, got {problem.cache.shape[1]}"
    if 64 < problem.heads < 128 or problem.heads > 128:
        return f"{impl}: trtllm-gen MLA takes up to 64 or exactly 128 heads, got {problem.heads}"
    return None


def _memo_by_cache(kind: str, problem: DecodeProblem, build):
    """Convert a cache once per cache tensor (memo.memo_by_cache)."""
    return memo.memo_by_cache(kind, problem.cache, problem.rope_dim, build)


def _dequantized_cache(problem: DecodeProblem) -> tuple[torch.Tensor, torch.Tensor]:
    """(latent [N, 512] bf16, rope [N, rope_dim] bf16) of every cache row, once per cache."""
    return _memo_by_cache("bf16", problem, lambda: _dequantize_all(problem))


def _dequantize_all(problem: DecodeProblem) -> tuple[torch.Tensor, torch.Tensor]:
    rows = problem.cache.view(-1, problem.cache.shape[-1])
    latent, rope = rowformat.dequantize_rows(rows)
    if problem.rope_dim:
        return latent, rope
    return latent, latent.new_empty(latent.shape[0], 0)


def trtllm_prepare(problem: DecodeProblem) -> DecodeRun:
    mla = _mla()
    tokens, heads, dim = problem.q.shape
    blocks, block_size, _ = problem.cache.shape
    kv_cache = _memo_by_cache(
        "trtllm",
        problem,
        lambda: (
            torch.cat(_dequantized_cache(problem), dim=-1)
            .view(blocks, block_size, dim)
            .contiguous()
        ),
    )
    sizing = metadata.sizing_from_buffer(problem.indices)
    counts = metadata.valid_counts(problem.indices)
    empty = counts == 0
    compact = metadata.compact_to_front(problem.indices)
    compact[:, 0] = torch.where(empty, 0, compact[:, 0])  # dummy slot for an empty row
    lens = counts.clamp_min(1).to(torch.int32)
    block_tables = compact.unsqueeze(1).contiguous()
    workspace = torch.zeros(TRTLLM_WORKSPACE_BYTES, dtype=torch.uint8, device=problem.q.device)
    out = torch.empty(tokens, 1, heads, g.LATENT_DIM, dtype=torch.bfloat16, device=problem.q.device)
    nope_lens = lens if problem.rope_dim == 0 else None
    empty_out = empty.view(tokens, 1, 1, 1)

    def run() -> DecodeOutput:
        mla.trtllm_batch_decode_with_kv_cache_mla(
            query=problem.q.unsqueeze(1),
            kv_cache=kv_cache,
            workspace_buffer=workspace,
            qk_nope_head_dim=QK_NOPE_HEAD_DIM[problem.rope_dim],
            kv_lora_rank=g.LATENT_DIM,
            qk_rope_head_dim=problem.rope_dim,
            block_tables=block_tables,
            seq_lens=lens,
            max_seq_len=sizing.max_seq_len,
            sparse_mla_top_k=sizing.sparse_mla_top_k,
            out=out,
            bmm1_scale=problem.softmax_scale,
            bmm2_scale=1.0,
            backend="trtllm-gen",
            sparse_mla_top_k_lens=nope_lens,
        )
        out.masked_fill_(empty_out, 0.0)
        return DecodeOutput(out.view(tokens, heads, g.LATENT_DIM), None)

    return run


# --- SM90: fa3 over the CSR of valid slots -----------------------------------------------------


def _fa3_unsupported(problem: DecodeProblem, impl: str, fp8: bool) -> str | None:
    reason = _common_refusal(impl, SM90_SMS, "an SM90 (Hopper) GPU", problem)
    if reason:
        return reason
    if fp8 and problem.rope_dim:
        rows = problem.cache.view(-1, problem.cache.shape[-1])
        named = problem.indices[problem.indices >= 0].long()  # only rows the step reads matter
        if bool(rows[named, g.ROPE_OFFSET :].any()):
            return (
                f"{impl} holds RoPE lanes in fp8 with one per-tensor scale: exact only for NoPE "
                "or the zero-padded shim, and this cache has non-zero RoPE lanes"
            )
    return None


def fa3_bf16_unsupported(problem: DecodeProblem) -> str | None:
    return _fa3_unsupported(problem, "flashinfer-fa3-bf16", fp8=False)


def fa3_fp8_unsupported(problem: DecodeProblem) -> str | None:
    return _fa3_unsupported(problem, "flashinfer-fa3-fp8", fp8=True)


def _fa3_cache(problem: DecodeProblem, fp8: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(ckv [N,1,512], kpe [N,1,rope_dim], run() scale kwargs) with page_size 1, page = slot;
    built once per cache."""
    return _memo_by_cache(
        "fa3-fp8" if fp8 else "fa3-bf16", problem, lambda: _fa3_cache_build(problem, fp8)
    )


def _fa3_cache_build(problem: DecodeProblem, fp8: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    rows = problem.cache.view(-1, problem.cache.shape[-1])
    n = rows.shape[0]
    if not fp8:
        latent, rope = _dequantized_cache(problem)
        return latent.view(n, 1, g.LATENT_DIM), rope.contiguous().view(n, 1, problem.rope_dim), {}
    latent, scales, _ = rowformat.split_rows(rows)
    ckv = latent.contiguous().view(n, 1, g.LATENT_DIM)
    kpe = torch.zeros(n, 1, problem.rope_dim, dtype=torch.float8_e4m3fn, device=rows.device)
    scale_kwargs = {"ckv_scale_arr": scales.contiguous().view(n, 1, g.N_TILES), "kpe_scale": 1.0}
    return ckv, kpe, scale_kwargs


def _fa3_prepare(problem: DecodeProblem, fp8: bool) -> DecodeRun:
    mla = _mla()
    tokens, heads, _ = problem.q.shape
    device = problem.q.device
    ckv, kpe, scale_kwargs = _fa3_cache(problem, fp8)
    csr = metadata.csr_of_valid(problem.indices)
    workspace = torch.empty(FA3_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    wrapper = mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa3")
    wrapper.plan(
        metadata=mla.MLAPlanMetadata.csr(csr.qo_indptr, csr.kv_indptr, csr.kv_indices, csr.kv_len),
        num_heads=heads,
        head_dim_ckv=g.LATENT_DIM,
        head_dim_kpe=problem.rope_dim,
        page_size=1,
        causal=False,
        sm_scale=problem.softmax_scale,
        q_data_type=torch.bfloat16,
        kv_data_type=ckv.dtype,
        query_layout="split",
        kv_cache_layout="split",
        lse_mode="basee",
    )
    query = (problem.q[..., : g.LATENT_DIM], problem.q[..., g.LATENT_DIM :])
    out = torch.empty(tokens, heads, g.LATENT_DIM, dtype=torch.bfloat16, device=device)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=device)
    empty = (csr.kv_len == 0).view(tokens, 1)
    has_empty = bool(empty.any())

    def run() -> DecodeOutput:
        wrapper.run(
            query=query,
            kv_cache=(ckv, kpe),
            out=out,
            lse=lse,
            return_lse=True,
            return_lse_base_on_e=True,
            **scale_kwargs,
        )
        if has_empty:
            out.masked_fill_(empty.unsqueeze(-1), 0.0)
            lse.masked_fill_(empty, -math.inf)
        return DecodeOutput(out, lse)

    return run


def fa3_bf16_prepare(problem: DecodeProblem) -> DecodeRun:
    return _fa3_prepare(problem, fp8=False)


def fa3_fp8_prepare(problem: DecodeProblem) -> DecodeRun:
    return _fa3_prepare(problem, fp8=True)


# FlashInfer's fa3 MLA, measured on the H200 (results/reference/h200-run/:
# gpu_tests_d633e62_fa3_outlier.log, sparse_gpu_tests_before_tolerance_class.log): cosine
# difference 4.4e-6 to 5.3e-6 from the reference, about 1 element in 30,000 beyond 2 bf16 ulps,
# and on the 16-token adapter test 1 element in 131,072 (0.0008%) beyond 4, on FlashMLA's test
# distribution, where the native kernel stays under 2e-6 with none. check-pagetable and
# bench-decode hold it to this class: 4 ulps, at most 0.01% of elements outside, cosine 2e-5.
# Dropping the 3 kpool entries of a 2051-entry row (the bug they exist for) moves the cosine by
# ~1.5e-4 and 12% of elements past 4 ulps, far outside it (tests/test_adapter_memo.py).
FA3_TOLERANCE = Tolerance(
    1e-3,
    4 / 128,
    2e-5,
    "FlashInfer fa3's measured accuracy class (H200)",
    max_mismatch=1e-4,
    name="flashinfer-fa3",
)


def flashinfer_library() -> tuple[str, str | None]:
    return "flashinfer-python", environment.package_version("flashinfer-python")


def flashinfer_specs() -> list[ImplSpec]:
    """The FlashInfer registry entries, in display order."""
    return [
        ImplSpec(
            "flashinfer-sm120",
            "FlashInfer sparse MLA, SM120/121 (GLM53_NOPE / GLM_NSA), packed fp8 cache",
            sm120_unsupported,
            sm120_prepare,
            serving_backend="vLLM FLASHINFER_MLA_SPARSE_SM120",
            deployable="yes: the packed fp8 cache as vLLM writes it",
            library=flashinfer_library,
        ),
        ImplSpec(
            "flashinfer-trtllm",
            "FlashInfer trtllm-gen sparse MLA, SM100/103, bf16 cache (native NoPE with top-k lens)",
            trtllm_unsupported,
            trtllm_prepare,
            deployable="no: a bound; reads a bf16 copy of the cache, twice its size",
            library=flashinfer_library,
        ),
        ImplSpec(
            "flashinfer-fa3-bf16",
            "FlashInfer fa3 MLA, SM90, CSR of valid slots, bf16 dequantized cache",
            fa3_bf16_unsupported,
            fa3_bf16_prepare,
            FA3_TOLERANCE,
            deployable="no: a bound; needs a second, bf16 cache twice the fp8 cache's size",
            library=flashinfer_library,
        ),
        ImplSpec(
            "flashinfer-fa3-fp8",
            "FlashInfer fa3 MLA, SM90, CSR of valid slots, fp8 cache with per-tile scales",
            fa3_fp8_unsupported,
            fa3_fp8_prepare,
            FA3_TOLERANCE,
            serving_backend="vLLM FLASHINFER_MLA_SPARSE_SM90 (its kernel)",
            deployable="yes: what vLLM runs for NoPE on Hopper; vLLM feeds it a 512-byte fp8 "
            "row with one per-tensor scale, this harness the packed rows' per-tile scales",
            library=flashinfer_library,
        ),
    ]
