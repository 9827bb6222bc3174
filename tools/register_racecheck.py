"""The register kernel on small problems, for compute-sanitizer's racecheck: one and three
splits, NoPE rows, NoPE on 656-byte rows and RoPE lanes, each output checked with the strict
rule (so a launch that raced into a wrong answer fails here too). Run from the repository root."""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "tests")
from native_cases import (  # noqa: E402
    RegisterResult,
    assert_matches_reference,
    decode_inputs,
    run_register,
)

from nopebench.impls.native.plans import plan_register  # noqa: E402

for rope, row_bytes in ((0, 528), (0, 656), (64, 656)):
    for splits in (1, 3):
        q, cache, idx = decode_inputs(16, 3, 300, rope, row_bytes, "cuda", seed=rope, rows=512)
        plan = plan_register(16, 300, rope=bool(rope), splits=splits)
        got = run_register(q, cache, idx, rope, plan)
        torch.cuda.synchronize()
        got = RegisterResult(got.out.cpu(), got.lse.cpu())
        assert_matches_reference(got, q.cpu(), cache.cpu(), idx.cpu(), rope)
        print(f"rope {rope} row {row_bytes} splits {splits}: matches the reference", flush=True)
