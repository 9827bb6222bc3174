"""Which query tokens does each GPU implementation get wrong on check-pagetable's graph-capture
problem, with and without empty rows? (A developer diagnostic: H200, 2026-11-30.)"""

from __future__ import annotations

import dataclasses

import torch

from nopebench.checks import pagetable as pt
from nopebench.compare import close
from nopebench.config import load_model_config
from nopebench.impls import registry as impl_registry
from nopebench.impls.reference import sparse_decode_reference

cfg = load_model_config("glm53-flash")
for tokens, empty in [(512, 2), (512, 0), (256, 0), (128, 2), (128, 0)]:
    case = dataclasses.replace(pt.model_case(cfg, tokens, 0), empty_rows=empty)
    prob = pt.build_problem(case, torch.device("cuda"))
    ref, _ = sparse_decode_reference(
        prob.q, prob.cache, prob.indices, prob.softmax_scale, prob.rope_dim
    )
    for impl in ("native", "flashinfer-fa3-bf16", "flashinfer-fa3-fp8"):
        try:
            out = impl_registry.decode(prob, impl).out
        except Exception as exc:  # noqa: BLE001
            print(tokens, empty, impl, "error", exc)
            continue
        per_token = [close(out[t : t + 1], ref[t : t + 1]).passed for t in range(tokens)]
        bad = [t for t, ok in enumerate(per_token) if not ok]
        cmp = close(out, ref)
        print(
            f"T={tokens} empty={empty} {impl:20} passed={cmp.passed} cos={cmp.cos_diff:.3g} "
            f"bad_tokens={len(bad)} first={bad[:5]} last={bad[-3:]}",
            flush=True,
        )
