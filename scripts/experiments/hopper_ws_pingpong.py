"""EXPERIMENT, not used: the warp-specialised kernel with two consumers taking alternate blocks
(results/reference/decode-tuning/hopper-ws/experiments.log, run H: correct, but its consumers
spill under any register split and it ran slower). Kept one commit for the record."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma_wait,
)

from nopebench.decode.hopper_decode import (
    TILE,
    _cp_async,
    _issue_output,
    _issue_scores,
    _softmax_step,
    _write_out,
)

NUM_BUF = gl.constexpr(2)


def max_regs(warps: int) -> int:
    """Registers per thread at launch: the 64K register file over all the warps (multiple of 8)."""
    return min(256, 65536 // (32 * warps)) // 8 * 8


PRODUCER_REGS = 96  # per producer thread: its dequantization, without spilling


def consumer_regs(consumer_warps: int, producer_warps: int) -> int:
    """Per consumer thread (setmaxnreg): what the producer leaves of the register file, split
    evenly between the two consumers (a multiple of 8, as setmaxnreg wants)."""
    return min(256, (2048 - producer_warps * PRODUCER_REGS) // (2 * consumer_warps)) // 8 * 8


@gluon.jit
def _gather_block(cache_ptr, idx, raw_k, raw_s, slot, idx_row, idx_n0, end, idx_ring,
                  ROW_BYTES: gl.constexpr, gather: gl.constexpr, scales_l: gl.constexpr, idx_l: gl.constexpr):
    """One commit group into ring slot `slot`: cp.async of the rows `idx` names (-1 rows are
    zero-filled), and of the index entries from `idx_n0` on, which a later refill of the slot will
    gather: so no index load is ever waited on."""
    valid = idx >= 0
    row = cache_ptr + gl.where(valid, idx, 0).to(gl.int64) * ROW_BYTES
    cols = gl.arange(0, TILE, layout=gl.SliceLayout(0, gather))
    mask = gl.expand_dims(valid, 1) & gl.expand_dims(cols >= 0, 0)
    for t in gl.static_range(4):
        _cp_async(raw_k[t].index(slot), gl.expand_dims(row, 1) + gl.expand_dims(t * TILE + cols, 0), mask=mask)
    srow = gl.convert_layout(row, gl.SliceLayout(1, scales_l))
    svalid = gl.convert_layout(valid, gl.SliceLayout(1, scales_l))
    scols = gl.arange(0, 4, layout=gl.SliceLayout(0, scales_l))
    sptrs = gl.expand_dims((srow + 512).to(gl.pointer_type(gl.float32)), 1) + gl.expand_dims(scols, 0)
    _cp_async(raw_s.index(slot), sptrs, mask=gl.expand_dims(svalid, 1) & gl.expand_dims(scols >= 0, 0))
    offs = idx_n0 + gl.arange(0, idx_ring.shape[1], layout=idx_l)
    _cp_async(idx_ring.index(slot), idx_row + offs, mask=offs < end)
    cp.commit_group()


@gluon.jit
def _block_idx(idx_row, n0, end, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    offs = n0 + gl.arange(0, BLOCK_N, layout=layout)
    return gl.load(idx_row + offs, mask=offs < end, other=-1)


@gluon.jit
def _producer(cache_ptr, idx_row, start, end, raw_k, raw_s, idx_ring, kv_bufs, full_bars, empty_bars,
              BLOCK_N: gl.constexpr, ROW_BYTES: gl.constexpr, RING_SLOTS: gl.constexpr, P_WARPS: gl.constexpr):
    # The ring holds sub-blocks of SUB rows (one pass of the gather layout), so that while one is
    # being dequantized the other RING_SLOTS - 1 stay in flight. Sub-block k's group also brings
    # the index entries of sub-block k + RING_SLOTS, which refills its slot.
    SUB: gl.constexpr = 4 * P_WARPS
    SUBS: gl.constexpr = BLOCK_N // SUB
    gather: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [P_WARPS, 1], [1, 0])
    scales_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [P_WARPS, 1], [1, 0])
    idx_l: gl.constexpr = gl.BlockedLayout([1], [32], [P_WARPS], [0])
    # Dequantization: 8 bytes in, one 16-byte store out per thread, a warp's stores spread over
    # all banks of the swizzled tile (the gather layout's 32-byte runs conflict: 5% slower).
    deq: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [P_WARPS, 1], [1, 0])
    deq_scales: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [P_WARPS, 1], [1, 0])  # its rows, 4 scales each
    rows_g: gl.constexpr = gl.SliceLayout(1, gather)
    tile_of = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, deq_scales)), 0)
    for j in gl.static_range(RING_SLOTS):
        _gather_block(cache_ptr, _block_idx(idx_row, start + j * SUB, end, SUB, rows_g), raw_k, raw_s, j,
                      idx_row, start + (j + RING_SLOTS) * SUB, end, idx_ring, ROW_BYTES, gather, scales_l, idx_l)
    for i in range(gl.cdiv(end - start, BLOCK_N)):
        b = i % NUM_BUF
        mbarrier.wait(empty_bars.index(b), ((i // NUM_BUF) & 1) ^ 1)  # tile b is free (both start free)
        for j in gl.static_range(SUBS):
            k = i * SUBS + j
            slot = k % RING_SLOTS
            cp.wait_group(RING_SLOTS - 1)  # sub-block k has landed, with the indices of k + RING_SLOTS
            # All loads first: the compiler cannot move a load from the ring above a store to a
            # tile (it cannot tell they do not alias), and each load's latency would be waited on.
            scales = raw_s.index(slot).load(deq_scales)
            raw = (raw_k[0].index(slot).load(deq), raw_k[1].index(slot).load(deq),
                   raw_k[2].index(slot).load(deq), raw_k[3].index(slot).load(deq))
            for t in gl.static_range(4):
                scale = gl.convert_layout(gl.sum(gl.where(tile_of == t, scales, 0.0), axis=1), gl.SliceLayout(1, deq))
                kv = raw[t].to(gl.float8e4nv, bitcast=True).to(gl.float32) * gl.expand_dims(scale, 1)
                kv_bufs[t].index(b).slice(j * SUB, SUB).store(kv.to(gl.bfloat16))
            # Dequantized: refill the slot with sub-block k + RING_SLOTS (cp.async zero-fills
            # entries past `end`, so the range mask is applied again here).
            n_next = start + (k + RING_SLOTS) * SUB
            offs = n_next + gl.arange(0, SUB, layout=rows_g)
            idx = gl.where(offs < end, idx_ring.index(slot).load(rows_g), -1)
            _gather_block(cache_ptr, idx, raw_k, raw_s, slot, idx_row, n_next + RING_SLOTS * SUB, end, idx_ring,
                          ROW_BYTES, gather, scales_l, idx_l)
        fence_async_shared()  # generic-proxy stores -> the consumer's wgmma (async proxy)
        mbarrier.arrive(full_bars.index(b), count=1)
    cp.wait_group(0)


@gluon.jit
def _tile(kv_bufs, b):
    return kv_bufs[0].index(b), kv_bufs[1].index(b), kv_bufs[2].index(b), kv_bufs[3].index(b)


# Gluon renamed the shared-memory view cast (_reinterpret -> reinterpret); define the helper
# for whichever this Triton has (the H200 has 3.6, this machine 3.9).
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def _as(smem, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return smem.reinterpret(dtype, shape, layout)
else:
    @gluon.jit
    def _as(smem, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return smem._reinterpret(dtype, shape, layout)


@gluon.jit
def _partial_out(kv_bufs, t: gl.constexpr, BLOCK_H: gl.constexpr):
    """Where the second consumer leaves its output tile t: in its own dequantized tile, which no
    one writes or reads once its last block is done."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE, BLOCK_H], gl.float32)  # stores vectorize
    return _as(kv_bufs[t].index(1), gl.float32, [TILE, BLOCK_H], layout)


