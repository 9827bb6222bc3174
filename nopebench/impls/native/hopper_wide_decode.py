"""Sparse MLA decode for Hopper (SM90) at 64 heads per program, in Gluon: the output split
across two warpgroups, beside a producer.

At 64 heads the single-role kernel (`hopper_decode.py`) runs gather, dequantization, scores,
softmax and output product one after another in the same warps; its phase probes on the H200
(results/reference/decode-tuning/hopper/probes-h64-t512.log) add up. Here the roles run at once
(the split FlashMLA's SM90 sparse decode uses), in one of two forms:

- the producer (one warpgroup) gathers and dequantizes each block into one of two bf16 tiles
  (`hopper_ws_decode._producer`), with ROPE also each row's RoPE lanes into a RoPE tile beside
  it;
- the scorer (the default partition) runs S = Q K^T for 64 heads x BLOCK_N keys (q's first Q_REGS
  latent tiles from its registers, loaded once, the rest from shared memory) and the online
  softmax, and hands P and the per-head rescale factor to the output warpgroups through shared
  memory;
- with PV_SPLIT (NoPE rows, programs of several blocks) two output warpgroups (`_half`) run
  O[:, :256] and O[:, 256:] = alpha O + P V from the shared P, and each also dequantizes HELPERS
  rows of every block, loaded into registers two blocks ahead while it waits for P; the
  producer fills the rest. Without PV_SPLIT (RoPE rows) the scorer runs the left half itself,
  P from registers, and the producer fills every row;
- the right warpgroup stages q's latent lanes (the scorer its RoPE lanes);
- with PAIR (NoPE rows at 128 heads, `cluster`) the two head blocks of a token run as a 2-CTA
  cluster: each CTA's producer fills half of every block's rows and copies them into the
  partner's tile too, and a tile is refilled once the output halves of both CTAs released it.

Not swapped (heads on the M side, 64 fill a wgmma): each half of O is 64 x 256 fp32, 128
registers a thread, and the softmax reduces within thread quads. With ROPE (576-wide QK) the
scores take a fifth group Q_rope K_rope^T, and blocks are 32 rows (`plans.wide_block_n`).
Shared memory is full (q 64 KB, two tiles 128 KB, the ring, one P tile), and so are the
registers; the H200 record is results/reference/decode-tuning/hopper-wide/. One program per
(query token, head block, split), so every role can skip the same trailing blocks of -1
entries (`blocks_in_use`); same output buffers as `hopper_decode.hopper_decode_kernel`.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from nopebench.impls.native.cluster import _arrive_partner, _cluster_sync, _lanes
from nopebench.impls.native.hopper_decode import (
    SCALE_OFFSET,
    TILE,
    _load_idx,
    _softmax_step,
    _stage_q,
)
from nopebench.impls.native.hopper_ws_decode import (
    _item,
    _producer,
    _producer_buffers,
    _q_rope_buffer,
    _stream,
    _tile_scale,
    blocks_in_use,
)

BLOCK_H = gl.constexpr(64)  # heads per program: one wgmma M
PRODUCER_WARPS = 4  # 16-row ring slots
# setmaxnreg budgets (the compile-only build checks them spill-free); the scorer (the default
# partition) gets the rest of the 64K register file: 248 beside one output warpgroup, 96 (104
# holding q tiles) beside two. A right warpgroup with 152 made ptxas serialise its wgmma
# (Triton 3.6), a producer with 88 made Triton 3.9 spill (Triton 3.6 takes it with two output
# warpgroups, where the plan holds q tiles only under 3.6).
PRODUCER_REGS, RIGHT_REGS = 96, 160


def launch_regs(pv_split: bool) -> int:
    """Registers per thread at launch: the 64K register file over all the warps (multiple of 8);
    with `pv_split` a fourth warpgroup runs the left half of the output product."""
    return 65536 // (32 * (12 if pv_split else 8) + 32 * PRODUCER_WARPS) // 8 * 8


LAUNCH_REGS = launch_regs(False)


# The shared allocations a 2-CTA (`plan.pair`) program addresses in its partner, by the kernel's
# variable names (`cluster.smem_offsets`): the four dequantized tiles, the full and empty barriers.
PAIR_ALLOCATIONS = ("kv_bufs", "full_bars", "empty_bars")


def pair_offsets(offsets: dict[str, list[int]]) -> dict:
    """The kernel's constexprs for `smem_offsets(compiled, PAIR_ALLOCATIONS)`: tile t at
    KV_OFF + t * KV_STEP (ValueError if Triton placed the four tiles otherwise)."""
    tiles = offsets["kv_bufs"]
    step = tiles[1] - tiles[0] if len(tiles) == 4 else 0
    if step <= 0 or any(b - a != step for a, b in zip(tiles, tiles[1:], strict=False)):
        raise ValueError(f"the four tiles are not equally spaced in shared memory: {tiles}")
    (full,), (empty,) = offsets["full_bars"], offsets["empty_bars"]
    return dict(KV_OFF=tiles[0], KV_STEP=step, FULL_OFF=full, EMPTY_OFF=empty)


PLACEHOLDER_OFFSETS = dict(KV_OFF=0, KV_STEP=0, FULL_OFF=0, EMPTY_OFF=0)


def launch_constants(plan, row_bytes: int, offsets: dict | None = None) -> tuple[dict, dict]:
    """Constexprs and launch options for a `native.plan_hopper_wide` plan (launcher and build).
    `offsets`: `pair_offsets` of the compiled kernel, for a 2-CTA plan (placeholders otherwise;
    they change no allocation, so a build with them has the launched kernel's layout)."""
    constants = dict(
        BLOCK_N=plan.block_n,
        ROW_BYTES=row_bytes,
        ROPE=plan.rope,
        HEAD_BLOCKS=plan.head_blocks,
        ONE_SPLIT=plan.splits == 1,
        BLOCKS=plan.entries_per_split // plan.block_n,
        KV_BUFS=plan.kv_bufs,
        P_BUFS=plan.p_bufs,
        RING_SLOTS=plan.num_stages,
        P_WARPS=PRODUCER_WARPS,
        # With both halves on their own warpgroups the scorer gets 512 - 2 * 160 - P_REGS: 8
        # more from the producer when it holds q tiles in registers.
        P_REGS=PRODUCER_REGS - 8 if plan.pv_split and plan.q_regs else PRODUCER_REGS,
        R_REGS=RIGHT_REGS,
        Q_REGS=plan.q_regs,
        PV_SPLIT=plan.pv_split,
        HELPERS=plan.helpers,  # rows of every block each output warpgroup dequantizes
        PAIR=plan.pair,
        **(offsets or PLACEHOLDER_OFFSETS),
    )
    return constants, {"num_warps": 4, "maxnreg": launch_regs(plan.pv_split)}


@gluon.jit
def _load_rows(
    cache_ptr,
    idx_row,
    n0,
    end,
    ROW_BYTES: gl.constexpr,
    SUB: gl.constexpr,
    words: gl.constexpr,
    deq_scales: gl.constexpr,
):
    """Loads the SUB rows that entries n0.. name straight into registers, in the layout they are
    dequantized in: each row's four 128-byte fp8 tiles as int32 words (four e4m3 values each, 8
    bytes a thread a tile, so they stay packed in registers while in flight) and its four fp32
    scales, cached in L2 only. Rows whose entry is -1 or past `end` are not read; they come back
    as zeros, scales included, so they dequantize to zero."""
    idx = _load_idx(idx_row, n0, end, SUB, gl.SliceLayout(1, words))
    valid = idx >= 0
    row = cache_ptr + gl.where(valid, idx, 0).to(gl.int64) * ROW_BYTES
    cols = gl.arange(0, TILE // 4, layout=gl.SliceLayout(0, words))
    mask = gl.expand_dims(valid, 1) & gl.expand_dims(cols >= 0, 0)
    ptrs = gl.expand_dims(row.to(gl.pointer_type(gl.int32)), 1) + gl.expand_dims(cols, 0)
    k0 = gl.load(ptrs, mask=mask, other=0, cache_modifier=".cg")
    k1 = gl.load(ptrs + TILE // 4, mask=mask, other=0, cache_modifier=".cg")
    k2 = gl.load(ptrs + 2 * (TILE // 4), mask=mask, other=0, cache_modifier=".cg")
    k3 = gl.load(ptrs + 3 * (TILE // 4), mask=mask, other=0, cache_modifier=".cg")
    srow = gl.convert_layout(row, gl.SliceLayout(1, deq_scales))
    svalid = gl.convert_layout(valid, gl.SliceLayout(1, deq_scales))
    lanes = gl.arange(0, 4, layout=gl.SliceLayout(0, deq_scales))
    sptrs = gl.expand_dims((srow + SCALE_OFFSET).to(gl.pointer_type(gl.float32)), 1)
    smask = gl.expand_dims(svalid, 1) & gl.expand_dims(lanes >= 0, 0)
    scales = gl.load(sptrs + gl.expand_dims(lanes, 0), mask=smask, other=0.0, cache_modifier=".cg")
    return k0, k1, k2, k3, scales


@gluon.jit
def _dequantize_words(w, scale):
    """Each int32 of `w` holds four e4m3 values: each times `scale`, rounded to bf16 as the
    reference rounds (e4m3 -> f16 -> fp32 are exact, then one fp32 product, then bf16), returned
    as four bf16 tensors (values 0, 1, 2, 3 of each word)."""
    return gl.inline_asm_elementwise(
        """
        {
        .reg .b16 lo, hi, a, b, c, d;
        .reg .b32 p, q, r, s;
        .reg .f32 fa, fb, fc, fd;
        mov.b32 {lo, hi}, $4;
        cvt.rn.f16x2.e4m3x2 p, lo;
        cvt.rn.f16x2.e4m3x2 q, hi;
        mov.b32 {a, b}, p;
        mov.b32 {c, d}, q;
        cvt.f32.f16 fa, a;
        cvt.f32.f16 fb, b;
        cvt.f32.f16 fc, c;
        cvt.f32.f16 fd, d;
        mul.rn.f32 fa, fa, $5;
        mul.rn.f32 fb, fb, $5;
        mul.rn.f32 fc, fc, $5;
        mul.rn.f32 fd, fd, $5;
        cvt.rn.bf16x2.f32 r, fb, fa;
        cvt.rn.bf16x2.f32 s, fd, fc;
        mov.b32 {$0, $1}, r;
        mov.b32 {$2, $3}, s;
        }
        """,
        "=h,=h,=h,=h,r,f",
        [w, scale],
        dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _store_rows(
    rows, kv_bufs, b, row0, SUB: gl.constexpr, words: gl.constexpr, deq_scales: gl.constexpr
):
    """Dequantizes `_load_rows`' registers into rows row0.. of tile b: 16 bytes a thread a row
    a tile, one store."""
    tile_of = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, deq_scales)), 0)
    for t in gl.static_range(4):
        scale = gl.convert_layout(_tile_scale(rows[4], tile_of, t, True), gl.SliceLayout(1, words))
        v0, v1, v2, v3 = _dequantize_words(rows[t], gl.expand_dims(scale, 1))
        # (value j of word i goes to lane 4 i + j)
        vals = gl.reshape(gl.join(gl.join(v0, v2), gl.join(v1, v3)), [SUB, TILE])
        kv_bufs[t].index(b).slice(row0, SUB).store(vals)


@gluon.jit
def _block_scores(
    q_smem,
    qa,
    qr_smem,
    kv_bufs,
    rope_bufs,
    full_bars,
    i,
    BLOCK_N: gl.constexpr,
    ROPE: gl.constexpr,
    s_layout: gl.constexpr,
    Q_REGS: gl.constexpr,
    FENCE: gl.constexpr = False,
):
    """Waits for block i's tile and issues S = Q K^T over the four 128-wide tiles (+ Q_rope
    K_rope^T over the RoPE tile, as `hopper_decode`'s fifth group): four (five) async wgmma
    groups, accumulated in fp32 in that order. q's first Q_REGS tiles come from the registers
    in `qa`, the rest from `q_smem`."""
    bufs: gl.constexpr = kv_bufs[0].shape[0]
    b = i % bufs
    mbarrier.wait(full_bars.index(b), (i // bufs) & 1)
    if FENCE:
        fence_async_shared()
    s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    for t in gl.static_range(4):
        if t < Q_REGS:
            s = warpgroup_mma(qa[t], kv_bufs[t].index(b).permute((1, 0)), s, is_async=True)
        else:
            s = warpgroup_mma(
                q_smem.index(t), kv_bufs[t].index(b).permute((1, 0)), s, is_async=True
            )
    if ROPE:
        s = warpgroup_mma(qr_smem, rope_bufs.index(b).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _hand_over(p, alpha, p_smem, a_smem, p_full, p_empty, i):
    """P (bf16) and the rescale factor of block i to the right warpgroup, into the P buffer it
    has finished with. Returns P for this warpgroup's own product."""
    p16 = p.to(gl.bfloat16)
    bufs: gl.constexpr = p_smem.shape[0]
    b = i % bufs
    mbarrier.wait(p_empty.index(b), ((i // bufs) & 1) ^ 1)  # all start free
    p_smem.index(b).store(p16)
    a_smem.index(b).store(alpha)
    fence_async_shared()
    mbarrier.arrive(p_full.index(b), count=1)
    return p16


@gluon.jit
def _half_product(p, kv_bufs, b, oa, ob, alpha, HALF: gl.constexpr, o_layout: gl.constexpr):
    """O[:, half] = alpha O[:, half] + P V[:, half]: two async wgmma over 128-wide tiles."""
    a_o = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    # Both rescaled before either product is issued: rescaling one between the two issues made
    # ptxas insert a wgmma wait there (its message C7517).
    oa = oa * a_o
    ob = ob * a_o
    oa = warpgroup_mma(p, kv_bufs[2 * HALF].index(b), oa, is_async=True)
    ob = warpgroup_mma(p, kv_bufs[2 * HALF + 1].index(b), ob, is_async=True)
    return oa, ob


@gluon.jit
def _store_half(
    oa,
    ob,
    inv,
    out_ptr,
    tok,
    hb,
    split,
    heads,
    stride_ot,
    stride_oh,
    stride_os,
    HALF: gl.constexpr,
    o_layout: gl.constexpr,
):
    """Normalise one half of O by the softmax denominator and store it."""
    inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(1, o_layout)), 1)
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, TILE, layout=gl.SliceLayout(0, o_layout))
    base = out_ptr + split.to(gl.int64) * stride_os + tok.to(gl.int64) * stride_ot + 2 * HALF * TILE
    ptrs = base + gl.expand_dims(offs_h, 1) * stride_oh + gl.expand_dims(cols, 0)
    mask = gl.expand_dims(offs_h < heads, 1) & gl.expand_dims(cols >= 0, 0)
    ty = out_ptr.dtype.element_ty
    gl.store(ptrs, (oa * inv_o).to(ty), mask=mask)
    gl.store(ptrs + TILE, (ob * inv_o).to(ty), mask=mask)


@gluon.jit
def _block_valid(idx_row, start, end, i, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Which of block i's keys have an index entry (not -1, not past `end`), in the score layout.
    The entries are loaded one or two per thread and then spread to that layout: loaded straight
    into it, 16 per thread, their addresses stay live across the loop and Triton 3.9 spills
    them."""
    idx_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return gl.convert_layout(
        _load_idx(idx_row, start + i * BLOCK_N, end, BLOCK_N, idx_l) >= 0,
        gl.SliceLayout(0, s_layout),
    )


@gluon.jit
def _score_block(
    q_smem,
    qa,
    qr_smem,
    kv_bufs,
    rope_bufs,
    p_smem,
    a_smem,
    full_bars,
    p_full,
    p_empty,
    idx_row,
    start,
    end,
    m_i,
    l_i,
    i,
    qk_scale_log2,
    BLOCK_N: gl.constexpr,
    ROPE: gl.constexpr,
    s_layout: gl.constexpr,
    Q_REGS: gl.constexpr,
    FENCE: gl.constexpr = False,
):
    """Block i's scores (once its tile is full), the online softmax step over its keys with an
    index entry, and P with the rescale factor handed over; returns P (bf16), the factor and
    the softmax state. The index entries are loaded before the wait for the tile, or with ROPE
    while the score product runs: on the H200 that was 1.5-3% faster for RoPE rows at 64-128
    heads, 2.5-6% slower for NoPE rows with the output split off (there they load while the
    scorer waits for its tile anyway)."""
    if not ROPE:
        valid = _block_valid(idx_row, start, end, i, BLOCK_N, s_layout)
    s = _block_scores(
        q_smem,
        qa,
        qr_smem,
        kv_bufs,
        rope_bufs,
        full_bars,
        i,
        BLOCK_N,
        ROPE,
        s_layout,
        Q_REGS,
        FENCE,
    )
    if ROPE:
        valid = _block_valid(idx_row, start, end, i, BLOCK_N, s_layout)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, qk_scale_log2, KEYS=1)
    p16 = _hand_over(p, alpha, p_smem, a_smem, p_full, p_empty, i)
    return p16, alpha, m_i, l_i


@gluon.jit
def _scores_and_left(
    q_smem,
    qa,
    qr_smem,
    kv_bufs,
    rope_bufs,
    p_smem,
    a_smem,
    full_bars,
    empty_bars,
    p_full,
    p_empty,
    m_i,
    l_i,
    idx_row,
    start,
    end,
    blocks,
    qk_scale_log2,
    BLOCK_N: gl.constexpr,
    ROPE: gl.constexpr,
    s_layout: gl.constexpr,
    o_layout: gl.constexpr,
    Q_REGS: gl.constexpr,
):
    """The scorer's loop when it also runs the left half of O: returns that half and the
    softmax state."""
    bufs: gl.constexpr = kv_bufs[0].shape[0]
    p_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    oa = gl.zeros([BLOCK_H, TILE], gl.float32, o_layout)
    ob = gl.zeros([BLOCK_H, TILE], gl.float32, o_layout)
    # The producer can refill a tile only once both halves of the output product have read it,
    # so block i - 1's left product is waited for (and its tile given back) before block i's
    # scores are issued: faster on the H200 than waiting for both halves together. (Issuing
    # block i + 1's scores before block i's softmax measured slower: the per-block waits
    # dominate.)
    p16, alpha, m_i, l_i = _score_block(
        q_smem,
        qa,
        qr_smem,
        kv_bufs,
        rope_bufs,
        p_smem,
        a_smem,
        full_bars,
        p_full,
        p_empty,
        idx_row,
        start,
        end,
        m_i,
        l_i,
        0,
        qk_scale_log2,
        BLOCK_N,
        ROPE,
        s_layout,
        Q_REGS,
    )
    for i in range(1, blocks):
        prev = (i - 1) % bufs
        oa, ob = _half_product(
            gl.convert_layout(p16, p_regs), kv_bufs, prev, oa, ob, alpha, 0, o_layout
        )
        oa, ob = warpgroup_mma_wait(num_outstanding=0, deps=(oa, ob))
        mbarrier.arrive(empty_bars.index(prev), count=1)
        p16, alpha, m_i, l_i = _score_block(
            q_smem,
            qa,
            qr_smem,
            kv_bufs,
            rope_bufs,
            p_smem,
            a_smem,
            full_bars,
            p_full,
            p_empty,
            idx_row,
            start,
            end,
            m_i,
            l_i,
            i,
            qk_scale_log2,
            BLOCK_N,
            ROPE,
            s_layout,
            Q_REGS,
        )
    last = (blocks - 1) % bufs
    oa, ob = _half_product(
        gl.convert_layout(p16, p_regs), kv_bufs, last, oa, ob, alpha, 0, o_layout
    )
    oa, ob = warpgroup_mma_wait(num_outstanding=0, deps=(oa, ob))
    mbarrier.arrive(empty_bars.index(last), count=1)

    return oa, ob, m_i, l_i


@gluon.jit
def _scorer(
    q_ptr,
    out_ptr,
    lse_ptr,
    idx_ptr,
    q_smem,
    qr_smem,
    kv_bufs,
    rope_bufs,
    p_smem,
    a_smem,
    inv_smem,
    full_bars,
    empty_bars,
    p_full,
    p_empty,
    fin_bar,
    q_bar,
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
    BLOCKS: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ONE_SPLIT: gl.constexpr,
    ROPE: gl.constexpr,
    s_layout: gl.constexpr,
    o_layout: gl.constexpr,
    q_layout: gl.constexpr,
    Q_REGS: gl.constexpr,
    OWN_PV: gl.constexpr,
    PAIR: gl.constexpr,
):
    """Scores, online softmax and (OWN_PV) the left half of O; with ROPE it stages q's RoPE
    lanes. Without OWN_PV a warpgroup of its own runs the left half (`_half`), as the right.
    PAIR: one CTA of a 2-CTA cluster (`cluster`); it joins the cluster's first and last
    barriers."""
    if PAIR:
        _cluster_sync(4)
    pid, nprog, splits, items = _stream(tokens, width, entries_per_split, HEAD_BLOCKS, ONE_SPLIT)
    tok, hb, split, idx_row, start, end = _item(
        pid, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS
    )
    blocks = blocks_in_use(idx_row, start, end, BLOCKS, BLOCK_N, 4)
    if ROPE:
        # Here rather than with the rest of q in the right warpgroup: staged there, Triton 3.9
        # spilled 16 bytes of the producer's addresses (the two share a prologue).
        _stage_q(
            q_ptr,
            q_smem,
            qr_smem,
            tok,
            hb,
            heads,
            stride_qt,
            stride_qh,
            BLOCK_H,
            True,
            q_layout,
            LATENT=False,
        )
        fence_async_shared()  # generic-proxy stores -> this warpgroup's wgmma
    mbarrier.wait(q_bar, 0)  # the right warpgroup staged q's latent lanes
    # q's first Q_REGS tiles as the score product's A operand from registers: each block's
    # wgmma then reads only the tile from shared memory for them (plans.wide_q_reg_tiles).
    q_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    if Q_REGS == 1:
        qa = (q_smem.index(0).load(q_op),)
    elif Q_REGS == 2:
        qa = (q_smem.index(0).load(q_op), q_smem.index(1).load(q_op))
    elif Q_REGS == 3:
        qa = (q_smem.index(0).load(q_op), q_smem.index(1).load(q_op), q_smem.index(2).load(q_op))
    else:
        qa = q_smem
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))

    if OWN_PV:
        oa, ob, m_i, l_i = _scores_and_left(
            q_smem,
            qa,
            qr_smem,
            kv_bufs,
            rope_bufs,
            p_smem,
            a_smem,
            full_bars,
            empty_bars,
            p_full,
            p_empty,
            m_i,
            l_i,
            idx_row,
            start,
            end,
            blocks,
            qk_scale_log2,
            BLOCK_N,
            ROPE,
            s_layout,
            o_layout,
            Q_REGS,
        )
    else:
        # Scores and softmax only: block i + 1's scores are issued as soon as block i's P is
        # handed over, while the two output warpgroups run block i's product.
        for i in range(blocks):
            _, _, m_i, l_i = _score_block(
                q_smem,
                qa,
                qr_smem,
                kv_bufs,
                rope_bufs,
                p_smem,
                a_smem,
                full_bars,
                p_full,
                p_empty,
                idx_row,
                start,
                end,
                m_i,
                l_i,
                i,
                qk_scale_log2,
                BLOCK_N,
                ROPE,
                s_layout,
                Q_REGS,
                PAIR,
            )

    has = l_i > 0
    inv = gl.where(has, 1.0 / gl.where(has, l_i, 1.0), 0.0)
    inv_smem.store(inv)
    mbarrier.arrive(fin_bar, count=1)
    if OWN_PV:
        _store_half(
            oa,
            ob,
            inv,
            out_ptr,
            tok,
            hb,
            split,
            heads,
            stride_ot,
            stride_oh,
            stride_os,
            0,
            o_layout,
        )
    lse = gl.where(
        has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf")
    )
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    gl.store(
        lse_ptr + split.to(gl.int64) * stride_ls + tok.to(gl.int64) * stride_lt + offs_h,
        lse,
        mask=offs_h < heads,
    )
    if PAIR:
        _cluster_sync(4)


@gluon.jit
def _half(
    q_ptr,
    out_ptr,
    idx_ptr,
    q_smem,
    kv_bufs,
    p_smem,
    a_smem,
    inv_smem,
    empty_bars,
    p_full,
    p_empty,
    fin_bar,
    q_bar,
    heads,
    width,
    entries_per_split,
    tokens,
    stride_qt,
    stride_qh,
    stride_it,
    stride_ot,
    stride_oh,
    stride_os,
    cache_ptr,
    full_bars,
    BLOCKS: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ONE_SPLIT: gl.constexpr,
    o_layout: gl.constexpr,
    q_layout: gl.constexpr,
    BLOCK_N: gl.constexpr,
    ROW_BYTES: gl.constexpr,
    HALF: gl.constexpr,
    HELP: gl.constexpr,
    PAIR: gl.constexpr,
    EMPTY_OFF: gl.constexpr,
):
    """One half of O (HALF 1: the right, 0: the left) from the P the scorer shares; the tile
    goes back after each block. The right warpgroup first stages q's latent lanes for the scorer
    (which keeps its registers for the loop). With HELP > 0 it also dequantizes HELP rows of
    every block into the tiles (`_load_rows`, `_store_rows`) and arrives on their full
    barriers beside the producer.
    PAIR: one CTA of a 2-CTA cluster, whose producers fill both CTAs' tiles; each released tile
    is released in the partner too (its empty barrier at byte offset EMPTY_OFF), except the last
    KV_BUFS, which no producer refills. (It dequantizes no rows: HELP is 0.)"""
    if PAIR:
        _cluster_sync(4)
        lanes = _lanes(4)
    pid, nprog, splits, items = _stream(tokens, width, entries_per_split, HEAD_BLOCKS, ONE_SPLIT)
    tok, hb, split, idx_row, start, end = _item(
        pid, idx_ptr, width, entries_per_split, stride_it, splits, HEAD_BLOCKS
    )
    if HALF == 1:
        _stage_q(
            q_ptr, q_smem, q_smem, tok, hb, heads, stride_qt, stride_qh, BLOCK_H, False, q_layout
        )
        fence_async_shared()  # generic-proxy stores -> the scorer's wgmma
        mbarrier.arrive(q_bar, count=1)
    blocks = blocks_in_use(idx_row, start, end, BLOCKS, kv_bufs[0].shape[1], 4)
    oa = gl.zeros([BLOCK_H, TILE], gl.float32, o_layout)
    ob = gl.zeros([BLOCK_H, TILE], gl.float32, o_layout)
    bufs: gl.constexpr = kv_bufs[0].shape[0]
    p_bufs: gl.constexpr = p_smem.shape[0]
    if HELP > 0:
        # This warpgroup also dequantizes HELP rows of every block (rows row0.., the producer the
        # rest), loaded straight into registers two blocks ahead: while it waits for P and runs
        # its product they are in flight, and the tile they go to is the one just released.
        words: gl.constexpr = gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0])
        deq_scales: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
        row0: gl.constexpr = BLOCK_N - (2 - HALF) * HELP
        for b0 in gl.static_range(bufs):  # the first blocks' rows: every tile starts free
            rows = _load_rows(
                cache_ptr,
                idx_row,
                start + b0 * BLOCK_N + row0,
                end,
                ROW_BYTES,
                HELP,
                words,
                deq_scales,
            )
            _store_rows(rows, kv_bufs, b0, row0, HELP, words, deq_scales)
            fence_async_shared()
            mbarrier.arrive(full_bars.index(b0), count=1)
    for i in range(blocks):
        pb = i % p_bufs
        if HELP > 0:
            ahead = _load_rows(
                cache_ptr,
                idx_row,
                start + (i + bufs) * BLOCK_N + row0,
                end,
                ROW_BYTES,
                HELP,
                words,
                deq_scales,
            )
        mbarrier.wait(p_full.index(pb), (i // p_bufs) & 1)
        alpha = a_smem.index(pb).load(gl.SliceLayout(1, o_layout))
        oa, ob = _half_product(p_smem.index(pb), kv_bufs, i % bufs, oa, ob, alpha, HALF, o_layout)
        oa, ob = warpgroup_mma_wait(num_outstanding=0, deps=(oa, ob))
        mbarrier.arrive(p_empty.index(pb), count=1)
        mbarrier.arrive(empty_bars.index(i % bufs), count=1)
        if PAIR:  # noqa: SIM102 (a constexpr if: only the taken branch is compiled)
            if i + bufs < blocks:
                _arrive_partner(lanes, EMPTY_OFF + 8 * (i % bufs), 1 - pid % 2)
        if HELP > 0 and i + bufs < blocks:  # block i + bufs's rows, once the tile is free
            mbarrier.wait(empty_bars.index(i % bufs), (i // bufs) & 1)
            _store_rows(ahead, kv_bufs, i % bufs, row0, HELP, words, deq_scales)
            fence_async_shared()
            mbarrier.arrive(full_bars.index(i % bufs), count=1)
    mbarrier.wait(fin_bar, 0)
    inv = inv_smem.load(gl.SliceLayout(1, o_layout))
    _store_half(
        oa, ob, inv, out_ptr, tok, hb, split, heads, stride_ot, stride_oh, stride_os, HALF, o_layout
    )
    if PAIR:
        _cluster_sync(4)


@gluon.jit
def _wide_producer(
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
    OWN: gl.constexpr,
    PAIR: gl.constexpr,
    KV_OFF: gl.constexpr,
    KV_STEP: gl.constexpr,
    FULL_OFF: gl.constexpr,
):
    """`hopper_ws_decode._producer` for one program (OWN sub-blocks of every block). PAIR: the
    program is CTA pid % 2 of a 2-CTA cluster; it fills half of every block's rows (CTA 0 the
    first half) and sends them to the partner, which sends it the other half."""
    if PAIR:
        _cluster_sync(P_WARPS)
        half: gl.constexpr = BLOCK_N // (8 * P_WARPS)  # sub-blocks in half a block
        # One call per rank: the rows a rank fills are a constexpr (shared-memory slices take
        # constexpr starts).
        if gl.program_id(0) % 2 == 0:
            _producer(
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
                ONE_SPLIT,
                True,
                half,
                0,
                PAIR,
                1,
                KV_OFF,
                KV_STEP,
                FULL_OFF,
                EARLY_REFILL=not ROPE,
            )
        else:
            _producer(
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
                ONE_SPLIT,
                True,
                half,
                half,
                PAIR,
                0,
                KV_OFF,
                KV_STEP,
                FULL_OFF,
                EARLY_REFILL=not ROPE,
            )
        _cluster_sync(P_WARPS)
    else:
        _producer(
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
            ONE_SPLIT,
            True,
            OWN,
            EARLY_REFILL=not ROPE,
        )


@gluon.jit
def hopper_wide_decode_kernel(
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
    BLOCK_N: gl.constexpr,
    ROW_BYTES: gl.constexpr,
    ROPE: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    ONE_SPLIT: gl.constexpr,
    BLOCKS: gl.constexpr,
    KV_BUFS: gl.constexpr,
    P_BUFS: gl.constexpr,
    RING_SLOTS: gl.constexpr,
    P_WARPS: gl.constexpr,
    P_REGS: gl.constexpr,
    R_REGS: gl.constexpr,
    Q_REGS: gl.constexpr,
    PV_SPLIT: gl.constexpr,
    HELPERS: gl.constexpr,
    PAIR: gl.constexpr,
    KV_OFF: gl.constexpr,
    KV_STEP: gl.constexpr,
    FULL_OFF: gl.constexpr,
    EMPTY_OFF: gl.constexpr,
):
    # ROPE: 576-wide QK (the rows' RoPE lanes against q's last 64; the output reads the 512
    # latent lanes only), else 512-wide NoPE.
    # BLOCKS: BLOCK_N-row blocks per program (entries_per_split / BLOCK_N); KV_BUFS: dequantized
    # tiles; P_BUFS: P tiles handed to the right warpgroup; RING_SLOTS: producer
    # ring slots of 4 * P_WARPS rows; P_REGS, R_REGS: the producer's and right warpgroup's
    # register budgets (setmaxnreg); Q_REGS: q's latent tiles the scorer holds in registers.
    SUB: gl.constexpr = 4 * P_WARPS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE, 16]
    )
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, TILE], gl.bfloat16)
    p_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)

    raw_k, raw_s, raw_r, idx_ring, kv_bufs, rope_bufs = _producer_buffers(
        RING_SLOTS, SUB, KV_BUFS, BLOCK_N, ROPE
    )
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [4, BLOCK_H, TILE], q_shared)
    qr_smem = _q_rope_buffer(q_smem, BLOCK_H, ROPE)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [P_BUFS, BLOCK_H, BLOCK_N], p_shared)
    a_smem = gl.allocate_shared_memory(gl.float32, [P_BUFS, BLOCK_H], vec)
    inv_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec)
    full_bars = gl.allocate_shared_memory(gl.int64, [KV_BUFS, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [KV_BUFS, 1], mbarrier.MBarrierLayout())
    p_full = gl.allocate_shared_memory(gl.int64, [P_BUFS, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [P_BUFS, 1], mbarrier.MBarrierLayout())
    fin_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    # With HELPERS both output warpgroups dequantize HELP rows of every block beside the producer.
    HELP: gl.constexpr = HELPERS
    for b in gl.static_range(KV_BUFS):
        mbarrier.init(full_bars.index(b), count=3 if HELPERS else 1)
        # Both output halves read the tile (PAIR: those of both CTAs, as both CTAs' producers
        # write into it).
        mbarrier.init(empty_bars.index(b), count=4 if PAIR else 2)
    for b in gl.static_range(P_BUFS):
        mbarrier.init(p_full.index(b), count=1)
        mbarrier.init(p_empty.index(b), count=2 if PV_SPLIT else 1)  # the warpgroups P is for
    mbarrier.init(fin_bar, count=1)
    mbarrier.init(q_bar, count=1)

    # (Tuples of the partitions' arguments would lose their constexpr-ness, so each branch
    # lists them. The producer fills the ring sub-blocks the output warpgroups leave, HELP
    # rows each.)
    if PV_SPLIT:
        gl.warp_specialize(
            [
                (
                    _scorer,
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
                        a_smem,
                        inv_smem,
                        full_bars,
                        empty_bars,
                        p_full,
                        p_empty,
                        fin_bar,
                        q_bar,
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
                        BLOCKS,
                        HEAD_BLOCKS,
                        ONE_SPLIT,
                        ROPE,
                        s_layout,
                        o_layout,
                        q_layout,
                        Q_REGS,
                        not PV_SPLIT,
                        PAIR,
                    ),
                ),
                (
                    _half,
                    (
                        q_ptr,
                        out_ptr,
                        idx_ptr,
                        q_smem,
                        kv_bufs,
                        p_smem,
                        a_smem,
                        inv_smem,
                        empty_bars,
                        p_full,
                        p_empty,
                        fin_bar,
                        q_bar,
                        heads,
                        width,
                        entries_per_split,
                        tokens,
                        stride_qt,
                        stride_qh,
                        stride_it,
                        stride_ot,
                        stride_oh,
                        stride_os,
                        cache_ptr,
                        full_bars,
                        BLOCKS,
                        HEAD_BLOCKS,
                        ONE_SPLIT,
                        o_layout,
                        q_layout,
                        BLOCK_N,
                        ROW_BYTES,
                        1,
                        HELP,
                        PAIR,
                        EMPTY_OFF,
                    ),
                ),
                (
                    _half,
                    (
                        q_ptr,
                        out_ptr,
                        idx_ptr,
                        q_smem,
                        kv_bufs,
                        p_smem,
                        a_smem,
                        inv_smem,
                        empty_bars,
                        p_full,
                        p_empty,
                        fin_bar,
                        q_bar,
                        heads,
                        width,
                        entries_per_split,
                        tokens,
                        stride_qt,
                        stride_qh,
                        stride_it,
                        stride_ot,
                        stride_oh,
                        stride_os,
                        cache_ptr,
                        full_bars,
                        BLOCKS,
                        HEAD_BLOCKS,
                        ONE_SPLIT,
                        o_layout,
                        q_layout,
                        BLOCK_N,
                        ROW_BYTES,
                        0,
                        HELP,
                        PAIR,
                        EMPTY_OFF,
                    ),
                ),
                (
                    _wide_producer,
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
                        ONE_SPLIT,
                        (BLOCK_N - 2 * HELP) // SUB,
                        PAIR,
                        KV_OFF,
                        KV_STEP,
                        FULL_OFF,
                    ),
                ),
            ],
            [4, 4, P_WARPS],
            [R_REGS, R_REGS, P_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _scorer,
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
                        a_smem,
                        inv_smem,
                        full_bars,
                        empty_bars,
                        p_full,
                        p_empty,
                        fin_bar,
                        q_bar,
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
                        BLOCKS,
                        HEAD_BLOCKS,
                        ONE_SPLIT,
                        ROPE,
                        s_layout,
                        o_layout,
                        q_layout,
                        Q_REGS,
                        not PV_SPLIT,
                        PAIR,
                    ),
                ),
                (
                    _half,
                    (
                        q_ptr,
                        out_ptr,
                        idx_ptr,
                        q_smem,
                        kv_bufs,
                        p_smem,
                        a_smem,
                        inv_smem,
                        empty_bars,
                        p_full,
                        p_empty,
                        fin_bar,
                        q_bar,
                        heads,
                        width,
                        entries_per_split,
                        tokens,
                        stride_qt,
                        stride_qh,
                        stride_it,
                        stride_ot,
                        stride_oh,
                        stride_os,
                        cache_ptr,
                        full_bars,
                        BLOCKS,
                        HEAD_BLOCKS,
                        ONE_SPLIT,
                        o_layout,
                        q_layout,
                        BLOCK_N,
                        ROW_BYTES,
                        1,
                        HELP,
                        PAIR,
                        EMPTY_OFF,
                    ),
                ),
                (
                    _wide_producer,
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
                        ONE_SPLIT,
                        (BLOCK_N - 2 * HELP) // SUB,
                        PAIR,
                        KV_OFF,
                        KV_STEP,
                        FULL_OFF,
                    ),
                ),
            ],
            [4, P_WARPS],
            [R_REGS, P_REGS],
        )
