"""Warp-specialised, persistent sparse MLA decode for Hopper (SM90), in Gluon.

`hopper_decode.py` runs every phase in the same warps, one after the other: gather, dequantize,
score product, softmax, output product; ncu showed each SM doing one of them at a time. Here
the roles run at once, in partitions that hand tiles over with mbarriers:

- the producer (two warpgroups) gathers rows with cp.async into a ring of 32-row slots and
  dequantizes each 64-row block (fp8 * tile scale -> bf16, rounded as the reference rounds)
  into one of two swizzled tiles. Each slot's copy group also brings the index entries of the
  rows that will refill it, so no index load is ever waited on. With ROPE (576-wide QK: the
  shim, or real RoPE rows) each row's 64 bf16 RoPE lanes come into the ring too and are copied
  as stored into a RoPE tile beside the dequantized one, for a fifth score group
  K_rope Q_rope^T (`hopper_decode`'s); the output product reads the 512 latent lanes only;
- with ROLE_SPLIT, a scorer warpgroup runs S^T = K Q^T and the online softmax, and hands P and
  the per-head rescale factor through a double-buffered P tile to an accumulator warpgroup,
  which runs O^T = alpha O^T + K^T P^T and holds O^T. So the scores of block i+1 overlap the
  output product of block i. Without it one consumer warpgroup runs the three in turn (the H200
  measured the split faster at 16 heads per program, and at 32 from 256 query tokens on; one
  consumer faster at 32 heads and fewer tokens).

With L_PARTIAL (the plan's `l_partial`) the softmax's running sum is kept per thread, one value
per score element, rescaled and added to element by element, and summed across the block's rows
once, after the item's last block: the keys are spread over the warpgroup's four warps, so a sum
per block would cross them through shared memory. The running max still crosses them every
block, since P needs it.

The grid is one-dimensional over work items (query token, head block, split). With ROLE_SPLIT
it is persistent: one program per SM walks items pid, pid + programs, ..., every partition the
same list, so the producer gathers the next item's rows while the consumers finish the last
one. The single consumer takes one item per program. Items have the same number of blocks;
rows past an item's range are masked.

Two mbarriers per tile hand it over: `full` (producer -> consumer: the tile holds the next
block) and `empty` (the output product that read it retired). O^T (512 x heads, fp32) lives in
one warpgroup's registers, so a program takes at most 32 heads. Same output buffers as
`hopper_decode.hopper_decode_kernel`, plus `tokens`.
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

from nopebench.impls.native.cluster import (
    _lanes,
    _partition_barrier,
    _partner_window,
    _send_partner,
)
from nopebench.impls.native.constants import WS_CONST_SPLIT_BLOCK_H, WS_SPLIT_32_DEFAULT_REGS
from nopebench.impls.native.hopper_decode import (
    ROPE_OFFSET,
    TILE,
    _attend,
    _copy_lanes,
    _copy_rows,
    _cp_async,
    _empty_state,
    _issue_output,
    _issue_scores,
    _load_idx,
    _per_tile,
    _softmax_step,
    _stage_q,
    _write_out,
)
from nopebench.impls.native.plans import installed_triton, ws_split_32_regs

NUM_BUF = gl.constexpr(2)  # dequantized tiles (and P tiles): one being written, one being read
CONSUMER_WARPS, PRODUCER_WARPS = 4, 8  # each consumer role is one warpgroup
# setmaxnreg budgets: the producer's dequantization and the scorer's softmax without spilling
# (the compile-only build checks); the accumulator (the default partition) gets the rest.
PRODUCER_REGS, SCORER_REGS = 104, 96
# With RoPE lanes and one consumer, a producer with 104 made Triton 3.9 spill 8 bytes (the
# thread index, kept across the partitions); with 112 it spills nothing, and the consumer keeps
# the most setmaxnreg gives (256).
PRODUCER_ROPE_REGS = 112


def launch_regs(role_split: bool) -> int:
    """Registers per thread at launch: the 64K register file over all the warps (multiple of 8)."""
    warps = CONSUMER_WARPS * (2 if role_split else 1) + PRODUCER_WARPS
    return 65536 // (32 * warps) // 8 * 8


def _budgets(plan) -> tuple[int, int]:
    """The producer's and the scorer's setmaxnreg budgets for a plan."""
    if plan.role_split and plan.block_h == 32:  # (its scorer spills with SCORER_REGS)
        return ws_split_32_regs(plan.rope, installed_triton()) or WS_SPLIT_32_DEFAULT_REGS
    return (PRODUCER_ROPE_REGS if plan.rope and not plan.role_split else PRODUCER_REGS), SCORER_REGS


def launch_constants(plan, row_bytes: int) -> tuple[dict, dict]:
    """The kernel's constexprs and launch options for a `native.plan_hopper_ws` plan: one source
    for the launcher and the compile-only build, so the build checks what runs."""
    p_regs, s_regs = _budgets(plan)
    constants = dict(
        BLOCK_H=plan.block_h,
        BLOCK_N=plan.block_n,
        ROW_BYTES=row_bytes,
        ROPE=plan.rope,
        HEAD_BLOCKS=plan.head_blocks,
        BLOCKS=plan.entries_per_split // plan.block_n,
        RING_SLOTS=plan.num_stages,
        ROLE_SPLIT=plan.role_split,
        C_WARPS=CONSUMER_WARPS,
        P_WARPS=PRODUCER_WARPS,
        P_REGS=p_regs,
        S_REGS=s_regs,
        L_PARTIAL=plan.l_partial,
        # The role split's producer with the split count the constexpr 1 (constants).
        P_ONE_SPLIT=plan.role_split
        and plan.block_h == WS_CONST_SPLIT_BLOCK_H
        and not plan.rope
        and plan.splits == 1,
    )
    return constants, {"num_warps": CONSUMER_WARPS, "maxnreg": launch_regs(plan.role_split)}


@gluon.jit
def _stream(tokens, width, entries_per_split, HEAD_BLOCKS: gl.constexpr, ONE_SPLIT: gl.constexpr):
    """This program's place in the persistent grid: its id, the program count, the split count
    and the number of work items. Each partition computes it (cheaper than passing it).
    ONE_SPLIT makes the count the constexpr 1, so the producer's per-sub-block item arithmetic
    folds away."""
    if ONE_SPLIT:  # noqa: SIM108 (a constexpr if: only the taken branch is compiled)
        splits = 1
    else:
        splits = gl.cdiv(width, entries_per_split)
    return gl.program_id(0), gl.num_programs(0), splits, tokens * HEAD_BLOCKS * splits


@gluon.jit
def _item(item, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS: gl.constexpr):
    """Work item -> query token, head block, split, index row and top-k range [start, end)."""
    split = item % splits
    tok = item // splits // HEAD_BLOCKS
    hb = item // splits % HEAD_BLOCKS
    start = split * entries_per_split
    return (
        tok,
        hb,
        split,
        idx_ptr + tok.to(gl.int64) * stride_it,
        start,
        gl.minimum(start + entries_per_split, width),
    )


@gluon.jit
def blocks_in_use(
    idx_row, start, end, BLOCKS: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr
):
    """The item's BLOCK_N-entry blocks up to the last that holds a valid entry (at least one).
    Top-k rows end in -1 padding (2051 of 2176 entries in GLM-5.3-Flash's buffer), and a block of -1
    entries changes neither O nor the softmax state, so it is skipped. Scans back from the end,
    one dependent 64-entry load per block: two in that buffer, but one per skipped block
    plus one on a short row (24 for 700 of 2176; each skipped block still saves its gathers and
    products). Every warp loads the whole block, so the max needs no shared memory."""
    every_warp: gl.constexpr = gl.BlockedLayout([BLOCK_N // 32], [32], [WARPS], [0])
    n = gl.to_tensor(BLOCKS)
    if BLOCKS > 1:  # (Triton 3.6 fails to compile the loop when its condition is constant false)
        empty = n > 1
        while empty:
            empty = (
                gl.max(
                    _load_idx(idx_row, start + (n - 1) * BLOCK_N, end, BLOCK_N, every_warp), axis=0
                )
                < 0
            )
            n = gl.where(empty, n - 1, n)
            empty = empty & (n > 1)
    return n


@gluon.jit
def _sub_block(
    k,
    stream,
    idx_ptr,
    width,
    entries_per_split,
    stride_it,
    SUB: gl.constexpr,
    SUBS_PER_ITEM: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ONE_ITEM: gl.constexpr,
):
    """The k-th SUB-row sub-block of this program's `stream` (`_stream`'s tuple): its index row,
    first entry and the end of its item's range (0 past the last item, so nothing is gathered).
    ONE_ITEM (one program per item): sub-blocks past the item start past its end, so the run-time
    divisions by the sub-blocks per item are not needed."""
    pid, nprog, splits, items = stream
    if ONE_ITEM:
        _, _, _, idx_row, start, end = _item(
            pid, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS
        )
        first = start + k * SUB
    else:
        item = pid + (k // SUBS_PER_ITEM) * nprog
        _, _, _, idx_row, start, end = _item(
            gl.minimum(item, items - 1),
            idx_ptr,
            width,
            entries_per_split,
            stride_it,
            splits,
            HEAD_BLOCKS,
        )
        first = start + (k % SUBS_PER_ITEM) * SUB
        end = gl.where(item < items, end, 0)
    return idx_row, first, end


@gluon.jit
def _gather_block(
    cache_ptr,
    idx,
    raw_k,
    raw_s,
    raw_r,
    slot,
    idx_row,
    idx_n0,
    end,
    idx_ring,
    ROW_BYTES: gl.constexpr,
    ROPE: gl.constexpr,
    gather: gl.constexpr,
    scales_l: gl.constexpr,
    rope_gather: gl.constexpr,
    idx_l: gl.constexpr,
):
    """One commit group into ring slot `slot`: the rows `idx` names (with ROPE their RoPE lanes
    too), and the index entries from `idx_n0` on, which a later refill of the slot will gather:
    so no index load is waited on."""
    row, valid = _copy_rows(cache_ptr, idx, raw_k, raw_s, slot, ROW_BYTES, gather, scales_l)
    if ROPE:
        _copy_lanes(row, valid, raw_r, slot, ROPE_OFFSET, gl.bfloat16, 64, rope_gather)
    offs = idx_n0 + gl.arange(0, idx_ring.shape[1], layout=idx_l)
    _cp_async(idx_ring.index(slot), idx_row + offs, mask=offs < end)
    cp.commit_group()


@gluon.jit
def _tile_scale(scales, tile_of, t: gl.constexpr, AS_INT: gl.constexpr):
    """Tile t's scale out of each row's four. AS_INT sums them as integers, where adding the
    other three's zeros folds away (float adds of 0.0 do not: 32 FADD a block); it makes Triton
    3.9 spill 8 bytes in the persistent producer at 32 heads, so only one-item programs use it."""
    if AS_INT:
        bits = gl.where(tile_of == t, scales.to(gl.int32, bitcast=True), 0)
        return gl.sum(bits, axis=1).to(gl.float32, bitcast=True)
    else:
        return gl.sum(gl.where(tile_of == t, scales, 0.0), axis=1)


@gluon.jit
def _owned(k, OWN: gl.constexpr, SUBS: gl.constexpr, FIRST: gl.constexpr = 0):
    """The program's sub-block ordinal of a producer's k-th sub-block, when it fills OWN
    sub-blocks of every block of SUBS, from sub-block FIRST on."""
    if OWN == SUBS:
        return k
    else:
        return (k // OWN) * SUBS + FIRST + k % OWN


@gluon.jit
def _refill(
    k,
    slot,
    stream,
    idx_ptr,
    width,
    entries_per_split,
    stride_it,
    cache_ptr,
    raw_k,
    raw_s,
    raw_r,
    idx_ring,
    ROW_BYTES: gl.constexpr,
    ROPE: gl.constexpr,
    SUB: gl.constexpr,
    SUBS: gl.constexpr,
    PER_ITEM: gl.constexpr,
    RING_SLOTS: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ONE_ITEM: gl.constexpr,
    OWN: gl.constexpr,
    FIRST: gl.constexpr,
    gather: gl.constexpr,
    scales_l: gl.constexpr,
    rope_gather: gl.constexpr,
    idx_l: gl.constexpr,
):
    """`_producer`'s refill of ring slot `slot` (its k-th sub-block's) with sub-block
    k + RING_SLOTS, whose index entries it holds, and the index entries of k + 2 RING_SLOTS.
    The layouts are the producer's."""
    rows_g: gl.constexpr = gl.SliceLayout(1, gather)
    # (cp.async zero-fills entries past `end`, so the range mask is applied again here.)
    _, n1, end1 = _sub_block(
        _owned(k + RING_SLOTS, OWN, SUBS, FIRST),
        stream,
        idx_ptr,
        width,
        entries_per_split,
        stride_it,
        SUB,
        PER_ITEM,
        HEAD_BLOCKS,
        ONE_ITEM,
    )
    offs = n1 + gl.arange(0, SUB, layout=rows_g)
    idx = gl.where(offs < end1, idx_ring.index(slot).load(rows_g), -1)
    nrow, nn0, nend = _sub_block(
        _owned(k + 2 * RING_SLOTS, OWN, SUBS, FIRST),
        stream,
        idx_ptr,
        width,
        entries_per_split,
        stride_it,
        SUB,
        PER_ITEM,
        HEAD_BLOCKS,
        ONE_ITEM,
    )
    _gather_block(
        cache_ptr,
        idx,
        raw_k,
        raw_s,
        raw_r,
        slot,
        nrow,
        nn0,
        nend,
        idx_ring,
        ROW_BYTES,
        ROPE,
        gather,
        scales_l,
        rope_gather,
        idx_l,
    )