@gluon.jit
def _consume(q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end, qk_scale_log2, me: gl.constexpr,
             BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """Online softmax and both products over blocks me, me + 2, ..., which the producer leaves in
    tile `me`: the two consumers take turns, so one's softmax runs under the other's products."""
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    o0 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    o1 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    o2 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    o3 = gl.zeros([TILE, BLOCK_H], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(0, s_layout))
    kv = _tile(kv_bufs, me)
    p_mine = p_smem.index(me)
    valid_next = _block_idx(idx_row, start + me * BLOCK_N, end, BLOCK_N, rows_s) >= 0
    for k in range((gl.cdiv(end - start, BLOCK_N) + 1 - me) // 2):
        valid = valid_next
        valid_next = _block_idx(idx_row, start + (2 * k + 2 + me) * BLOCK_N, end, BLOCK_N, rows_s) >= 0
        mbarrier.wait(full_bars.index(me), k & 1)
        s = _issue_scores(kv, q_smem, q_smem, q_smem, 0, BLOCK_N, BLOCK_H, False, s_layout)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, qk_scale_log2)
        p_mine.store(p.to(gl.bfloat16))
        fence_async_shared()
        o0, o1, o2, o3 = _issue_output(kv, p_mine, o0, o1, o2, o3, alpha, o_layout)
        o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
        mbarrier.arrive(empty_bars.index(me), count=1)
    return o0, o1, o2, o3, m_i, l_i


@gluon.jit
def _second_consumer(q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end, qk_scale_log2,
                     ml_smem, merge_bar, dest, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
                     s_layout: gl.constexpr, o_layout: gl.constexpr):
    """The odd blocks, then its partial softmax state handed to the first consumer."""
    o0, o1, o2, o3, m_i, l_i = _consume(q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end,
                                        qk_scale_log2, 1, BLOCK_N, BLOCK_H, s_layout, o_layout)
    _partial_out(kv_bufs, 0, BLOCK_H).store(o0)
    _partial_out(kv_bufs, 1, BLOCK_H).store(o1)
    _partial_out(kv_bufs, 2, BLOCK_H).store(o2)
    _partial_out(kv_bufs, 3, BLOCK_H).store(o3)
    ml_smem.index(0).store(m_i)
    ml_smem.index(1).store(l_i)
    mbarrier.arrive(merge_bar, count=1)


@gluon.jit
def _first_consumer(q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end, qk_scale_log2,
                    ml_smem, merge_bar, dest, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
                    s_layout: gl.constexpr, o_layout: gl.constexpr):
    """The even blocks, then the two partial states merged (log-sum-exp) and stored."""
    o0, o1, o2, o3, m_a, l_a = _consume(q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end,
                                        qk_scale_log2, 0, BLOCK_N, BLOCK_H, s_layout, o_layout)
    mbarrier.wait(merge_bar, 0)
    m_b = ml_smem.index(0).load(gl.SliceLayout(0, s_layout))
    l_b = ml_smem.index(1).load(gl.SliceLayout(0, s_layout))
    m = gl.maximum(m_a, m_b)
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    f_a = gl.exp2(m_a - m_safe)
    f_b = gl.exp2(m_b - m_safe)
    fa_o = gl.expand_dims(gl.convert_layout(f_a, gl.SliceLayout(0, o_layout)), 0)
    fb_o = gl.expand_dims(gl.convert_layout(f_b, gl.SliceLayout(0, o_layout)), 0)
    o0 = o0 * fa_o + _partial_out(kv_bufs, 0, BLOCK_H).load(o_layout) * fb_o
    o1 = o1 * fa_o + _partial_out(kv_bufs, 1, BLOCK_H).load(o_layout) * fb_o
    o2 = o2 * fa_o + _partial_out(kv_bufs, 2, BLOCK_H).load(o_layout) * fb_o
    o3 = o3 * fa_o + _partial_out(kv_bufs, 3, BLOCK_H).load(o_layout) * fb_o
    out_ptr, lse_ptr, tok, hb, split, heads, stride_ot, stride_oh, stride_os, stride_lt, stride_ls = dest
    _write_out(o0, o1, o2, o3, m, l_a * f_a + l_b * f_b, out_ptr, lse_ptr, tok, hb, split, heads,
               stride_ot, stride_oh, stride_os, stride_lt, stride_ls, BLOCK_H, s_layout, o_layout)


@gluon.jit
def hopper_ws_decode_kernel(
    q_ptr, cache_ptr, idx_ptr, out_ptr, lse_ptr,
    heads, width, entries_per_split, qk_scale_log2,
    stride_qt, stride_qh, stride_it, stride_ot, stride_oh, stride_os, stride_lt, stride_ls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, ROW_BYTES: gl.constexpr, HEAD_BLOCKS: gl.constexpr,
    RING_SLOTS: gl.constexpr, S_WARPS_M: gl.constexpr, C_WARPS: gl.constexpr, P_WARPS: gl.constexpr,
    C_REGS: gl.constexpr,
):
    # P_WARPS: the producer's warps (the kernel's num_warps); C_WARPS, C_REGS: each consumer's
    # warps and register budget (setmaxnreg); RING_SLOTS: ring slots of 4 * P_WARPS rows.
    SUB: gl.constexpr = 4 * P_WARPS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[S_WARPS_M, C_WARPS // S_WARPS_M],
                                                       instr_shape=[16, BLOCK_H * S_WARPS_M // C_WARPS, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[C_WARPS, 1],
                                                       instr_shape=[16, BLOCK_H, 16])
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [P_WARPS, 1], [1, 0])
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    kv_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, TILE], gl.bfloat16)
    q_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, TILE], gl.bfloat16)
    p_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], gl.bfloat16)

    # One allocation per 128-wide tile, as in hopper_decode (barrier analysis is per allocation).
    raw_k = (gl.allocate_shared_memory(gl.uint8, [RING_SLOTS, SUB, TILE], plain),
             gl.allocate_shared_memory(gl.uint8, [RING_SLOTS, SUB, TILE], plain),
             gl.allocate_shared_memory(gl.uint8, [RING_SLOTS, SUB, TILE], plain),
             gl.allocate_shared_memory(gl.uint8, [RING_SLOTS, SUB, TILE], plain))
    raw_s = gl.allocate_shared_memory(gl.float32, [RING_SLOTS, SUB, 4], plain)
    idx_ring = gl.allocate_shared_memory(gl.int32, [RING_SLOTS, SUB], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_bufs = (gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, TILE], kv_shared),
               gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, TILE], kv_shared),
               gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, TILE], kv_shared),
               gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, TILE], kv_shared))
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [4, BLOCK_H, TILE], q_shared)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, BLOCK_H], p_shared)  # one P per consumer
    ml_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    merge_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(merge_bar, count=1)
    full_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(NUM_BUF):
        mbarrier.init(full_bars.index(b), count=1)
        mbarrier.init(empty_bars.index(b), count=1)

    pid = gl.program_id(0)
    split = gl.program_id(1)
    tok = pid // HEAD_BLOCKS
    hb = pid % HEAD_BLOCKS
    idx_row = idx_ptr + tok.to(gl.int64) * stride_it
    start = split * entries_per_split
    end = gl.minimum(start + entries_per_split, width)

    offs_qh = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_layout))
    qcols = gl.arange(0, TILE, layout=gl.SliceLayout(0, q_layout))
    qmask = gl.expand_dims(offs_qh < heads, 1) & gl.expand_dims(qcols >= 0, 0)
    qrow = q_ptr + tok.to(gl.int64) * stride_qt + gl.expand_dims(offs_qh, 1) * stride_qh
    for t in gl.static_range(4):
        q_smem.index(t).store(gl.load(qrow + gl.expand_dims(t * TILE + qcols, 0), mask=qmask, other=0.0))
    fence_async_shared()

    # The producer is the default partition (the kernel's num_warps); the consumers are workers,
    # so that each gets the register budget it is given (the default partition gets what is left).
    dest = (out_ptr, lse_ptr, tok, hb, split, heads, stride_ot, stride_oh, stride_os, stride_lt, stride_ls)
    gl.warp_specialize(
        [(_producer, (cache_ptr, idx_row, start, end, raw_k, raw_s, idx_ring, kv_bufs, full_bars, empty_bars,
                      BLOCK_N, ROW_BYTES, RING_SLOTS, P_WARPS)),
         (_first_consumer, (q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end, qk_scale_log2,
                            ml_smem, merge_bar, dest, BLOCK_N, BLOCK_H, s_layout, o_layout)),
         (_second_consumer, (q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end, qk_scale_log2,
                             ml_smem, merge_bar, dest, BLOCK_N, BLOCK_H, s_layout, o_layout))],
        [C_WARPS, C_WARPS], [C_REGS, C_REGS])
