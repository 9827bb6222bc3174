"""Shared inputs for the native decode tests (CPU interpreter and GPU): a NaN-poisoned cache and
index rows with -1 padding anywhere, empty rows, and queries that are strided views; with `shim`
the RoPE lanes of rows and queries are zero (the zero-padded shim)."""

from __future__ import annotations

import dataclasses
import functools

import torch

from nopebench import rowformat
from nopebench.compare import close
from nopebench.impls.reference import sparse_decode_reference

SCALE = 0.0625


def decode_inputs(
    heads: int,
    tokens: int,
    width: int,
    rope: int,
    row_bytes: int,
    device,
    seed: int = 0,
    rows: int = 512,
    block_size: int = 64,
    magnitude: float = 1.0,
    scale_format: str = "arbitrary_fp32",
    shim: bool = False,
):
    gen = torch.Generator().manual_seed(seed)
    first = rows // 8  # rows 0 .. first - 1 stay poison: a kernel reading row 0 for a -1 sees NaN
    usable = rows - first
    cache = torch.full(
        (rows // block_size, block_size, row_bytes), 0xFF, dtype=torch.uint8
    )  # NaN poison
    latent = (torch.randn(usable, 512, generator=gen) * magnitude).to(torch.bfloat16)
    pe = torch.randn(usable, 64, generator=gen).to(torch.bfloat16) if rope else None
    if shim:
        pe = torch.zeros(usable, 64, dtype=torch.bfloat16)
    rowformat.write_cache(cache, latent, pe, torch.arange(first, rows), scale_format)
    active = min(width, usable)
    idx = torch.stack(
        [torch.randperm(usable, generator=gen)[:active] + first for _ in range(tokens)]
    ).int()
    idx = torch.cat([idx, torch.full((tokens, width - active), -1, dtype=torch.int32)], dim=1)
    if tokens > 1:
        idx[1] = -1  # an empty row
    if tokens > 2:
        idx[2, torch.randperm(width, generator=gen)[: width // 3]] = -1  # -1 scattered inside a row
    wide = (
        torch.randn(tokens, heads, 512 + rope + 64, generator=gen).clamp(-1, 1).to(torch.bfloat16)
    )
    if shim:
        wide[..., 512:] = 0
    q = wide[..., : 512 + rope]  # strided: head stride 640 or 576, not the contiguous width
    return q.to(device), cache.to(device), idx.to(device)


def assert_matches_reference(got, q, cache, idx, rope: int) -> None:
    """The strict element and cosine rule on the output; the same empty rows and LSE to 1e-3."""
    ref, lse = sparse_decode_reference(q, cache, idx, SCALE, rope)
    cmp = close(got.out, ref)
    assert cmp.passed, cmp.detail
    finite = torch.isfinite(lse)
    assert torch.equal(torch.isinf(got.lse), ~finite)
    assert float((got.lse[finite] - lse[finite]).abs().max()) < 1e-3


@dataclasses.dataclass
class RegisterResult:
    out: torch.Tensor
    lse: torch.Tensor


def run_register(q, cache, idx, rope: int, plan) -> RegisterResult:
    """One register-kernel launch of `plan` on q's device (CPU tensors go to the emulator, where
    one is loaded), outputs NaN-poisoned first; several splits are merged by their log-sum-exps
    here (the product's combine kernel does this on a device)."""
    from nopebench import geometry as g
    from nopebench.impls.native import register_library

    tokens, heads, _ = q.shape
    flat = cache.reshape(-1, cache.shape[-1])
    nan = functools.partial(torch.full, fill_value=float("nan"), device=q.device)
    if plan.splits == 1:
        out = nan((tokens, heads, g.LATENT_DIM), dtype=torch.bfloat16)
        lse = nan((tokens, heads))
        register_library.launch(q, flat, idx, SCALE, rope, plan, (out, lse))
        return RegisterResult(out, lse)
    part = nan((plan.splits, tokens, heads, g.LATENT_DIM))
    part_lse = nan((plan.splits, tokens, heads))
    register_library.launch(q, flat, idx, SCALE, rope, plan, (part, part_lse))
    lse = torch.logsumexp(part_lse, dim=0)
    weight = torch.where(torch.isfinite(lse), torch.exp(part_lse - lse), 0.0)
    out = (weight[..., None] * part).sum(0)
    return RegisterResult(out.to(torch.bfloat16), lse)
