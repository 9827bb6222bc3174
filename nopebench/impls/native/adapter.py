"""The `native` registry entry: choose a kernel and launch plan, allocate, launch.

Five kernels with one contract (`sparse_decode_reference`'s): on SM90 the CUDA C++ register
kernel (`register_library`: 16 heads a CTA, mma.sync, the dequantized rows in registers) where
its CTAs fill their waves, and the Gluon ones (wgmma, cp.async) `hopper_ws_decode`
(warp-specialised, up to 32 heads per program), `hopper_wide_decode` (warp-specialised, 64 heads
per program, the output split across two warpgroups) and `hopper_decode` (every other shape);
elsewhere `triton_decode` (portable Triton: any SM80+ GPU, and Triton's CPU interpreter). Every
kernel reads both 512-wide NoPE and 576-wide RoPE (or zero-padded shim) queries, and on SM90 the
kernel is chosen by the shape alone, so NoPE and the shim run in the same kernel at each shape.
Launch shapes come from the pure planners in `plans`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from nopebench import environment
from nopebench import geometry as g
from nopebench.impls.interface import DecodeOutput, DecodeProblem, DecodeRun, ImplSpec
from nopebench.impls.native.constants import WIDE_BLOCK_H, WS_MAX_BLOCK_H
from nopebench.impls.native.plans import (
    LaunchPlan,
    next_pow2,
    plan_hopper,
    plan_hopper_wide,
    plan_hopper_ws,
    plan_launch,
    plan_register,
    register_fills,
    score_warps_m,
)
from nopebench.impls.reference import check_decode_args


def hopper_available(device) -> bool:
    """The Gluon kernel runs on SM90 only (wgmma), and needs a Triton with Gluon."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        return False
    try:
        from nopebench.impls.native import hopper_decode  # noqa: F401
    except ImportError:
        return False
    return True


def use_hopper_ws(tokens: int, heads: int) -> bool:
    """Where the H200 measured the warp-specialised kernel faster than the single-role one on
    NoPE rows: at most 16 heads, or at most 32 heads and 8 query tokens or more
    (results/reference/decode-tuning/hopper-ws/ and few-tokens/)."""
    return heads <= 16 or (heads <= WS_MAX_BLOCK_H and tokens >= 8)


def use_hopper_wide(single_role_nope: LaunchPlan) -> bool:
    """Where the single-role planner takes 64 heads per program for NoPE rows: there the 64-head
    kernel is faster than the single-role one on the H200. Where the planner takes fewer heads
    to fill the SMs (1 token) the single-role kernel stays faster
    (results/reference/decode-tuning/hopper-wide/)."""
    return single_role_nope.block_h == WIDE_BLOCK_H


def register_available(device) -> bool:
    """Whether the register kernel builds and loads here (it needs nvcc); where it does not,
    says why once and the Gluon kernels take its shapes."""
    from nopebench.impls.native.register_library import register_missing

    index = torch.device(device).index
    why = register_missing(torch.cuda.current_device() if index is None else index)
    if why is not None and why not in _REGISTER_WARNED:
        from nopebench.console import err_console

        _REGISTER_WARNED.add(why)
        err_console.print(f"native: {why}; the Gluon kernels run its shapes", highlight=False)
    return why is None


_REGISTER_WARNED: set[str] = set()


