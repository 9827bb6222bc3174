"""The register kernel on small problems, for compute-sanitizer's racecheck: one and three
splits, NoPE rows, NoPE on 656-byte rows and RoPE lanes, each output checked with the strict
rule (so a launch that raced into a wrong answer fails here too). Run from the repository root."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, "tests")
from native_cases import SCALE, assert_matches_reference, decode_inputs  # noqa: E402

from nopebench import geometry as g  # noqa: E402
from nopebench.impls.native import register_library  # noqa: E402
from nopebench.impls.native.plans import plan_register  # noqa: E402

for rope, row_bytes in ((0, 528), (0, 656), (64, 656)):
    for splits in (1, 3):
        q, cache, idx = decode_inputs(16, 3, 300, rope, row_bytes, "cuda", seed=rope, rows=512)
        plan = plan_register(16, 300, rope=bool(rope), splits=splits)
        shape = (3, 16, g.LATENT_DIM) if splits == 1 else (splits, 3, 16, g.LATENT_DIM)
        dtype = torch.bfloat16 if splits == 1 else torch.float32
        o = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
        lse = torch.full(shape[:-1], float("nan"), device="cuda")
        flat = cache.reshape(-1, cache.shape[-1])
        register_library.launch(q, flat, idx, SCALE, rope, plan, (o, lse))
        torch.cuda.synchronize()
        if splits == 1:
            out, total = o, lse
        else:
            total = torch.logsumexp(lse, 0)
            w = torch.where(torch.isfinite(total), torch.exp(lse - total), 0.0)
            out = (w[..., None] * o).sum(0).to(torch.bfloat16)

        got = SimpleNamespace(out=out.cpu(), lse=total.cpu())
        assert_matches_reference(got, q.cpu(), cache.cpu(), idx.cpu(), rope)
        print(f"rope {rope} row {row_bytes} splits {splits}: matches the reference", flush=True)
