"""Sparse MLA decode for Hopper (SM90) in Gluon, Triton's explicit-layout dialect.

The portable Triton kernel (`triton_decode.py`) leaves data movement to the compiler, which keeps
the dequantized tile in registers twice over (once per matrix product) and spills. Here every
buffer is explicit, in the layout its consumer wants:

- Row gathers go out with cp.async into a shared-memory ring of NUM_STAGES slots, ahead of the
  block being computed, so memory parallelism does not cost registers. With one slot (the
  128-row blocks) a slot is refilled as soon as it has been dequantized.
- Each block is dequantized once (fp8 * tile scale -> bf16, exactly as the reference rounds)
  into one swizzled tile that both wgmma products read in place: the scores as
  S^T = K Q^T (keys on the M side, "swapAB", so 16 heads still fill a 64-row wgmma) and the
  output as O^T += K^T P^T through a transposed view of the same tile.
- Two warpgroups split the output's 512 rows, so the fp32 accumulator stays in registers for
  up to 64 heads per program. For the scores they split a 128-row block by key (S_WARPS_M = 8:
  each tile row is read once) or a 64-row block by head (S_WARPS_M = 4: the tile is read by
  both, but the block needs half the shared memory).

Same contract and output buffers as `triton_decode.sparse_decode_kernel`: one program per
(query token, head block, split); `-1` entries masked wherever they sit; natural-log LSE;
splits merged by `triton_decode.combine_kernel`. Fixed shapes, no host synchronisation.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from nopebench.impls.native import constants as c

# Gluon renamed cp.async's entry point (async_copy_global_to_shared -> async_load); accept both
# (the H200 has Triton 3.6, this machine 3.9).
_cp_async = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared

NUM_WARPS = gl.constexpr(8)  # two warpgroups
TILE = gl.constexpr(c.TILE)  # fp8 elements per scale tile; a row holds four
# Where a row's scales and RoPE lanes start, and q's RoPE lanes: from the row's one description.
SCALE_OFFSET = gl.constexpr(c.SCALE_OFFSET)
ROPE_OFFSET = gl.constexpr(c.ROPE_OFFSET)
LATENT_DIM = gl.constexpr(c.LATENT_DIM)
# A row's four fp32 tile scales in one 16-byte vector, rows spread over threads as in the gathers
# (so no layout conversion); the 8 threads that share a row copy it redundantly.
SCALES = gl.constexpr(gl.BlockedLayout([1, 4], [4, 8], [NUM_WARPS, 1], [1, 0]))


@gluon.jit
def _per_tile(dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """Four shared buffers of `shape`, one per 128-wide tile of a row. Triton's barrier analysis
    works per allocation, so separate buffers let the four tiles' copies and stores proceed
    without barriers between them."""
    return (
        gl.allocate_shared_memory(dtype, shape, layout),
        gl.allocate_shared_memory(dtype, shape, layout),
        gl.allocate_shared_memory(dtype, shape, layout),
        gl.allocate_shared_memory(dtype, shape, layout),
    )


@gluon.jit
def _copy_rows(
    cache_ptr,
    idx,
    raw_k,
    raw_s,
    slot,
    ROW_BYTES: gl.constexpr,
    gather: gl.constexpr,
    scales_l: gl.constexpr,
):
    """cp.async the rows `idx` names into ring slot `slot`: four 128-byte fp8 tiles, and the
    row's four fp32 tile scales as one 16-byte copy. Rows whose index is -1 are zero-filled.
    Returns the row addresses and their validity."""
    valid = idx >= 0
    row = cache_ptr + gl.where(valid, idx, 0).to(gl.int64) * ROW_BYTES
    cols = gl.arange(0, TILE, layout=gl.SliceLayout(0, gather))
    mask = gl.expand_dims(valid, 1) & gl.expand_dims(cols >= 0, 0)
    for t in gl.static_range(4):
        ptrs = gl.expand_dims(row, 1) + gl.expand_dims(t * TILE + cols, 0)
        _cp_async(raw_k[t].index(slot), ptrs, mask=mask)
    _copy_lanes(row, valid, raw_s, slot, SCALE_OFFSET, gl.float32, 4, scales_l)
    return row, valid


@gluon.jit
def _copy_lanes(
    row,
    valid,
    dst,
    slot,
    OFFSET: gl.constexpr,
    dtype: gl.constexpr,
    LANES: gl.constexpr,
    layout: gl.constexpr,
):
    """cp.async LANES values of `dtype` from byte OFFSET of each row at `row` (`_copy_rows`'s row
    addresses and validity) into `dst` slot `slot`, as stored; invalid rows are zero-filled.
    The tile scales (fp32) and the RoPE lanes (bf16) come this way."""
    lrow = gl.convert_layout(row, gl.SliceLayout(1, layout))
    lvalid = gl.convert_layout(valid, gl.SliceLayout(1, layout))
    cols = gl.arange(0, LANES, layout=gl.SliceLayout(0, layout))
    ptrs = gl.expand_dims((lrow + OFFSET).to(gl.pointer_type(dtype)), 1) + gl.expand_dims(cols, 0)
    _cp_async(dst.index(slot), ptrs, mask=gl.expand_dims(lvalid, 1) & gl.expand_dims(cols >= 0, 0))


@gluon.jit
def _issue_block(
    cache_ptr,
    idx,
    raw_k,
    raw_s,
    raw_r,
    idx_ring,
    stage,
    ROW_BYTES: gl.constexpr,
    ROPE: gl.constexpr,
    gather: gl.constexpr,
    rope_gather: gl.constexpr,
):
    """Start the cp.async gathers of one block's rows into ring slot `stage` (one commit group);
    the index row itself is kept for the mask."""
    row, valid = _copy_rows(cache_ptr, idx, raw_k, raw_s, stage, ROW_BYTES, gather, SCALES)
    if ROPE:
        _copy_lanes(row, valid, raw_r, stage, ROPE_OFFSET, gl.bfloat16, 64, rope_gather)
    idx_ring.index(stage).store(idx)
    cp.commit_group()


@gluon.jit
def _load_idx(idx_row, n0, end, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    offs = n0 + gl.arange(0, BLOCK_N, layout=layout)
    return gl.load(idx_row + offs, mask=offs < end, other=-1)


@gluon.jit
def _dequantize_tile(raw_k, scales, kv_smem, stage, t: gl.constexpr, gather: gl.constexpr):
    """fp8 * per-row tile scale -> bf16 for 128-wide tile t, rounded exactly as the reference
    does."""
    tile_of = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES)), 0)
    scale = gl.convert_layout(
        gl.sum(gl.where(tile_of == t, scales, 0.0), axis=1), gl.SliceLayout(1, gather)
    )
    raw = raw_k[t].index(stage).load(gather)
    kv = raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * gl.expand_dims(scale, 1)
    kv_smem[t].store(kv.to(gl.bfloat16))


@gluon.jit
def _dequantize(raw_k, raw_s, kv_smem, stage, gather: gl.constexpr):
    """Dequantize a block into the tile both products read, fenced so the wgmma (async proxy)
    sees it. (Rewriting each tile as soon as its previous output product retired, to overlap
    the two, measured 13% slower on the H200: the extra waits and barriers cost more.)"""
    scales = raw_s.index(stage).load(SCALES)
    for t in gl.static_range(4):
        _dequantize_tile(raw_k, scales, kv_smem, stage, t, gather)
    fence_async_shared()


@gluon.jit
def _issue_scores(
    kv_smem,
    q_smem,
    raw_r,
    qr_smem,
    stage,
    BLOCK_N: gl.constexpr,
    BLOCK_H: gl.constexpr,
    ROPE: gl.constexpr,
    s_layout: gl.constexpr,
):
    """S^T = K Q^T (+ K_rope Q_rope^T), issued asynchronously: 4 (5 with RoPE) wgmma groups."""
    s = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, s_layout)
    for t in gl.static_range(4):
        s = warpgroup_mma(kv_smem[t], q_smem.index(t).permute((1, 0)), s, is_async=True)
    if ROPE:
        s = warpgroup_mma(raw_r.index(stage), qr_smem.permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _softmax_step(
    s, valid, m_i, l_i, qk_scale_log2, KEYS: gl.constexpr = 0, PARTIAL: gl.constexpr = False
):
    """Online-softmax update over one block of scores with keys on axis KEYS (0: the swapped
    S^T, heads on axis 1): new max, P, rescale. PARTIAL: `l_i` has the scores' shape and is
    updated element by element (summed over the keys once, after the last block), so no
    block's sum crosses threads."""
    s = gl.where(gl.expand_dims(valid, 1 - KEYS), s * qk_scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=KEYS))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # no valid entry yet: keep p = 0
    p = gl.exp2(s - gl.expand_dims(m_safe, KEYS))
    alpha = gl.exp2(m_i - m_safe)
    if PARTIAL:  # noqa: SIM108 (a constexpr if: only the taken branch is compiled)
        l_i = l_i * gl.expand_dims(alpha, KEYS) + p
    else:
        l_i = l_i * alpha + gl.sum(p, axis=KEYS)
    return p, alpha, m_new, l_i


