"""The `native` decode implementation: the harness's own kernels over the packed cache.

Four kernels with one contract: on SM90 (Gluon, wgmma and cp.async) `hopper_ws_decode`
(warp-specialised, NoPE, up to 32 heads per program; at 16 its consumer is split into scorer
and accumulator on a persistent grid), `hopper_wide_decode` (warp-specialised, NoPE, 64 heads
per program, the output split across two warpgroups) and `hopper_decode` (every other shape);
elsewhere `triton_decode` (portable Triton, any SM80+ GPU and Triton's CPU interpreter).
`plan_hopper_ws`, `plan_hopper_wide`, `plan_hopper` and `plan_launch` are their pure launch
heuristics (tested on CPU); `choose_plan` picks by GPU and shape;
`native_decode` checks arguments, allocates the outputs and launches; `native_spec` is the
registry entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from nopebench import geometry as g
from nopebench.impls.interface import DecodeOutput, DecodeProblem, DecodeRun, ImplSpec
from nopebench.impls.reference import check_decode_args

DEFAULT_SMS = 132  # H200/H100 SXM; the real count is read from the device when there is one


@dataclass(frozen=True)
class LaunchPlan:
    """How one decode call is cut into programs."""

    block_h: int
    head_blocks: int
    block_n: int
    splits: int
    entries_per_split: int
    num_warps: int
    num_stages: int = 1
    prefetch: bool = True
    factored: bool = False
    kernel: str = "triton"  # "triton": portable SM80+; "hopper", "hopper_ws", "hopper_wide": SM90 Gluon
    role_split: bool = False  # hopper_ws: separate scorer and accumulator warpgroups, persistent grid
    max_programs: int = 0  # hopper_ws: programs of its persistent grid (one per SM); 0: one per work item

    @property
    def programs(self) -> int:
        return self.head_blocks * self.splits

    def grid(self, tokens: int) -> tuple[int, ...]:
        if self.kernel not in ("hopper_ws", "hopper_wide"):
            return (tokens * self.head_blocks, self.splits)
        items = tokens * self.programs  # these walk (token, head block, split) items on one axis
        return (min(items, self.max_programs) if self.max_programs else items,)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def plan_launch(tokens: int, heads: int, width: int, sms: int = DEFAULT_SMS,
                block_n: int | None = None, num_warps: int | None = None, splits: int | None = None,
                max_block_h: int = 64) -> LaunchPlan:
    """The launch shape, from the H200 sweep in results/reference/decode-tuning/.

    Heads per program go up to 64 (the fp32 accumulator must fit in registers); more heads
    take more head blocks. With 16-32 heads the kernel is bound by how many row gathers are in
    flight, so the top-k range is split until there are ~6 programs per SM; with 64 heads it
    is bound by registers, and splitting pays only when tokens alone cannot fill the SMs.
    """
    block_h = min(max_block_h, max(16, _next_pow2(heads)))
    head_blocks = -(-heads // block_h)
    rows = tokens * head_blocks
    few = rows < sms
    prefetch, stages = True, 1
    if block_h >= 64:
        block_n = block_n or 32
        warps = num_warps or (8 if few or head_blocks > 1 else 4)
        if not few and head_blocks == 1 and num_warps is None:
            prefetch, stages = False, 2  # 4 warps, Triton's cp.async pipeline: best at T >= 128
        target = 2 * sms if few else rows
    else:
        block_n = block_n or (64 if few else 32)
        warps = num_warps or (8 if few else 4)
        target = 6 * sms
    blocks = -(-width // block_n)
    if splits is None:
        splits = max(1, min(blocks, -(-target // max(1, rows))))
    per_split = -(-blocks // splits) * block_n
    splits = -(-width // per_split)  # no empty splits
    return LaunchPlan(block_h, head_blocks, block_n, splits, per_split, warps, stages, prefetch)


HOPPER_SMEM = 232448  # opt-in shared memory per block on H100/H200 (227 KB)


def hopper_smem_bytes(block_h: int, stages: int, rope: bool, block_n: int = 64) -> int:
    """Shared memory of the Hopper kernel: the gather ring (fp8 tiles, scales, index, RoPE lanes),
    the dequantized tile, q, P, and compiler scratch (Triton 3.6 takes 512 bytes more than 3.9)."""
    ring = stages * block_n * (512 + 16 + 4 + (128 if rope else 0))
    fixed = block_n * 512 * 2 + 4 * block_h * 128 * 2 + block_n * block_h * 2 + (block_h * 128 if rope else 0)
    return ring + fixed + 1024


WS_RING_ROWS = 32  # rows per gather-ring slot of the warp-specialised kernel (4 per producer warp)
WS_MAX_BLOCK_H = 32  # one consumer warpgroup holds O^T (512 x heads, fp32) in registers
# Ring slots with separate scorer and accumulator: the H200 timed 2 fastest at 16 heads and 512
# tokens (0.279 ms, against 0.288 with 3 and 0.294 with 4); one consumer takes all that fit.
WS_SPLIT_SLOTS = 2


def ws_smem_bytes(block_h: int, slots: int, block_n: int = 64, role_split: bool = False) -> int:
    """Shared memory of the warp-specialised kernel: the gather ring (fp8 tiles, scales, index
    entries), two dequantized tiles, q, two P tiles, with the role split the rescale factors and
    final softmax state handed over, and mbarriers and compiler scratch."""
    ring = slots * WS_RING_ROWS * (512 + 16 + 4)
    handover = 6 * block_h * 4 if role_split else 0
    return ring + 2 * block_n * 512 * 2 + 4 * block_h * 128 * 2 + 2 * block_n * block_h * 2 + handover + 1536


def score_warps_m(block_n: int) -> int:
    """Warps along the keys in the Hopper kernel's score product: 8 (the two warpgroups split a
    128-row block by key) or 4 (they split a 64-row block by head)."""
    return 8 if block_n == 128 else 4


def plan_hopper(tokens: int, heads: int, width: int, rope: bool, sms: int = DEFAULT_SMS,
                stages: int | None = None, splits: int | None = None, block_n: int | None = None,
                block_h: int | None = None) -> LaunchPlan:
    """Launch shape for the SM90 kernel, from the H200 sweeps in results/reference/decode-tuning/hopper/.

    One program per SM, so as many heads per program as shared memory allows (every head block
    re-gathers the rows), as long as the (token, head block) programs, cut into splits of one
    block at least, can still fill the SMs: 64 heads at 8 tokens (0.036 ms against 0.049 with
    16), 32 of 128 heads at 1 token (0.015 against 0.021). The top-k range is split only while
    those programs fill fewer than half the SMs (`_split_one_per_sm`). At 16 heads with many
    programs, 128-row blocks whose scores split by key across the two warpgroups (no operand
    read twice) with a one-slot ring.
    """
    if block_n is None:
        few = tokens * -(-heads // 16) < sms
        wide = heads <= 16 and not few and stages in (None, 1) and hopper_smem_bytes(16, 1, rope, 128) <= HOPPER_SMEM
        block_n = 128 if wide else 64
    stages = stages or (1 if block_n == 128 else 2)
    cands = (block_h,) if block_h else tuple(bh for bh in (64, 32, 16) if bh <= max(16, _next_pow2(heads)))
    fits = [bh for bh in cands if hopper_smem_bytes(bh, stages, rope, block_n) <= HOPPER_SMEM]
    if not fits:
        raise ValueError(f"{stages} gather stages of {block_n} rows need more shared memory than SM90 has")
    blocks = -(-width // block_n)
    filling = [bh for bh in fits if tokens * -(-heads // bh) * blocks >= sms]
    block_h = (filling or fits[-1:])[0]
    head_blocks, splits, per_split = _split_one_per_sm(tokens, heads, width, block_h, block_n, sms, splits,
                                                      fill=-(-sms // 2))
    return LaunchPlan(block_h, head_blocks, block_n, splits, per_split, num_warps=8, num_stages=stages,
                      prefetch=False, kernel="hopper")


def _split_one_per_sm(tokens: int, heads: int, width: int, block_h: int, block_n: int, sms: int,
                      splits: int | None, fill: int | None = None) -> tuple[int, int, int]:
    """Head blocks, splits and entries per split for kernels that run one program per SM: the
    top-k range is split only when there are fewer (token, head block) programs than `fill`
    (default: the SMs), then into enough splits to fill the SMs. (The single-role kernel is
    faster unsplit from half the SMs on: 0.157 ms against 0.172 with 2 splits at 128 programs.)"""
    head_blocks = -(-heads // block_h)
    rows = tokens * head_blocks
    blocks = -(-width // block_n)
    if splits is None:
        splits = 1 if rows >= (fill or sms) else min(blocks, -(-sms // rows))
    per_split = -(-blocks // splits) * block_n
    return head_blocks, -(-width // per_split), per_split


def plan_hopper_ws(tokens: int, heads: int, width: int, sms: int = DEFAULT_SMS, slots: int | None = None,
                   splits: int | None = None, block_h: int | None = None,
                   role_split: bool | None = None) -> LaunchPlan:
    """Launch shape for the warp-specialised SM90 kernel (NoPE rows, at most 32 heads per
    program): 64-row blocks, two dequantized tiles. With 16 heads per program the scorer and the
    accumulator are separate warpgroups (faster on the H200; at 32 heads one consumer was
    faster), with WS_SPLIT_SLOTS ring slots and one persistent program per SM; one consumer takes
    as many 32-row slots as shared memory holds and one program per work item (the H200 sweeps:
    results/reference/decode-tuning/)."""
    block_n = 64
    if block_h is None:
        few = tokens * -(-heads // 16) < sms
        block_h = 16 if few else min(WS_MAX_BLOCK_H, max(16, _next_pow2(heads)))
    if block_h > WS_MAX_BLOCK_H:
        raise ValueError(f"the warp-specialised kernel takes at most {WS_MAX_BLOCK_H} heads per program")
    if role_split is None:
        role_split = block_h == 16
    if role_split and block_h != 16:
        raise ValueError("the warp-specialised kernel splits its consumer at 16 heads per program only")
    if slots is None:
        slots = WS_SPLIT_SLOTS if role_split else 1
        while not role_split and ws_smem_bytes(block_h, slots + 1, block_n) <= HOPPER_SMEM:
            slots += 1
    if ws_smem_bytes(block_h, slots, block_n, role_split) > HOPPER_SMEM:
        raise ValueError(f"{slots} ring slots at {block_h} heads need more shared memory than SM90 has")
    head_blocks, splits, per_split = _split_one_per_sm(tokens, heads, width, block_h, block_n, sms, splits)
    return LaunchPlan(block_h, head_blocks, block_n, splits, per_split, num_warps=4, num_stages=slots,
                      prefetch=False, kernel="hopper_ws", role_split=role_split,
                      max_programs=sms if role_split else 0)


WIDE_BLOCK_H = 64  # hopper_wide: one wgmma M of heads, the output split across two warpgroups
WIDE_BLOCK_N = 64  # its rows per block (32-row blocks with three tiles measured slower)
WIDE_KV_BUFS = 2  # dequantized tiles: the producer fills one while the consumers read the other
WIDE_P_BUFS = 1  # P tiles handed from the scorer to the right warpgroup
WIDE_RING_ROWS = 16  # its producer's ring slot: 4 rows per warp, one warpgroup


def wide_smem_bytes(slots: int) -> int:
    """Shared memory of the 64-head kernel: the producer's ring (fp8 tiles, scales, index
    entries), the dequantized tiles, q, the P tiles and their rescale factors, 1/l, mbarriers
    and compiler scratch."""
    ring = slots * WIDE_RING_ROWS * (512 + 16 + 4)
    tiles = (WIDE_KV_BUFS * WIDE_BLOCK_N + WIDE_BLOCK_H) * 512 * 2 + WIDE_P_BUFS * WIDE_BLOCK_H * WIDE_BLOCK_N * 2
    return ring + tiles + (WIDE_P_BUFS + 1) * WIDE_BLOCK_H * 4 + 1024


def plan_hopper_wide(tokens: int, heads: int, width: int, sms: int = DEFAULT_SMS, slots: int | None = None,
                     splits: int | None = None) -> LaunchPlan:
    """Launch shape for the 64-head SM90 kernel (NoPE rows): as many producer ring slots as shared
    memory holds (three), one program per (token, head block, split), split as
    `_split_one_per_sm` does."""
    block_n = WIDE_BLOCK_N
    if slots is None:
        slots = 1
        while wide_smem_bytes(slots + 1) <= HOPPER_SMEM:
            slots += 1
    if wide_smem_bytes(slots) > HOPPER_SMEM:
        raise ValueError(f"{slots} ring slots need more shared memory than SM90 has")
    head_blocks, splits, per_split = _split_one_per_sm(tokens, heads, width, WIDE_BLOCK_H, block_n, sms, splits,
                                                      fill=-(-sms // 2))
    return LaunchPlan(WIDE_BLOCK_H, head_blocks, block_n, splits, per_split, num_warps=4, num_stages=slots,
                      prefetch=False, kernel="hopper_wide")


def hopper_available(device) -> bool:
    """The Gluon kernel runs on SM90 only (wgmma), and needs a Triton with Gluon."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        return False
    try:
        from nopebench.impls.native import hopper_decode  # noqa: F401
    except ImportError:
        return False
    return True