@gluon.jit
def _producer(
    cache_ptr,
    idx_ptr,
    width,
    entries_per_split,
    stride_it,
    tokens,
    raw_k,
    raw_s,
    raw_r,
    idx_ring,
    kv_bufs,
    rope_bufs,
    full_bars,
    empty_bars,
    BLOCK_N: gl.constexpr,
    BLOCKS: gl.constexpr,
    ROW_BYTES: gl.constexpr,
    ROPE: gl.constexpr,
    RING_SLOTS: gl.constexpr,
    P_WARPS: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ONE_SPLIT: gl.constexpr,
    ONE_ITEM: gl.constexpr,
    OWN: gl.constexpr,
    FIRST: gl.constexpr = 0,
    SEND: gl.constexpr = False,
    partner=0,
    KV_OFF: gl.constexpr = 0,
    KV_STEP: gl.constexpr = 0,
    FULL_OFF: gl.constexpr = 0,
    EARLY_REFILL: gl.constexpr = False,
):
    """Gathers and dequantizes every block of every item into the tile the consumers freed (with
    ROPE, the rows' RoPE lanes into the RoPE tile beside it, bf16 as stored).
    ONE_ITEM: the grid has one program per item, and the item's trailing blocks of -1 entries
    are skipped (`blocks_in_use`; every role of the kernel skips the same ones).
    OWN: the producer fills OWN ring sub-blocks of every block from sub-block FIRST on (all of
    them: BLOCK_N // (4 * P_WARPS)); other warps fill the rest, each arriving on the tile's full
    barrier.
    SEND (NoPE rows, a 2-CTA cluster): once a block's rows are in its tile it also copies them
    into the same rows of CTA `partner`'s tile (`cluster._send_partner`), and its arrive on the
    full barrier expects the partner's half of the block (the partner's copies complete on it).
    KV_OFF + t * KV_STEP is tile t's shared-memory byte offset, FULL_OFF the full barriers'.
    EARLY_REFILL (NoPE rows): each ring slot is refilled as soon as its rows are in registers,
    and the tile is waited for after the block's first loads, so the next rows are in flight
    while the consumers still hold the tile (1-3% faster in the 64-head kernel on the H200; no
    faster at 16-32 heads or with RoPE lanes)."""
    # The ring holds sub-blocks of SUB rows (one pass of the gather layout), so that while one is
    # being dequantized the other RING_SLOTS - 1 stay in flight. Sub-block k's group also brings
    # the index entries of sub-block k + RING_SLOTS, which refills its slot; the stream runs on
    # across items, so the next item's rows are in flight while this one finishes.
    SUB: gl.constexpr = 4 * P_WARPS
    SUBS: gl.constexpr = BLOCK_N // SUB
    PER_ITEM: gl.constexpr = BLOCKS * SUBS
    gather: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [P_WARPS, 1], [1, 0])
    scales_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [P_WARPS, 1], [1, 0])
    # A row's 128 bytes of RoPE lanes: 16 bytes a thread, rows spread as in the gather (so the
    # row addresses need no layout conversion); the ring-to-tile copy uses it too.
    rope_gather: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [P_WARPS, 1], [1, 0])
    idx_l: gl.constexpr = gl.BlockedLayout([1], [32], [P_WARPS], [0])
    # Dequantization: 8 bytes in, one 16-byte store out per thread, a warp's stores spread over
    # all banks of the swizzled tile (the gather layout's 32-byte runs conflict: 5% slower).
    deq: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [P_WARPS, 1], [1, 0])
    deq_scales: gl.constexpr = gl.BlockedLayout(
        [1, 4], [2, 16], [P_WARPS, 1], [1, 0]
    )  # its rows, 4 scales each
    rows_g: gl.constexpr = gl.SliceLayout(1, gather)
    tile_of = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, deq_scales)), 0)
    stream = _stream(tokens, width, entries_per_split, HEAD_BLOCKS, ONE_SPLIT)
    pid, nprog, splits, items = stream
    for j in gl.static_range(RING_SLOTS):
        row, n0, end = _sub_block(
            _owned(j, OWN, SUBS, FIRST),
            stream,
            idx_ptr,
            width,
            entries_per_split,
            stride_it,
            SUB,
            PER_ITEM,
            HEAD_BLOCKS,
            ONE_ITEM,
        )
        nrow, nn0, nend = _sub_block(
            _owned(j + RING_SLOTS, OWN, SUBS, FIRST),
            stream,
            idx_ptr,
            width,
            entries_per_split,
            stride_it,
            SUB,
            PER_ITEM,
            HEAD_BLOCKS,
            ONE_ITEM,
        )
        _gather_block(
            cache_ptr,
            _load_idx(row, n0, end, SUB, rows_g),
            raw_k,
            raw_s,
            raw_r,
            j,
            nrow,
            nn0,
            nend,
            idx_ring,
            ROW_BYTES,
            ROPE,
            gather,
            scales_l,
            rope_gather,
            idx_l,
        )
    bufs: gl.constexpr = kv_bufs[0].shape[0]  # dequantized tiles the consumers cycle through
    if ONE_ITEM:  # (a constexpr if: only the taken branch is compiled)
        item = _item(pid, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS)
        total = blocks_in_use(item[3], item[4], item[5], BLOCKS, BLOCK_N, P_WARPS)
    else:
        total = gl.cdiv(items - pid, nprog) * BLOCKS
    if SEND:  # the partner's shared memory, as an address in the cluster's window
        lanes = _lanes(P_WARPS)
        window = _partner_window(lanes * 0 + partner)
    for g in range(total):
        b = g % bufs
        if not EARLY_REFILL:  # tile b is free (all start free)
            mbarrier.wait(empty_bars.index(b), ((g // bufs) & 1) ^ 1)
        for jj in gl.static_range(OWN):
            k = g * OWN + jj  # this producer's sub-blocks, counted in its ring
            slot = k % RING_SLOTS
            cp.wait_group(
                RING_SLOTS - 1
            )  # sub-block k has landed, with the indices of k + RING_SLOTS
            if ROPE:
                # The RoPE lanes go to the tile as stored (bf16, no conversion), before the
                # dequantization so that their registers are free again for it (copied after
                # it, Triton 3.9 spilled 8 bytes in the producer at 16 heads).
                rope_bufs.index(b).slice((FIRST + jj) * SUB, SUB).store(
                    raw_r.index(slot).load(rope_gather)
                )
            # The slot's loads, then the tile's stores (timed the same as interleaving them).
            scales = raw_s.index(slot).load(deq_scales)
            raw = (
                raw_k[0].index(slot).load(deq),
                raw_k[1].index(slot).load(deq),
                raw_k[2].index(slot).load(deq),
                raw_k[3].index(slot).load(deq),
            )
            if EARLY_REFILL:  # (a constexpr if: only the taken branch is compiled)
                _refill(
                    k,
                    slot,
                    stream,
                    idx_ptr,
                    width,
                    entries_per_split,
                    stride_it,
                    cache_ptr,
                    raw_k,
                    raw_s,
                    raw_r,
                    idx_ring,
                    ROW_BYTES,
                    ROPE,
                    SUB,
                    SUBS,
                    PER_ITEM,
                    RING_SLOTS,
                    HEAD_BLOCKS,
                    ONE_ITEM,
                    OWN,
                    FIRST,
                    gather,
                    scales_l,
                    rope_gather,
                    idx_l,
                )
                if jj == 0:
                    mbarrier.wait(empty_bars.index(b), ((g // bufs) & 1) ^ 1)
            for t in gl.static_range(4):
                scale = gl.convert_layout(
                    _tile_scale(scales, tile_of, t, ONE_ITEM), gl.SliceLayout(1, deq)
                )
                kv = raw[t].to(gl.float8e4nv, bitcast=True).to(gl.float32) * gl.expand_dims(
                    scale, 1
                )
                kv_bufs[t].index(b).slice((FIRST + jj) * SUB, SUB).store(kv.to(gl.bfloat16))
            if not EARLY_REFILL:  # the slot is dequantized: refill it
                _refill(
                    k,
                    slot,
                    stream,
                    idx_ptr,
                    width,
                    entries_per_split,
                    stride_it,
                    cache_ptr,
                    raw_k,
                    raw_s,
                    raw_r,
                    idx_ring,
                    ROW_BYTES,
                    ROPE,
                    SUB,
                    SUBS,
                    PER_ITEM,
                    RING_SLOTS,
                    HEAD_BLOCKS,
                    ONE_ITEM,
                    OWN,
                    FIRST,
                    gather,
                    scales_l,
                    rope_gather,
                    idx_l,
                )
        fence_async_shared()  # generic-proxy stores -> the consumers' wgmma (async proxy)
        if SEND:
            # The block's rows to the same rows of the partner's tile: in each 64-lane half of
            # each of the four 128-lane tiles they are OWN * SUB rows of 128 bytes in a row (the
            # swizzle permutes 16-byte chunks within a row), so eight bulk copies, issued once
            # every producer thread has fenced its stores, take them.
            _partition_barrier()
            _send_partner(
                lanes,
                KV_OFF + b * (BLOCK_N * TILE * 2) + FIRST * (SUB * 128),
                window,
                window + (FULL_OFF + 8 * b),
                OWN * SUB * 128,
                KV_STEP,
                BLOCK_N * 128,
            )
            # The arrive, and the bytes of the partner's half of the block.
            mbarrier.expect(full_bars.index(b), (BLOCK_N // 2) * TILE * 2 * 4)
        else:
            mbarrier.arrive(full_bars.index(b), count=1)
    cp.wait_group(0)


@gluon.jit
def _producer_buffers(
    RING_SLOTS: gl.constexpr,
    SUB: gl.constexpr,
    KV_BUFS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    ROPE: gl.constexpr,
):
    """The shared memory `_producer` works in: the gather ring (fp8 tiles, tile scales and the
    index entries of each slot's next refill, RING_SLOTS slots of SUB rows) and the KV_BUFS
    dequantized bf16 tiles it fills for the consumers' wgmma. With ROPE also the ring's RoPE
    lanes and, beside each tile, a [BLOCK_N, 64] bf16 RoPE tile for the scores (swizzled for
    wgmma); without, those two are placeholders, never touched."""
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    kv_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, TILE], gl.bfloat16)
    raw_k = _per_tile(gl.uint8, [RING_SLOTS, SUB, TILE], plain)
    raw_s = gl.allocate_shared_memory(gl.float32, [RING_SLOTS, SUB, 4], plain)
    idx_ring = gl.allocate_shared_memory(
        gl.int32, [RING_SLOTS, SUB], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )
    kv_bufs = _per_tile(gl.bfloat16, [KV_BUFS, BLOCK_N, TILE], kv_shared)
    if ROPE:
        r_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
        raw_r = gl.allocate_shared_memory(gl.bfloat16, [RING_SLOTS, SUB, 64], r_shared)
        rope_bufs = gl.allocate_shared_memory(gl.bfloat16, [KV_BUFS, BLOCK_N, 64], r_shared)
    else:
        raw_r = raw_s
        rope_bufs = raw_s
    return raw_k, raw_s, raw_r, idx_ring, kv_bufs, rope_bufs


@gluon.jit
def _q_rope_buffer(q_smem, BLOCK_H: gl.constexpr, ROPE: gl.constexpr):
    """Where `_stage_q` puts q's RoPE lanes, swizzled as the B operand (K-major) of the scores'
    RoPE group (with heads on M in the 64-head kernel, its A operand); without ROPE `q_smem`
    stands in, never touched."""
    if ROPE:
        qr_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16)
        return gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], qr_shared)
    else:
        return q_smem


@gluon.jit
def _tile(kv_bufs, b):
    return kv_bufs[0].index(b), kv_bufs[1].index(b), kv_bufs[2].index(b), kv_bufs[3].index(b)


@gluon.jit
def _scores(
    q_smem,
    qr_smem,
    kv_bufs,
    rope_bufs,
    full_bars,
    g,
    BLOCK_N: gl.constexpr,
    BLOCK_H: gl.constexpr,
    ROPE: gl.constexpr,
    s_layout: gl.constexpr,
):
    """Waits for stream block g's tile and returns its scores S^T = K Q^T (+ K_rope Q_rope^T)."""
    b = g % NUM_BUF
    mbarrier.wait(full_bars.index(b), (g // NUM_BUF) & 1)
    s = _issue_scores(
        _tile(kv_bufs, b), q_smem, rope_bufs, qr_smem, b, BLOCK_N, BLOCK_H, ROPE, s_layout
    )
    return warpgroup_mma_wait(num_outstanding=0, deps=(s,))


@gluon.jit
def _consumer(
    q_ptr,
    out_ptr,
    lse_ptr,
    idx_ptr,
    q_smem,
    qr_smem,
    kv_bufs,
    rope_bufs,
    p_smem,
    full_bars,
    empty_bars,
    heads,
    width,
    entries_per_split,
    qk_scale_log2,
    tokens,
    stride_qt,
    stride_qh,
    stride_it,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_ls,
    BLOCK_N: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCKS: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ROPE: gl.constexpr,
    acc_layout: gl.constexpr,
    q_layout: gl.constexpr,
    L_PARTIAL: gl.constexpr,
):
    """One warpgroup, one item (this consumer's grid is one program per item: looping over
    items, the addresses it hoists out of the loop spill at 32 heads): stage q, then per block
    scores, online softmax and output product in turn (the tile goes back after each)."""
    rows_s: gl.constexpr = gl.SliceLayout(1, acc_layout)
    pid, nprog, splits, items = _stream(tokens, width, entries_per_split, HEAD_BLOCKS, False)
    tok, hb, split, idx_row, start, end = _item(
        pid, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS
    )
    _stage_q(q_ptr, q_smem, qr_smem, tok, hb, heads, stride_qt, stride_qh, BLOCK_H, ROPE, q_layout)
    fence_async_shared()
    o0, o1, o2, o3, m_i, l_i = _empty_state(BLOCK_H, acc_layout, acc_layout)
    if L_PARTIAL:
        l_i = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, acc_layout)
    for i in range(BLOCKS):
        valid = _load_idx(idx_row, start + i * BLOCK_N, end, BLOCK_N, rows_s) >= 0
        s = _scores(
            q_smem, qr_smem, kv_bufs, rope_bufs, full_bars, i, BLOCK_N, BLOCK_H, ROPE, acc_layout
        )
        o0, o1, o2, o3, m_i, l_i = _attend(
            s,
            valid,
            _tile(kv_bufs, i % NUM_BUF),
            p_smem.index(0),
            o0,
            o1,
            o2,
            o3,
            m_i,
            l_i,
            qk_scale_log2,
            acc_layout,
            L_PARTIAL,
        )
        mbarrier.arrive(empty_bars.index(i % NUM_BUF), count=1)
    if L_PARTIAL:
        l_i = gl.sum(l_i, axis=0)
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
        acc_layout,
        acc_layout,
    )


@gluon.jit
def _scorer(
    q_ptr,
    idx_ptr,
    q_smem,
    qr_smem,
    kv_bufs,
    rope_bufs,
    p_smem,
    a_smem,
    ml_smem,
    full_bars,
    p_full,
    p_empty,
    fin_bars,
    heads,
    width,
    entries_per_split,
    qk_scale_log2,
    tokens,
    stride_qt,
    stride_qh,
    stride_it,
    BLOCK_N: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCKS: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ROPE: gl.constexpr,
    s_layout: gl.constexpr,
    q_layout: gl.constexpr,
    L_PARTIAL: gl.constexpr,
):
    """ROLE_SPLIT's first consumer, every item: stage q, then per block the scores and online
    softmax; P and the rescale factor go to the accumulator, and the final max and sum too."""
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    pid, nprog, splits, items = _stream(tokens, width, entries_per_split, HEAD_BLOCKS, False)
    for it in range(gl.cdiv(items - pid, nprog)):
        tok, hb, split, idx_row, start, end = _item(
            pid + it * nprog, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS
        )
        _stage_q(
            q_ptr, q_smem, qr_smem, tok, hb, heads, stride_qt, stride_qh, BLOCK_H, ROPE, q_layout
        )
        fence_async_shared()
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, s_layout))
        if L_PARTIAL:
            l_i = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, s_layout)
        else:
            l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(0, s_layout))
        for i in range(BLOCKS):
            g = it * BLOCKS + i
            b = g % NUM_BUF
            valid = _load_idx(idx_row, start + i * BLOCK_N, end, BLOCK_N, rows_s) >= 0
            s = _scores(
                q_smem, qr_smem, kv_bufs, rope_bufs, full_bars, g, BLOCK_N, BLOCK_H, ROPE, s_layout
            )
            p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, qk_scale_log2, PARTIAL=L_PARTIAL)
            mbarrier.wait(
                p_empty.index(b), ((g // NUM_BUF) & 1) ^ 1
            )  # P tile b is free (both start free)
            p_smem.index(b).store(p.to(gl.bfloat16))
            a_smem.index(b).store(alpha)
            fence_async_shared()  # P -> the accumulator's wgmma
            mbarrier.arrive(p_full.index(b), count=1)
        f = it % 2  # the accumulator reads item it's max and sum while this one runs item it + 1
        ml_smem.index(2 * f).store(m_i)
        if L_PARTIAL:
            ml_smem.index(2 * f + 1).store(gl.sum(l_i, axis=0))
        else:
            ml_smem.index(2 * f + 1).store(l_i)
        mbarrier.arrive(fin_bars.index(f), count=1)


@gluon.jit
def _accumulator(
    out_ptr,
    lse_ptr,
    idx_ptr,
    kv_bufs,
    p_smem,
    a_smem,
    ml_smem,
    empty_bars,
    p_full,
    p_empty,
    fin_bars,
    heads,
    width,
    entries_per_split,
    tokens,
    stride_it,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_ls,
    BLOCK_H: gl.constexpr,
    BLOCKS: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    o_layout: gl.constexpr,
):
    """ROLE_SPLIT's second consumer, every item: the output product of each block as the scorer
    hands over its P (then the tile goes back), then normalise and store."""
    pid, nprog, splits, items = _stream(tokens, width, entries_per_split, HEAD_BLOCKS, False)
    for it in range(gl.cdiv(items - pid, nprog)):
        o0, o1, o2, o3, _, _ = _empty_state(BLOCK_H, o_layout, o_layout)
        for i in range(BLOCKS):
            g = it * BLOCKS + i
            b = g % NUM_BUF
            mbarrier.wait(p_full.index(b), (g // NUM_BUF) & 1)
            alpha = a_smem.index(b).load(gl.SliceLayout(0, o_layout))
            o0, o1, o2, o3 = _issue_output(
                _tile(kv_bufs, b), p_smem.index(b), o0, o1, o2, o3, alpha, o_layout
            )
            o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
            mbarrier.arrive(p_empty.index(b), count=1)
            mbarrier.arrive(empty_bars.index(b), count=1)
        f = it % 2
        mbarrier.wait(fin_bars.index(f), (it // 2) & 1)
        m_i = ml_smem.index(2 * f).load(gl.SliceLayout(0, o_layout))
        l_i = ml_smem.index(2 * f + 1).load(gl.SliceLayout(0, o_layout))
        tok, hb, split, _, _, _ = _item(
            pid + it * nprog, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS
        )
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
            o_layout,
            o_layout,
        )


@gluon.jit
def hopper_ws_decode_kernel(
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
    tokens,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    ROW_BYTES: gl.constexpr,
    ROPE: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    BLOCKS: gl.constexpr,
    RING_SLOTS: gl.constexpr,
    ROLE_SPLIT: gl.constexpr,
    C_WARPS: gl.constexpr,
    P_WARPS: gl.constexpr,
    P_REGS: gl.constexpr,
    S_REGS: gl.constexpr,
    L_PARTIAL: gl.constexpr,
    P_ONE_SPLIT: gl.constexpr,
):
    # ROPE: 576-wide QK, the rows' 64 bf16 RoPE lanes at ROPE_OFFSET against q's last 64 (the
    # output still reads the 512 latent lanes only); without it 512-wide NoPE.
    # BLOCKS: BLOCK_N-row blocks per item (entries_per_split / BLOCK_N); C_WARPS: each consumer
    # role's warps (one warpgroup, the kernel's num_warps); P_WARPS, P_REGS, S_REGS: the producer's
    # warps and the producer's and scorer's register budgets (setmaxnreg); RING_SLOTS: ring
    # slots of 4 * P_WARPS rows; L_PARTIAL: the softmax sums per thread (module docstring);
    # P_ONE_SPLIT: the role split's producer takes the split count as the constexpr 1.
    SUB: gl.constexpr = 4 * P_WARPS
    # The wgmma accumulator layout of both products: S^T (BLOCK_N x BLOCK_H) and each 128-row
    # tile of O^T have BLOCK_H columns, so one layout serves scores, P and the output.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[C_WARPS, 1], instr_shape=[16, BLOCK_H, 16]
    )
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [C_WARPS, 1], [1, 0])
    vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, TILE], gl.bfloat16)
    p_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], gl.bfloat16)

    raw_k, raw_s, raw_r, idx_ring, kv_bufs, rope_bufs = _producer_buffers(
        RING_SLOTS, SUB, NUM_BUF, BLOCK_N, ROPE
    )
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [4, BLOCK_H, TILE], q_shared)
    qr_smem = _q_rope_buffer(q_smem, BLOCK_H, ROPE)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, BLOCK_H], p_shared)
    full_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(NUM_BUF):
        mbarrier.init(full_bars.index(b), count=1)
        mbarrier.init(empty_bars.index(b), count=1)
    # (A tuple of the producer's arguments would lose their constexpr-ness, so each branch lists
    # them.) The split count stays a run-time value here except with P_ONE_SPLIT: as a constexpr
    # Triton 3.9 spills 8 bytes at 16 heads.

    if ROLE_SPLIT:
        # The hand-over from scorer to accumulator: P's rescale factor per block, the final max
        # and sum per item (two items' worth), and their barriers.
        a_smem = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_H], vec)
        ml_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_H], vec)
        p_full = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        p_empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        fin_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(NUM_BUF):
            mbarrier.init(p_full.index(b), count=1)
            mbarrier.init(p_empty.index(b), count=1)
            mbarrier.init(fin_bars.index(b), count=1)
        gl.warp_specialize(
            [
                (
                    _accumulator,
                    (
                        out_ptr,
                        lse_ptr,
                        idx_ptr,
                        kv_bufs,
                        p_smem,
                        a_smem,
                        ml_smem,
                        empty_bars,
                        p_full,
                        p_empty,
                        fin_bars,
                        heads,
                        width,
                        entries_per_split,
                        tokens,
                        stride_it,
                        stride_ot,
                        stride_oh,
                        stride_os,
                        stride_lt,
                        stride_ls,
                        BLOCK_H,
                        BLOCKS,
                        HEAD_BLOCKS,
                        acc_layout,
                    ),
                ),
                (
                    _scorer,
                    (
                        q_ptr,
                        idx_ptr,
                        q_smem,
                        qr_smem,
                        kv_bufs,
                        rope_bufs,
                        p_smem,
                        a_smem,
                        ml_smem,
                        full_bars,
                        p_full,
                        p_empty,
                        fin_bars,
                        heads,
                        width,
                        entries_per_split,
                        qk_scale_log2,
                        tokens,
                        stride_qt,
                        stride_qh,
                        stride_it,
                        BLOCK_N,
                        BLOCK_H,
                        BLOCKS,
                        HEAD_BLOCKS,
                        ROPE,
                        acc_layout,
                        q_layout,
                        L_PARTIAL,
                    ),
                ),
                (
                    _producer,
                    (
                        cache_ptr,
                        idx_ptr,
                        width,
                        entries_per_split,
                        stride_it,
                        tokens,
                        raw_k,
                        raw_s,
                        raw_r,
                        idx_ring,
                        kv_bufs,
                        rope_bufs,
                        full_bars,
                        empty_bars,
                        BLOCK_N,
                        BLOCKS,
                        ROW_BYTES,
                        ROPE,
                        RING_SLOTS,
                        P_WARPS,
                        HEAD_BLOCKS,
                        P_ONE_SPLIT,
                        False,
                        BLOCK_N // SUB,
                    ),
                ),
            ],
            [C_WARPS, P_WARPS],
            [S_REGS, P_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (
                        q_ptr,
                        out_ptr,
                        lse_ptr,
                        idx_ptr,
                        q_smem,
                        qr_smem,
                        kv_bufs,
                        rope_bufs,
                        p_smem,
                        full_bars,
                        empty_bars,
                        heads,
                        width,
                        entries_per_split,
                        qk_scale_log2,
                        tokens,
                        stride_qt,
                        stride_qh,
                        stride_it,
                        stride_ot,
                        stride_oh,
                        stride_os,
                        stride_lt,
                        stride_ls,
                        BLOCK_N,
                        BLOCK_H,
                        BLOCKS,
                        HEAD_BLOCKS,
                        ROPE,
                        acc_layout,
                        q_layout,
                        L_PARTIAL,
                    ),
                ),
                (
                    _producer,
                    (
                        cache_ptr,
                        idx_ptr,
                        width,
                        entries_per_split,
                        stride_it,
                        tokens,
                        raw_k,
                        raw_s,
                        raw_r,
                        idx_ring,
                        kv_bufs,
                        rope_bufs,
                        full_bars,
                        empty_bars,
                        BLOCK_N,
                        BLOCKS,
                        ROW_BYTES,
                        ROPE,
                        RING_SLOTS,
                        P_WARPS,
                        HEAD_BLOCKS,
                        False,
                        False,
                        BLOCK_N // SUB,
                    ),
                ),
            ],
            [P_WARPS],
            [P_REGS],
        )