@gluon.jit
def _issue_output(kv_smem, p_smem, o0, o1, o2, o3, alpha, o_layout: gl.constexpr):
    """O^T = alpha * O^T + K^T P^T through a transposed view of the tile: 4 async wgmma groups."""
    a_o = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, o_layout)), 0)
    o0 = warpgroup_mma(kv_smem[0].permute((1, 0)), p_smem, o0 * a_o, is_async=True)
    o1 = warpgroup_mma(kv_smem[1].permute((1, 0)), p_smem, o1 * a_o, is_async=True)
    o2 = warpgroup_mma(kv_smem[2].permute((1, 0)), p_smem, o2 * a_o, is_async=True)
    o3 = warpgroup_mma(kv_smem[3].permute((1, 0)), p_smem, o3 * a_o, is_async=True)
    return o0, o1, o2, o3


@gluon.jit
def _program(idx_ptr, width, entries_per_split, stride_it, HEAD_BLOCKS: gl.constexpr):
    """This program's query token, head block, split, index row and top-k range [start, end)."""
    pid = gl.program_id(0)
    split = gl.program_id(1)
    tok = pid // HEAD_BLOCKS
    hb = pid % HEAD_BLOCKS
    idx_row = idx_ptr + tok.to(gl.int64) * stride_it
    start = split * entries_per_split
    return tok, hb, split, idx_row, start, gl.minimum(start + entries_per_split, width)


