"""Warp-specialised sparse MLA decode for Hopper (SM90), NoPE rows, in Gluon.

`hopper_decode.py` runs every phase in the same warps, one after the other: gather, dequantize,
score product, softmax, output product; ncu showed each SM doing one of them at a time. Here
two roles run at once:

- the producer (two warpgroups, a worker partition) gathers rows with cp.async into a ring of
  32-row slots and dequantizes each 64-row block (fp8 * tile scale -> bf16, rounded as the
  reference rounds) into one of two swizzled tiles. Each slot's copy group also brings the
  index entries of the rows that will refill it, so no index load is ever waited on;
- the consumer (one warpgroup, the default partition) runs S^T = K Q^T, the online softmax and
  O^T += K^T P^T on the other tile, exactly as `hopper_decode` does.

Two mbarriers per tile hand it over: `full` (producer -> consumer: the tile holds the next
block) and `empty` (consumer -> producer: the products that read it retired). One consumer
warpgroup holds O^T (512 x heads, fp32) in registers, so a program takes at most 32 heads; RoPE
rows stay with `hopper_decode` (their extra lanes would not leave room for two tiles).

Same contract and output buffers as `hopper_decode.hopper_decode_kernel`.
"""

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
    _attend,
    _copy_rows,
    _cp_async,
    _empty_state,
    _issue_scores,
    _load_idx,
    _program,
    _stage_q,
    _write_out,
)

NUM_BUF = gl.constexpr(2)  # dequantized tiles: one being written, one being read
CONSUMER_WARPS, PRODUCER_WARPS = 4, 8
# setmaxnreg budget of a producer thread: its dequantization without spilling (the compile-only
# build checks); the consumer gets the rest.
PRODUCER_REGS = 96


def launch_regs() -> int:
    """Registers per thread at launch: the 64K register file over all the warps (multiple of 8)."""
    return 65536 // (32 * (CONSUMER_WARPS + PRODUCER_WARPS)) // 8 * 8


@gluon.jit
def _gather_block(cache_ptr, idx, raw_k, raw_s, slot, idx_row, idx_n0, end, idx_ring,
                  ROW_BYTES: gl.constexpr, gather: gl.constexpr, scales_l: gl.constexpr, idx_l: gl.constexpr):
    """One commit group into ring slot `slot`: the rows `idx` names, and the index entries from
    `idx_n0` on, which a later refill of the slot will gather: so no index load is waited on."""
    _copy_rows(cache_ptr, idx, raw_k, raw_s, slot, ROW_BYTES, gather, scales_l)
    offs = idx_n0 + gl.arange(0, idx_ring.shape[1], layout=idx_l)
    _cp_async(idx_ring.index(slot), idx_row + offs, mask=offs < end)
    cp.commit_group()


@gluon.jit
def _producer(cache_ptr, idx_row, start, end, raw_k, raw_s, idx_ring, kv_bufs, full_bars, empty_bars,
              BLOCK_N: gl.constexpr, ROW_BYTES: gl.constexpr, RING_SLOTS: gl.constexpr, P_WARPS: gl.constexpr):
    """Gathers and dequantizes every block of the range into the tile the consumer has freed."""
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
        _gather_block(cache_ptr, _load_idx(idx_row, start + j * SUB, end, SUB, rows_g), raw_k, raw_s, j,
                      idx_row, start + (j + RING_SLOTS) * SUB, end, idx_ring, ROW_BYTES, gather, scales_l, idx_l)
    for i in range(gl.cdiv(end - start, BLOCK_N)):
        b = i % NUM_BUF
        mbarrier.wait(empty_bars.index(b), ((i // NUM_BUF) & 1) ^ 1)  # tile b is free (both start free)
        for j in gl.static_range(SUBS):
            k = i * SUBS + j
            slot = k % RING_SLOTS
            cp.wait_group(RING_SLOTS - 1)  # sub-block k has landed, with the indices of k + RING_SLOTS
            # The slot's loads, then the tile's stores (timed the same as interleaving them).
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


@gluon.jit
def _consumer(q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end, qk_scale_log2,
              BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """Each block as the producer hands it over: scores, online softmax, output product; then
    the tile goes back. Returns the unnormalised O^T tiles and the softmax state."""
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    o0, o1, o2, o3, m_i, l_i = _empty_state(BLOCK_H, s_layout, o_layout)
    valid_next = _load_idx(idx_row, start, end, BLOCK_N, rows_s) >= 0
    for i in range(gl.cdiv(end - start, BLOCK_N)):
        b = i % NUM_BUF
        valid = valid_next
        valid_next = _load_idx(idx_row, start + (i + 1) * BLOCK_N, end, BLOCK_N, rows_s) >= 0
        mbarrier.wait(full_bars.index(b), (i // NUM_BUF) & 1)
        kv = _tile(kv_bufs, b)
        s = _issue_scores(kv, q_smem, q_smem, q_smem, 0, BLOCK_N, BLOCK_H, False, s_layout)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        o0, o1, o2, o3, m_i, l_i = _attend(s, valid, kv, p_smem, o0, o1, o2, o3, m_i, l_i, qk_scale_log2, o_layout)
        mbarrier.arrive(empty_bars.index(b), count=1)
    return o0, o1, o2, o3, m_i, l_i


@gluon.jit
def hopper_ws_decode_kernel(
    q_ptr, cache_ptr, idx_ptr, out_ptr, lse_ptr,
    heads, width, entries_per_split, qk_scale_log2,
    stride_qt, stride_qh, stride_it, stride_ot, stride_oh, stride_os, stride_lt, stride_ls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, ROW_BYTES: gl.constexpr, HEAD_BLOCKS: gl.constexpr,
    RING_SLOTS: gl.constexpr, C_WARPS: gl.constexpr, P_WARPS: gl.constexpr, P_REGS: gl.constexpr,
):
    # C_WARPS: the consumer's warps (the kernel's num_warps, one warpgroup); P_WARPS, P_REGS: the
    # producer's warps and register budget (setmaxnreg); RING_SLOTS: ring slots of 4 * P_WARPS rows.
    SUB: gl.constexpr = 4 * P_WARPS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[C_WARPS, 1],
                                                       instr_shape=[16, BLOCK_H, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[C_WARPS, 1],
                                                       instr_shape=[16, BLOCK_H, 16])
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [C_WARPS, 1], [1, 0])
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
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_H], p_shared)
    full_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(NUM_BUF):
        mbarrier.init(full_bars.index(b), count=1)
        mbarrier.init(empty_bars.index(b), count=1)

    tok, hb, split, idx_row, start, end = _program(idx_ptr, width, entries_per_split, stride_it, HEAD_BLOCKS)
    _stage_q(q_ptr, q_smem, tok, hb, heads, stride_qt, stride_qh, BLOCK_H, q_layout)
    fence_async_shared()

    o0, o1, o2, o3, m_i, l_i = gl.warp_specialize(
        [(_consumer, (q_smem, kv_bufs, p_smem, full_bars, empty_bars, idx_row, start, end, qk_scale_log2,
                      BLOCK_N, BLOCK_H, s_layout, o_layout)),
         (_producer, (cache_ptr, idx_row, start, end, raw_k, raw_s, idx_ring, kv_bufs, full_bars, empty_bars,
                      BLOCK_N, ROW_BYTES, RING_SLOTS, P_WARPS))],
        [P_WARPS], [P_REGS])
    _write_out(o0, o1, o2, o3, m_i, l_i, out_ptr, lse_ptr, tok, hb, split, heads,
               stride_ot, stride_oh, stride_os, stride_lt, stride_ls, BLOCK_H, s_layout, o_layout)