def use_hopper_ws(tokens: int, heads: int, rope_dim: int) -> bool:
    """Where the H200 measured the warp-specialised kernel faster than the single-role one: NoPE
    rows with at most 16 heads (its role split: 0.018 against 0.022 ms at 8 tokens, a tie at 1),
    or at most 32 heads and 64 query tokens or more (results/reference/decode-tuning/hopper-ws/)."""
    return not rope_dim and (heads <= 16 or (heads <= WS_MAX_BLOCK_H and tokens >= 64))


def use_hopper_wide(single_role: LaunchPlan, rope_dim: int) -> bool:
    """NoPE rows where the single-role planner takes 64 heads per program: there the 64-head
    kernel was 1.03-1.44x faster than the single-role one in the H200's full grid at a9218e0 (64
    heads x 512 tokens: 0.431 against 0.603 ms; 64 heads x 8 tokens: 0.032 against 0.037); at
    07b4e7b it took 0.410 and 0.029 (results/reference/h200-bench-decode-full/).
    Where the planner takes fewer heads to fill the SMs (1 token) the single-role kernel stays
    (0.0121 against 0.0136 ms at 64 heads, results/reference/decode-tuning/hopper-wide/)."""
    return not rope_dim and single_role.block_h == WIDE_BLOCK_H