@gluon.jit
def _stage_q(
    q_ptr,
    q_smem,
    qr_smem,
    tok,
    hb,
    heads,
    stride_qt,
    stride_qh,
    BLOCK_H: gl.constexpr,
    ROPE: gl.constexpr,
    q_layout: gl.constexpr,
    LATENT: gl.constexpr = True,
):
    """q for this head block (rows past `heads` zero), staged once as the score product's B
    operand (K-major): its 512 latent lanes in four 128-wide tiles and, with ROPE, its last 64
    (the RoPE lanes) in `qr_smem`. LATENT=False leaves the latent lanes out (for a partition
    that stages the RoPE lanes apart from the rest)."""
    offs_qh = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_layout))
    if LATENT:
        qcols = gl.arange(0, TILE, layout=gl.SliceLayout(0, q_layout))
        qmask = gl.expand_dims(offs_qh < heads, 1) & gl.expand_dims(qcols >= 0, 0)
        qrow = q_ptr + tok.to(gl.int64) * stride_qt + gl.expand_dims(offs_qh, 1) * stride_qh
        for t in gl.static_range(4):
            q_smem.index(t).store(
                gl.load(qrow + gl.expand_dims(t * TILE + qcols, 0), mask=qmask, other=0.0)
            )
    if ROPE:
        rq_cols = gl.arange(0, 64, layout=gl.SliceLayout(0, q_layout))
        rq_mask = gl.expand_dims(offs_qh < heads, 1) & gl.expand_dims(rq_cols >= 0, 0)
        rqrow = q_ptr + tok.to(gl.int64) * stride_qt + gl.expand_dims(offs_qh, 1) * stride_qh
        qr_smem.store(
            gl.load(rqrow + gl.expand_dims(LATENT_DIM + rq_cols, 0), mask=rq_mask, other=0.0)
        )


