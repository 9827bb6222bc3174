"""Sparse MLA decode in Triton, reading packed fp8_ds_mla rows in place.

One program handles one query token, a block of heads and one split of the top-k entries.
Per block of BLOCK_N entries it gathers the rows (row stride is a compile-time constant:
528 or 656 bytes), dequantizes each 128-wide fp8 tile with its fp32 scale in registers,
and runs an online softmax. The next block's rows are loaded before the current block is
computed (register double-buffering), and the index row two blocks ahead, so the gather's
memory latency overlaps the math. With few query tokens the top-k range is split across
programs and a second kernel merges the partial results by their log-sum-exp.

Everything is fixed-shape with no host synchronisation, so a decode step can be captured in a
CUDA graph. `-1` entries are masked wherever they sit; a row with none valid gives zeros and
lse = -inf. LSE is natural-log, like the reference.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nopebench.impls.native import constants as c

LOG2E = 1.4426950408889634
# Where a row's scales and RoPE lanes start: from the row's one description (geometry).
SCALE_OFFSET = tl.constexpr(c.SCALE_OFFSET)
ROPE_OFFSET = tl.constexpr(c.ROPE_OFFSET)


@triton.jit
def _gather_block(
    cache_ptr,
    idx_row_ptr,
    n_start,
    width,
    BLOCK_N: tl.constexpr,
    ROW_BYTES: tl.constexpr,
    ROPE: tl.constexpr,
):
    """Raw bytes of one block of rows: four [BLOCK_N, 128] fp8 tiles, their four scales,
    the [BLOCK_N, 64] bf16 RoPE lanes when ROPE, and the valid mask."""
    offs_n = n_start + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_row_ptr + offs_n, mask=offs_n < width, other=-1)
    valid = idx >= 0
    row = cache_ptr + tl.where(valid, idx, 0).to(tl.int64) * ROW_BYTES
    cols = tl.arange(0, 128)
    m2 = valid[:, None]
    k0 = tl.load(row[:, None] + cols[None, :], mask=m2, other=0)
    k1 = tl.load(row[:, None] + (128 + cols)[None, :], mask=m2, other=0)
    k2 = tl.load(row[:, None] + (256 + cols)[None, :], mask=m2, other=0)
    k3 = tl.load(row[:, None] + (384 + cols)[None, :], mask=m2, other=0)
    sp = (row + SCALE_OFFSET).to(tl.pointer_type(tl.float32))
    s0 = tl.load(sp + 0, mask=valid, other=0.0)
    s1 = tl.load(sp + 1, mask=valid, other=0.0)
    s2 = tl.load(sp + 2, mask=valid, other=0.0)
    s3 = tl.load(sp + 3, mask=valid, other=0.0)
    if ROPE:
        rp = (row + ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16))
        r = tl.load(rp[:, None] + tl.arange(0, 64)[None, :], mask=m2, other=0.0)
    else:
        r = s0  # unused placeholder keeps the return arity fixed
    return k0, k1, k2, k3, s0, s1, s2, s3, r, valid


@triton.jit
def _dequant(k, s):
    """fp8 bytes [N, 128] * per-row scale [N] -> bf16, exactly as the reference does."""
    return (k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * s[:, None]).to(tl.bfloat16)


@triton.jit
def _mma(a, b, acc, F32_DOT: tl.constexpr):
    """a @ b + acc. F32_DOT upcasts the operands: only for Triton's CPU interpreter, whose
    bf16 dot multiplies the raw uint16 storage; on a GPU the bf16 tensor-core path runs."""
    if F32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _attend(
    q0,
    q1,
    q2,
    q3,
    qr,
    k0,
    k1,
    k2,
    k3,
    s0,
    s1,
    s2,
    s3,
    r,
    valid,
    m_i,
    l_i,
    acc0,
    acc1,
    acc2,
    acc3,
    qk_scale_log2,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROPE: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """One block of the online softmax: dequantize, scores, rescale, accumulate P @ V."""
    v0 = _dequant(k0, s0)
    v1 = _dequant(k1, s1)
    v2 = _dequant(k2, s2)
    v3 = _dequant(k3, s3)
    s = _mma(q0, tl.trans(v0), tl.zeros((BLOCK_H, BLOCK_N), dtype=tl.float32), F32_DOT)
    s = _mma(q1, tl.trans(v1), s, F32_DOT)
    s = _mma(q2, tl.trans(v2), s, F32_DOT)
    s = _mma(q3, tl.trans(v3), s, F32_DOT)
    if ROPE:
        s = _mma(qr, tl.trans(r), s, F32_DOT)
    s = tl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid entry yet: keep p = 0
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    pb = p.to(tl.bfloat16)
    acc0 = _mma(pb, v0, acc0 * alpha[:, None], F32_DOT)
    acc1 = _mma(pb, v1, acc1 * alpha[:, None], F32_DOT)
    acc2 = _mma(pb, v2, acc2 * alpha[:, None], F32_DOT)
    acc3 = _mma(pb, v3, acc3 * alpha[:, None], F32_DOT)
    return m_new, l_i, acc0, acc1, acc2, acc3


@triton.jit
def _fp16(k):
    """fp8 bytes -> fp16, exact (every e4m3 value is an fp16 value; one cvt per pair)."""
    return k.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _attend_factored(
    q0,
    q1,
    q2,
    q3,
    qr,
    q_unscale,
    k0,
    k1,
    k2,
    k3,
    s0,
    s1,
    s2,
    s3,
    r,
    valid,
    m_i,
    l_i,
    acc0,
    acc1,
    acc2,
    acc3,
    qk_scale_log2,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROPE: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    """The same block update with the scales factored out of the matrix products.

    score[h, n] = sum_t scale_t[n] * (q_t[h] . fp8_t[n]); out_t += (p * scale_t) @ fp8_t.
    The fp8 tiles enter the fp16 tensor-core products exactly, and no [BLOCK_N, 512] fp32
    dequantized tile ever exists. q arrives pre-scaled by a power of two per head so that it
    fits fp16 (q_unscale undoes it); p * scale_t is divided by the block's largest scale so it
    stays in fp16's normal range, and that factor is applied to the fp32 accumulator.
    """
    zero = tl.zeros((BLOCK_H, BLOCK_N), dtype=tl.float32)
    f0 = _fp16(k0)
    f1 = _fp16(k1)
    f2 = _fp16(k2)
    f3 = _fp16(k3)
    s = _mma(q0, tl.trans(f0), zero, F32_DOT) * s0[None, :]
    s += _mma(q1, tl.trans(f1), zero, F32_DOT) * s1[None, :]
    s += _mma(q2, tl.trans(f2), zero, F32_DOT) * s2[None, :]
    s += _mma(q3, tl.trans(f3), zero, F32_DOT) * s3[None, :]
    s = s * q_unscale[:, None]
    if ROPE:
        s = _mma(qr, tl.trans(r), s, F32_DOT)
    s = tl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    c0 = tl.maximum(tl.max(s0, axis=0), 1e-30)
    c1 = tl.maximum(tl.max(s1, axis=0), 1e-30)
    c2 = tl.maximum(tl.max(s2, axis=0), 1e-30)
    c3 = tl.maximum(tl.max(s3, axis=0), 1e-30)
    acc0 = (
        _mma((p * (s0 / c0)[None, :]).to(tl.float16), f0, zero_acc(BLOCK_H), F32_DOT) * c0
        + acc0 * alpha[:, None]
    )
    acc1 = (
        _mma((p * (s1 / c1)[None, :]).to(tl.float16), f1, zero_acc(BLOCK_H), F32_DOT) * c1
        + acc1 * alpha[:, None]
    )
    acc2 = (
        _mma((p * (s2 / c2)[None, :]).to(tl.float16), f2, zero_acc(BLOCK_H), F32_DOT) * c2
        + acc2 * alpha[:, None]
    )
    acc3 = (
        _mma((p * (s3 / c3)[None, :]).to(tl.float16), f3, zero_acc(BLOCK_H), F32_DOT) * c3
        + acc3 * alpha[:, None]
    )
    return m_new, l_i, acc0, acc1, acc2, acc3


@triton.jit
def _update(
    q0,
    q1,
    q2,
    q3,
    qr,
    q_unscale,
    k0,
    k1,
    k2,
    k3,
    s0,
    s1,
    s2,
    s3,
    r,
    valid,
    m_i,
    l_i,
    acc0,
    acc1,
    acc2,
    acc3,
    qk_scale_log2,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROPE: tl.constexpr,
    F32_DOT: tl.constexpr,
    FACTORED: tl.constexpr,
):
    if FACTORED:
        res = _attend_factored(
            q0,
            q1,
            q2,
            q3,
            qr,
            q_unscale,
            k0,
            k1,
            k2,
            k3,
            s0,
            s1,
            s2,
            s3,
            r,
            valid,
            m_i,
            l_i,
            acc0,
            acc1,
            acc2,
            acc3,
            qk_scale_log2,
            BLOCK_H,
            BLOCK_N,
            ROPE,
            F32_DOT,
        )
    else:
        res = _attend(
            q0,
            q1,
            q2,
            q3,
            qr,
            k0,
            k1,
            k2,
            k3,
            s0,
            s1,
            s2,
            s3,
            r,
            valid,
            m_i,
            l_i,
            acc0,
            acc1,
            acc2,
            acc3,
            qk_scale_log2,
            BLOCK_H,
            BLOCK_N,
            ROPE,
            F32_DOT,
        )
    return res


@triton.jit
def zero_acc(BLOCK_H: tl.constexpr):
    return tl.zeros((BLOCK_H, 128), dtype=tl.float32)


@triton.jit
def sparse_decode_kernel(
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
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROW_BYTES: tl.constexpr,
    ROPE: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    PREFETCH: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    F32_DOT: tl.constexpr,
    FACTORED: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tok = pid // HEAD_BLOCKS
    hb = pid % HEAD_BLOCKS
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = offs_h < heads
    cols = tl.arange(0, 128)
    qrow = q_ptr + tok.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q0 = tl.load(qrow + cols[None, :], mask=hmask[:, None], other=0.0)
    q1 = tl.load(qrow + (128 + cols)[None, :], mask=hmask[:, None], other=0.0)
    q2 = tl.load(qrow + (256 + cols)[None, :], mask=hmask[:, None], other=0.0)
    q3 = tl.load(qrow + (384 + cols)[None, :], mask=hmask[:, None], other=0.0)
    if ROPE:
        qr = tl.load(qrow + (512 + tl.arange(0, 64))[None, :], mask=hmask[:, None], other=0.0)
    else:
        qr = q0  # placeholder: never used without ROPE
    if FACTORED:
        # Power-of-two prescale per head so |q| <= 2**14 fits fp16 exactly (bf16 -> fp16 is
        # exact in range); q_unscale multiplies the scores back.
        qmax = tl.maximum(
            tl.maximum(
                tl.max(tl.abs(q0.to(tl.float32)), axis=1), tl.max(tl.abs(q1.to(tl.float32)), axis=1)
            ),
            tl.maximum(
                tl.max(tl.abs(q2.to(tl.float32)), axis=1), tl.max(tl.abs(q3.to(tl.float32)), axis=1)
            ),
        )
        q_unscale = tl.exp2(tl.maximum(tl.ceil(tl.log2(tl.maximum(qmax, 1.0))) - 14.0, 0.0))
        q0 = (q0.to(tl.float32) / q_unscale[:, None]).to(tl.float16)
        q1 = (q1.to(tl.float32) / q_unscale[:, None]).to(tl.float16)
        q2 = (q2.to(tl.float32) / q_unscale[:, None]).to(tl.float16)
        q3 = (q3.to(tl.float32) / q_unscale[:, None]).to(tl.float16)
    else:
        q_unscale = tl.full((BLOCK_H,), 1.0, dtype=tl.float32)

    acc0 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)

    idx_row = idx_ptr + tok.to(tl.int64) * stride_it
    start = split * entries_per_split
    end = tl.minimum(start + entries_per_split, width)
    if PREFETCH:
        # Register double-buffering: the next block's gathers are issued before this block's
        # math, so their latency overlaps it.
        k0, k1, k2, k3, s0, s1, s2, s3, r, valid = _gather_block(
            cache_ptr, idx_row, start, end, BLOCK_N, ROW_BYTES, ROPE
        )
        for n in range(start, end, BLOCK_N):
            nk0, nk1, nk2, nk3, ns0, ns1, ns2, ns3, nr, nvalid = _gather_block(
                cache_ptr, idx_row, n + BLOCK_N, end, BLOCK_N, ROW_BYTES, ROPE
            )
            m_i, l_i, acc0, acc1, acc2, acc3 = _update(
                q0,
                q1,
                q2,
                q3,
                qr,
                q_unscale,
                k0,
                k1,
                k2,
                k3,
                s0,
                s1,
                s2,
                s3,
                r,
                valid,
                m_i,
                l_i,
                acc0,
                acc1,
                acc2,
                acc3,
                qk_scale_log2,
                BLOCK_H,
                BLOCK_N,
                ROPE,
                F32_DOT,
                FACTORED,
            )
            k0, k1, k2, k3, s0, s1, s2, s3, r, valid = (
                nk0,
                nk1,
                nk2,
                nk3,
                ns0,
                ns1,
                ns2,
                ns3,
                nr,
                nvalid,
            )
    else:
        # Loads at the top of the body: Triton's software pipeliner may overlap them (num_stages).
        for n in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
            k0, k1, k2, k3, s0, s1, s2, s3, r, valid = _gather_block(
                cache_ptr, idx_row, n, end, BLOCK_N, ROW_BYTES, ROPE
            )
            m_i, l_i, acc0, acc1, acc2, acc3 = _update(
                q0,
                q1,
                q2,
                q3,
                qr,
                q_unscale,
                k0,
                k1,
                k2,
                k3,
                s0,
                s1,
                s2,
                s3,
                r,
                valid,
                m_i,
                l_i,
                acc0,
                acc1,
                acc2,
                acc3,
                qk_scale_log2,
                BLOCK_H,
                BLOCK_N,
                ROPE,
                F32_DOT,
                FACTORED,
            )

    has = l_i > 0
    inv = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    lse = tl.where(
        has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf")
    )
    orow = (
        out_ptr
        + split.to(tl.int64) * stride_os
        + tok.to(tl.int64) * stride_ot
        + offs_h[:, None] * stride_oh
    )
    om = hmask[:, None]
    tl.store(orow + cols[None, :], (acc0 * inv[:, None]).to(out_ptr.dtype.element_ty), mask=om)
    tl.store(
        orow + (128 + cols)[None, :], (acc1 * inv[:, None]).to(out_ptr.dtype.element_ty), mask=om
    )
    tl.store(
        orow + (256 + cols)[None, :], (acc2 * inv[:, None]).to(out_ptr.dtype.element_ty), mask=om
    )
    tl.store(
        orow + (384 + cols)[None, :], (acc3 * inv[:, None]).to(out_ptr.dtype.element_ty), mask=om
    )
    tl.store(
        lse_ptr + split.to(tl.int64) * stride_ls + tok.to(tl.int64) * stride_lt + offs_h,
        lse,
        mask=hmask,
    )


@triton.jit
def combine_kernel(
    part_ptr,
    part_lse_ptr,
    out_ptr,
    lse_ptr,
    heads,
    splits,
    stride_ps,
    stride_pt,
    stride_ph,
    stride_ls,
    stride_lt,
    stride_ot,
    stride_oh,
    BLOCK_S: tl.constexpr,
):
    """Merge per-split normalized outputs by their log-sum-exp: one program per (token, head)."""
    pid = tl.program_id(0)
    tok = pid // heads
    h = pid % heads
    offs_s = tl.arange(0, BLOCK_S)
    smask = offs_s < splits
    lse_s = tl.load(
        part_lse_ptr + offs_s * stride_ls + tok * stride_lt + h, mask=smask, other=float("-inf")
    )
    m = tl.max(lse_s, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe)
    total = tl.sum(w, axis=0)
    inv = tl.where(total > 0, 1.0 / tl.where(total > 0, total, 1.0), 0.0)
    cols = tl.arange(0, 512)
    parts = tl.load(
        part_ptr + offs_s[:, None] * stride_ps + tok * stride_pt + h * stride_ph + cols[None, :],
        mask=smask[:, None],
        other=0.0,
    )
    o = tl.sum(parts * (w * inv)[:, None], axis=0)
    tl.store(out_ptr + tok * stride_ot + h * stride_oh + cols, o.to(tl.bfloat16))
    lse = tl.where(total > 0, m_safe + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    tl.store(lse_ptr + tok * heads + h, lse)