def choose_plan(tokens: int, heads: int, width: int, rope_dim: int, device) -> LaunchPlan:
    """The kernel by the shape alone (the rules measured on NoPE rows), then its plan for the rows
    at hand: with RoPE lanes the planners fit them into shared memory (fewer ring slots, and
    32-row blocks in the 64-head kernel), so that NoPE and the shim differ in the row, not in the
    kernel. On SM90 the register kernel takes 16 heads where its CTAs fill their waves
    (`register_fills`), the Gluon kernels every other shape."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rope = bool(rope_dim)
    if hopper_available(device):
        if register_fills(tokens, heads, width, sms) and register_available(device):
            return plan_register(heads, width, rope=rope)
        if use_hopper_ws(tokens, heads):
            return plan_hopper_ws(tokens, heads, width, sms, rope=rope)
        if use_hopper_wide(plan_hopper(tokens, heads, width, False, sms)):
            return plan_hopper_wide(tokens, heads, width, sms, rope=rope)
        return plan_hopper(tokens, heads, width, rope, sms)
    return plan_launch(tokens, heads, width, sms)


def default_plan(tokens: int, heads: int, width: int, rope_dim: int, device) -> LaunchPlan:
    """The plan `native_decode` takes when given none: `choose_plan` on a GPU, the portable
    kernel's elsewhere (Triton's CPU interpreter)."""
    if torch.device(device).type == "cuda":
        return choose_plan(tokens, heads, width, rope_dim, device)
    return plan_launch(tokens, heads, width)


_PAIR_OFFSETS: dict[tuple[LaunchPlan, int], dict] = {}
_IN_PAIRS: set[str] = set()


def _launch_pairs(kernel, grid: tuple[int, ...], args: tuple, plan: LaunchPlan, row_bytes: int):
    """Launch a `plan.pair` 64-head kernel in 2-CTA clusters. Its partner addresses come from a
    build with placeholder offsets (the same allocations); each compiled specialisation is
    checked to have them, then set to launch in clusters of two (`cluster`)."""
    from nopebench.impls.native import cluster
    from nopebench.impls.native import hopper_wide_decode as wide

    offsets = _PAIR_OFFSETS.get((plan, row_bytes))
    if offsets is None:
        constants, options = wide.launch_constants(plan, row_bytes)
        placeholder = kernel.warmup(*args, grid=grid, **constants, **options)
        offsets = wide.pair_offsets(cluster.smem_offsets(placeholder, wide.PAIR_ALLOCATIONS))
        _PAIR_OFFSETS[(plan, row_bytes)] = offsets
    constants, options = wide.launch_constants(plan, row_bytes, offsets)
    compiled = kernel.warmup(*args, grid=grid, **constants, **options)
    if compiled.hash not in _IN_PAIRS:
        found = wide.pair_offsets(cluster.smem_offsets(compiled, wide.PAIR_ALLOCATIONS))
        if found != offsets:
            raise RuntimeError(f"the 2-CTA kernel's shared memory moved: {found} != {offsets}")
        cluster.launch_in_pairs(compiled)
        _IN_PAIRS.add(compiled.hash)
    kernel[(grid[0] // 2,)](*args, **constants, **options)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class DecodeBuffers:
    """Output and split-K scratch of one decode shape, allocated once so repeated launches (and
    CUDA-graph replays) write to the same addresses."""

    out: torch.Tensor
    lse: torch.Tensor
    part: torch.Tensor
    part_lse: torch.Tensor

    @classmethod
    def allocate(cls, tokens: int, heads: int, plan: LaunchPlan, device) -> DecodeBuffers:
        out = torch.empty(tokens, heads, g.LATENT_DIM, dtype=torch.bfloat16, device=device)
        lse = torch.empty(tokens, heads, dtype=torch.float32, device=device)
        if plan.splits == 1:
            return cls(out, lse, out, lse)
        part = torch.empty(
            plan.splits, tokens, heads, g.LATENT_DIM, dtype=torch.float32, device=device
        )
        part_lse = torch.empty(plan.splits, tokens, heads, dtype=torch.float32, device=device)
        return cls(out, lse, part, part_lse)


def native_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    rope_dim: int,
    plan: LaunchPlan | None = None,
    buffers: DecodeBuffers | None = None,
) -> DecodeOutput:
    """Sparse decode over packed rows. Same contract as `sparse_decode_reference`."""
    from nopebench.impls.native import triton_decode as k

    check_decode_args(q, cache, indices, rope_dim)
    if q.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("q and indices must be contiguous in their last dimension")
    tokens, heads, _ = q.shape
    width = indices.shape[1]
    if plan is None:
        plan = default_plan(tokens, heads, width, rope_dim, q.device)
    if buffers is None:
        buffers = DecodeBuffers.allocate(tokens, heads, plan, q.device)
    out, lse, part, part_lse = buffers.out, buffers.lse, buffers.part, buffers.part_lse
    if tokens == 0:
        return DecodeOutput(out, lse)
    stride_os = part.stride(0) if plan.splits > 1 else 0
    stride_ls = part_lse.stride(0) if plan.splits > 1 else 0
    grid = plan.grid(tokens)
    args = (
        q,
        cache,
        indices,
        part,
        part_lse,
        heads,
        width,
        plan.entries_per_split,
        softmax_scale * k.LOG2E,
        q.stride(0),
        q.stride(1),
        indices.stride(0),
        part.stride(-3),
        part.stride(-2),
        stride_os,
        part_lse.stride(-2),
        stride_ls,
    )
    if plan.kernel == "register":
        from nopebench.impls.native import register_library

        target = (out, lse) if plan.splits == 1 else (part, part_lse)
        register_library.launch(q, cache, indices, softmax_scale, rope_dim, plan, target)
    elif plan.kernel == "hopper":
        from nopebench.impls.native import hopper_decode

        hopper_decode.hopper_decode_kernel[grid](
            *args,
            BLOCK_H=plan.block_h,
            BLOCK_N=plan.block_n,
            ROW_BYTES=cache.shape[-1],
            ROPE=bool(rope_dim),
            HEAD_BLOCKS=plan.head_blocks,
            NUM_STAGES=plan.num_stages,
            S_WARPS_M=score_warps_m(plan.block_n),
            num_warps=plan.num_warps,
        )
    elif plan.kernel in ("hopper_ws", "hopper_wide"):
        from nopebench.impls.native import hopper_wide_decode as wide
        from nopebench.impls.native import hopper_ws_decode as ws

        if plan.rope != bool(rope_dim):  # the plan's shared memory is for one QK width
            planned = "RoPE lanes" if plan.rope else "NoPE rows"
            raise ValueError(f"this {plan.kernel} plan is for {planned}; rope_dim is {rope_dim}")
        module, kernel = (
            (ws, ws.hopper_ws_decode_kernel)
            if plan.kernel == "hopper_ws"
            else (wide, wide.hopper_wide_decode_kernel)
        )
        if plan.pair:
            _launch_pairs(kernel, grid, (*args, tokens), plan, cache.shape[-1])
        else:
            constants, options = module.launch_constants(plan, cache.shape[-1])
            kernel[grid](*args, tokens, **constants, **options)
    else:
        k.sparse_decode_kernel[grid](
            *args,
            BLOCK_H=plan.block_h,
            BLOCK_N=plan.block_n,
            ROW_BYTES=cache.shape[-1],
            ROPE=bool(rope_dim),
            HEAD_BLOCKS=plan.head_blocks,
            PREFETCH=plan.prefetch,
            NUM_STAGES=plan.num_stages,
            F32_DOT=_interpreting(),
            FACTORED=plan.factored,
            num_warps=plan.num_warps,
        )
    if plan.splits > 1:
        k.combine_kernel[(tokens * heads,)](
            part,
            part_lse,
            out,
            lse,
            heads,
            plan.splits,
            part.stride(0),
            part.stride(1),
            part.stride(2),
            part_lse.stride(0),
            part_lse.stride(1),
            out.stride(0),
            out.stride(1),
            BLOCK_S=next_pow2(plan.splits),
            num_warps=4,
        )
    return DecodeOutput(out, lse)


def _unsupported(problem: DecodeProblem) -> str | None:
    if not problem.q.is_cuda:
        return "native needs a CUDA GPU (Triton kernel); none is visible"
    major, minor = torch.cuda.get_device_capability(problem.q.device)
    if major < 8:
        return f"native needs SM80 or newer; this GPU is SM{major}{minor}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "native needs the triton package"
    return None


def _plan(problem: DecodeProblem) -> LaunchPlan:
    return default_plan(
        problem.tokens, problem.heads, problem.width, problem.rope_dim, problem.q.device
    )


def _prepare(problem: DecodeProblem) -> DecodeRun:
    plan = _plan(problem)
    buffers = DecodeBuffers.allocate(problem.tokens, problem.heads, plan, problem.q.device)

    def run() -> DecodeOutput:
        return native_decode(
            problem.q,
            problem.cache,
            problem.indices,
            problem.softmax_scale,
            problem.rope_dim,
            plan,
            buffers,
        )

    return run


def native_spec() -> ImplSpec:
    return ImplSpec(
        name="native",
        description="nopebench kernels (CUDA C++ mma.sync and Gluon/wgmma on SM90, portable "
        "Triton elsewhere): packed fp8 rows read in place, dequantized on chip",
        unsupported=_unsupported,
        prepare=_prepare,
        deployable="no: this project's kernels; no serving engine runs them",
        kernel=lambda problem: _plan(problem).describe(),
        library=triton_library,
    )


def triton_library() -> tuple[str, str | None]:
    return "triton", environment.package_version("triton")