@gluon.jit
def _empty_state(BLOCK_H: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """Zero O^T tiles and the online-softmax state before the first block (max -inf, sum 0)."""
    o0 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    o1 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    o2 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    o3 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, s_layout))
    return o0, o1, o2, o3, m_i, gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(0, s_layout))


@gluon.jit
def _attend(
    s,
    valid,
    kv,
    p_smem,
    o0,
    o1,
    o2,
    o3,
    m_i,
    l_i,
    qk_scale_log2,
    o_layout: gl.constexpr,
    PARTIAL: gl.constexpr = False,
):
    """One block after its scores: the online-softmax step (PARTIAL: `_softmax_step`'s), P into
    shared memory, and the output product, waited for."""
    p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, qk_scale_log2, PARTIAL=PARTIAL)
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    o0, o1, o2, o3 = _issue_output(kv, p_smem, o0, o1, o2, o3, alpha, o_layout)
    o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
    return o0, o1, o2, o3, m_i, l_i


@gluon.jit
def hopper_decode_kernel(
    q_ptr,
    cache_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    heads,
    width,
    entries_per_split,
    qk_scale_log2,
    stride_qt,
    stride_qh,
    stride_it,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_ls,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    ROW_BYTES: gl.constexpr,
    ROPE: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    S_WARPS_M: gl.constexpr,
):
    # Register layouts: 16-byte vectors per thread for the gathers; wgmma accumulators with the
    # scores split across the two warpgroups by key or head (S_WARPS_M), the output by latent row.
    gather: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NUM_WARPS, 1], [1, 0])
    rope_gather: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NUM_WARPS, 1], [1, 0])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0],
        warps_per_cta=[S_WARPS_M, NUM_WARPS // S_WARPS_M],
        instr_shape=[16, BLOCK_H * S_WARPS_M // NUM_WARPS, 16],
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, BLOCK_H, 16]
    )
    rows_g: gl.constexpr = gl.SliceLayout(1, gather)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    plain1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    kv_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, TILE], gl.bfloat16)
    q_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, TILE], gl.bfloat16)
    qr_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16)
    r_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    p_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], gl.bfloat16)
    WAIT_PENDING: gl.constexpr = NUM_STAGES - 2 if NUM_STAGES > 1 else 0

    raw_k = _per_tile(gl.uint8, [NUM_STAGES, BLOCK_N, TILE], plain)
    raw_s = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_N, 4], plain)
    idx_ring = gl.allocate_shared_memory(gl.int32, [NUM_STAGES, BLOCK_N], plain1)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [4, BLOCK_H, TILE], q_shared)
    if ROPE:
        raw_r = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 64], r_shared)
        qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], qr_shared)
    else:
        raw_r = q_smem  # placeholders, never touched without ROPE
        qr_smem = q_smem
    kv_smem = _per_tile(gl.bfloat16, [BLOCK_N, TILE], kv_shared)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_H], p_shared)

    tok, hb, split, idx_row, start, end = _program(
        idx_ptr, width, entries_per_split, stride_it, HEAD_BLOCKS
    )

    # Prologue: the first blocks' gathers in flight (one less than the slots, at least one), the
    # next index block in registers.
    AHEAD: gl.constexpr = NUM_STAGES - 1 if NUM_STAGES > 1 else 1
    for j in gl.static_range(AHEAD):
        idx = _load_idx(idx_row, start + j * BLOCK_N, end, BLOCK_N, rows_g)
        _issue_block(
            cache_ptr, idx, raw_k, raw_s, raw_r, idx_ring, j, ROW_BYTES, ROPE, gather, rope_gather
        )
    idx_next = _load_idx(idx_row, start + AHEAD * BLOCK_N, end, BLOCK_N, rows_g)

    _stage_q(q_ptr, q_smem, qr_smem, tok, hb, heads, stride_qt, stride_qh, BLOCK_H, ROPE, q_layout)

    o0, o1, o2, o3, m_i, l_i = _empty_state(BLOCK_H, s_layout, o_layout)

    stage = 0
    for n in range(start, end, BLOCK_N):
        cp.wait_group(WAIT_PENDING)  # this block's gathers have landed
        valid = idx_ring.index(stage).load(rows_s) >= 0
        if NUM_STAGES > 1:
            # Refill the slot the previous block used; its index block was loaded an iteration ago.
            _issue_block(
                cache_ptr,
                idx_next,
                raw_k,
                raw_s,
                raw_r,
                idx_ring,
                (stage + NUM_STAGES - 1) % NUM_STAGES,
                ROW_BYTES,
                ROPE,
                gather,
                rope_gather,
            )
            idx_next = _load_idx(idx_row, n + NUM_STAGES * BLOCK_N, end, BLOCK_N, rows_g)
        _dequantize(raw_k, raw_s, kv_smem, stage, gather)
        s = _issue_scores(kv_smem, q_smem, raw_r, qr_smem, stage, BLOCK_N, BLOCK_H, ROPE, s_layout)
        if NUM_STAGES == 1 and not ROPE:
            # One slot: refilled as soon as it is dequantized (RoPE lanes are read by the scores).
            _issue_block(
                cache_ptr,
                idx_next,
                raw_k,
                raw_s,
                raw_r,
                idx_ring,
                0,
                ROW_BYTES,
                ROPE,
                gather,
                rope_gather,
            )
            idx_next = _load_idx(idx_row, n + 2 * BLOCK_N, end, BLOCK_N, rows_g)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        if NUM_STAGES == 1 and ROPE:
            _issue_block(
                cache_ptr,
                idx_next,
                raw_k,
                raw_s,
                raw_r,
                idx_ring,
                0,
                ROW_BYTES,
                ROPE,
                gather,
                rope_gather,
            )
            idx_next = _load_idx(idx_row, n + 2 * BLOCK_N, end, BLOCK_N, rows_g)
        o0, o1, o2, o3, m_i, l_i = _attend(
            s, valid, kv_smem, p_smem, o0, o1, o2, o3, m_i, l_i, qk_scale_log2, o_layout
        )
        stage = (stage + 1) % NUM_STAGES
    cp.wait_group(0)

    _write_out(
        o0,
        o1,
        o2,
        o3,
        m_i,
        l_i,
        out_ptr,
        lse_ptr,
        tok,
        hb,
        split,
        heads,
        stride_ot,
        stride_oh,
        stride_os,
        stride_lt,
        stride_ls,
        BLOCK_H,
        s_layout,
        o_layout,
    )


