"""Numerics models of the register kernel, against the reference under the strict rule
(float64 torch on the CPU: `python results/reference/decode-tuning/scale-fold/model.py`).

`current`: K = V = the dequantized cache as the reference rounds it (bf16(f32(e4m3) * scale)),
P rounded to bf16 (what the product kernel does). `folded`: the products on the raw e4m3 values
(exact in f16), each row's tile scale applied to the partial scores and folded into P (f16, per
32-key block and tile normalized by the block's largest scale, times 2^14)."""

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]  # the repository
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from native_cases import SCALE, decode_inputs  # noqa: E402

from nopebench import rowformat  # noqa: E402
from nopebench.compare import close  # noqa: E402
from nopebench.impls.reference import sparse_decode_reference  # noqa: E402

BLOCK = 32


def gather(cache, idx):
    rows = cache.view(-1, cache.shape[-1])
    valid = idx >= 0
    packed = rows[torch.where(valid, idx, 0).long()]
    e = torch.nan_to_num(packed[..., :512].contiguous().view(torch.float8_e4m3fn).double())
    s = torch.nan_to_num(packed[..., 512:528].contiguous().view(torch.float32).double())
    pe = None
    if cache.shape[-1] == 656:
        pe = torch.nan_to_num(packed[..., 528:656].contiguous().view(torch.bfloat16).double())
    latent, _ = rowformat.dequantize_rows(packed.view(-1, cache.shape[-1]))
    k = torch.nan_to_num(latent.double().view(*idx.shape, 512))
    return e, s, pe, k, valid


def softmax_parts(sc, valid):
    sc = sc.masked_fill(~valid[:, None], -math.inf)
    m = sc.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0)
    p = torch.exp(sc - m)
    return p, p.sum(-1)


def finish(out, total):
    out = torch.where(total[..., None] > 0, out / total[..., None].clamp_min(1e-300), 0)
    return out.to(torch.bfloat16)


def current(q, cache, idx, rope):
    e, s, pe, k, valid = gather(cache, idx)
    keys = k if not rope else torch.cat([k, pe], -1)
    sc = torch.einsum("thd,twd->thw", q.double(), keys) * SCALE
    p, total = softmax_parts(sc, valid)
    pb = p.to(torch.bfloat16).double()
    return finish(torch.einsum("thw,twd->thd", pb, k), total)


def folded(q, cache, idx, rope, shift=14, fold_qk=True, fold_pv=True):
    e, s, pe, k, valid = gather(cache, idx)
    T, H, _ = q.shape
    W = idx.shape[1]
    et = e.view(T, W, 4, 128)
    if not fold_qk:
        keys = k if not rope else torch.cat([k, pe], -1)
        sc = torch.einsum("thd,twd->thw", q.double(), keys)
    else:
        qf = q[..., :512].to(torch.float16).double().reshape(T, H, 4, 128)
        sc = (torch.einsum("thkd,twkd->thwk", qf, et) * s[:, None]).sum(-1)
        if rope:
            sc = sc + torch.einsum("thd,twd->thw", q[..., 512:].double(), pe)
    p, total = softmax_parts(sc * SCALE, valid)
    if not fold_pv:
        return finish(torch.einsum("thw,twd->thd", p.to(torch.bfloat16).double(), k), total)
    out = torch.zeros(T, H, 4, 128, dtype=torch.float64)
    for b in range(W // BLOCK):
        sl = slice(b * BLOCK, (b + 1) * BLOCK)
        big = s[:, sl].amax(1, keepdim=True).clamp_min(1e-30)  # [T, 1, 4]
        pp = (p[:, :, sl, None] * (s[:, sl] / big * 2.0**shift)[:, None]).to(torch.float16)
        out += (
            torch.einsum("thwk,twkd->thkd", pp.double(), et[:, sl])
            * (big[:, 0, :, None] * 2.0**-shift)[:, None]
        )
    return finish(out.reshape(T, H, 512), total)


def fold_qk_only(q, cache, idx, rope):
    """Scores from the raw values and scales, P and V as the product kernel."""
    return folded(q, cache, idx, rope, fold_pv=False)


def fold_pv_only(q, cache, idx, rope):
    """Scores as the product kernel, the output product on raw values with the scales in P."""
    return folded(q, cache, idx, rope, fold_qk=False)


def bench_like(heads, tokens, width, active, rope, seed):
    """bench-decode's inputs: randn latents and queries, `active` valid entries of `width`."""
    gen = torch.Generator().manual_seed(seed)
    rows = 8192
    row_bytes = 656 if rope else 528
    cache = torch.full((rows // 64, 64, row_bytes), 0xFF, dtype=torch.uint8)
    latent = torch.randn(rows, 512, generator=gen).to(torch.bfloat16)
    pe = torch.randn(rows, 64, generator=gen).to(torch.bfloat16) if rope else None
    rowformat.write_cache(cache, latent, pe, torch.arange(rows), "arbitrary_fp32")
    idx = torch.stack([torch.randperm(rows, generator=gen)[:active] for _ in range(tokens)]).int()
    idx = torch.cat([idx, torch.full((tokens, width - active), -1, dtype=torch.int32)], 1)
    q = torch.randn(tokens, heads, 512 + rope, generator=gen).to(torch.bfloat16)
    return q, cache, idx


def report(name, q, cache, idx, rope):
    ref, _ = sparse_decode_reference(q, cache, idx, SCALE, rope)
    for model in (current, folded, fold_qk_only, fold_pv_only):
        c = close(model(q, cache, idx, rope), ref)
        print(
            f"{name:34s} {model.__name__:12s} {'pass' if c.passed else 'FAIL'}  "
            f"outside {c.mismatch_fraction:.4%}  cos diff {c.cos_diff:.2e}  "
            f"max abs {c.max_abs_err:.3g}"
        )


if __name__ == "__main__":
    torch.set_num_threads(2)
    for mag in (1e-3, 1.0):
        for rope, rb in ((0, 528), (64, 656)):
            for seed in (0, 1):
                q, cache, idx = decode_inputs(
                    16, 3, 320, rope, rb, "cpu", seed=seed, magnitude=mag, rows=2048
                )
                report(f"test inputs mag {mag:g} rope {rope} seed {seed}", q, cache, idx, rope)
    for rope in (0, 64):
        q, cache, idx = bench_like(16, 4, 2176, 2051, rope, 0)
        report(f"bench inputs 16 heads rope {rope}", q, cache, idx, rope)