def choose_plan(tokens: int, heads: int, width: int, rope_dim: int, device) -> LaunchPlan:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if hopper_available(device):
        if use_hopper_ws(tokens, heads, rope_dim):
            return plan_hopper_ws(tokens, heads, width, sms)
        plan = plan_hopper(tokens, heads, width, bool(rope_dim), sms)
        if use_hopper_wide(plan, rope_dim):
            return plan_hopper_wide(tokens, heads, width, sms)
        return plan
    return plan_launch(tokens, heads, width, sms)


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
        part = torch.empty(plan.splits, tokens, heads, g.LATENT_DIM, dtype=torch.float32, device=device)
        part_lse = torch.empty(plan.splits, tokens, heads, dtype=torch.float32, device=device)
        return cls(out, lse, part, part_lse)


def native_decode(q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                  rope_dim: int, plan: LaunchPlan | None = None, buffers: DecodeBuffers | None = None) -> DecodeOutput:
    """Sparse decode over packed rows. Same contract as `sparse_decode_reference`."""
    from nopebench.impls.native import triton_decode as k

    check_decode_args(q, cache, indices, rope_dim)
    if q.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("q and indices must be contiguous in their last dimension")
    tokens, heads, _ = q.shape
    width = indices.shape[1]
    if plan is None:
        plan = choose_plan(tokens, heads, width, rope_dim, q.device) if q.is_cuda else plan_launch(tokens, heads, width)
    if buffers is None:
        buffers = DecodeBuffers.allocate(tokens, heads, plan, q.device)
    out, lse, part, part_lse = buffers.out, buffers.lse, buffers.part, buffers.part_lse
    if tokens == 0:
        return DecodeOutput(out, lse)
    stride_os = part.stride(0) if plan.splits > 1 else 0
    stride_ls = part_lse.stride(0) if plan.splits > 1 else 0
    grid = plan.grid(tokens)
    args = (q, cache, indices, part, part_lse,
            heads, width, plan.entries_per_split, softmax_scale * k.LOG2E,
            q.stride(0), q.stride(1), indices.stride(0),
            part.stride(-3), part.stride(-2), stride_os, part_lse.stride(-2), stride_ls)
    if plan.kernel == "hopper":
        from nopebench.impls.native import hopper_decode

        hopper_decode.hopper_decode_kernel[grid](
            *args, BLOCK_H=plan.block_h, BLOCK_N=plan.block_n, ROW_BYTES=cache.shape[-1], ROPE=bool(rope_dim),
            HEAD_BLOCKS=plan.head_blocks, NUM_STAGES=plan.num_stages, S_WARPS_M=score_warps_m(plan.block_n),
            num_warps=plan.num_warps)
    elif plan.kernel == "hopper_wide":
        from nopebench.impls.native import hopper_wide_decode as wide

        if rope_dim:
            raise ValueError("the 64-head kernel reads NoPE rows only")
        constants, options = wide.launch_constants(plan, cache.shape[-1])
        wide.hopper_wide_decode_kernel[grid](*args, tokens, **constants, **options)
    elif plan.kernel == "hopper_ws":
        from nopebench.impls.native import hopper_ws_decode as ws

        if rope_dim:
            raise ValueError("the warp-specialised kernel reads NoPE rows only")
        constants, options = ws.launch_constants(plan, cache.shape[-1])
        ws.hopper_ws_decode_kernel[grid](*args, tokens, **constants, **options)
    else:
        k.sparse_decode_kernel[grid](
            *args, BLOCK_H=plan.block_h, BLOCK_N=plan.block_n, ROW_BYTES=cache.shape[-1], ROPE=bool(rope_dim),
            HEAD_BLOCKS=plan.head_blocks, PREFETCH=plan.prefetch, NUM_STAGES=plan.num_stages,
            F32_DOT=_interpreting(), FACTORED=plan.factored, num_warps=plan.num_warps)
    if plan.splits > 1:
        k.combine_kernel[(tokens * heads,)](
            part, part_lse, out, lse, heads, plan.splits,
            part.stride(0), part.stride(1), part.stride(2), part_lse.stride(0), part_lse.stride(1),
            out.stride(0), out.stride(1),
            BLOCK_S=_next_pow2(plan.splits), num_warps=4,
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


def _prepare(problem: DecodeProblem) -> DecodeRun:
    plan = choose_plan(problem.tokens, problem.heads, problem.width, problem.rope_dim, problem.q.device)
    buffers = DecodeBuffers.allocate(problem.tokens, problem.heads, plan, problem.q.device)

    def run() -> DecodeOutput:
        return native_decode(problem.q, problem.cache, problem.indices, problem.softmax_scale, problem.rope_dim,
                             plan, buffers)

    return run


def native_spec() -> ImplSpec:
    return ImplSpec(
        name="native",
        description="nopebench kernel (Gluon/wgmma on SM90, portable Triton elsewhere): packed fp8 rows read "
                    "in place, dequantized on chip",
        unsupported=_unsupported,
        prepare=_prepare,
    )