@gluon.jit
def _write_out(
    o0,
    o1,
    o2,
    o3,
    m_i,
    l_i,
    out_ptr,
    lse_ptr,
    tok,
    hb,
    split,
    heads,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_ls,
    BLOCK_H: gl.constexpr,
    s_layout: gl.constexpr,
    o_layout: gl.constexpr,
):
    """Normalise O^T by the softmax denominator and store it with the natural-log LSE
    (rows with no valid entry: zeros and -inf)."""
    has = l_i > 0
    inv = gl.where(has, 1.0 / gl.where(has, l_i, 1.0), 0.0)
    lse = gl.where(
        has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf")
    )
    inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(0, o_layout)), 0)
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, o_layout))
    rows = gl.arange(0, TILE, layout=gl.SliceLayout(1, o_layout))
    base = out_ptr + split.to(gl.int64) * stride_os + tok.to(gl.int64) * stride_ot
    ptrs = base + gl.expand_dims(offs_h, 0) * stride_oh + gl.expand_dims(rows, 1)
    omask = gl.expand_dims(offs_h < heads, 0) & gl.expand_dims(rows >= 0, 1)
    ty = out_ptr.dtype.element_ty
    gl.store(ptrs, (o0 * inv_o).to(ty), mask=omask)
    gl.store(ptrs + TILE, (o1 * inv_o).to(ty), mask=omask)
    gl.store(ptrs + 2 * TILE, (o2 * inv_o).to(ty), mask=omask)
    gl.store(ptrs + 3 * TILE, (o3 * inv_o).to(ty), mask=omask)
    lse_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, s_layout))
    gl.store(
        lse_ptr + split.to(gl.int64) * stride_ls + tok.to(gl.int64) * stride_lt + lse_h,
        lse,
        mask=lse_h < heads,
    )
