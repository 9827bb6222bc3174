"""One small launch of the latent-half pair against the reference, on a tree with
latent-pair.diff applied (a hang or a wrong answer shows here first, in seconds): 128 heads x 4
tokens, width 2176, one split and three, and the overlapped form."""

import sys

import torch

sys.path.insert(0, "tests")
from native_cases import SCALE, assert_matches_reference, decode_inputs  # noqa: E402

from nopebench.impls.native.adapter import native_decode  # noqa: E402
from nopebench.impls.native.plans import plan_latent_pair  # noqa: E402

for splits, overlap in ((1, False), (3, False), (1, True)):
    q, cache, idx = decode_inputs(128, 4, 2176, 0, 528, "cuda", seed=splits, rows=4096)
    plan = plan_latent_pair(4, 128, 2176, 132, splits=splits, overlap=overlap)
    got = native_decode(q, cache, idx, SCALE, 0, plan)
    torch.cuda.synchronize()
    got.out.fill_(float("nan"))
    got = native_decode(q, cache, idx, SCALE, 0, plan)
    torch.cuda.synchronize()
    try:
        assert_matches_reference(got, q, cache, idx, 0)
        print(f"splits {splits}, overlap {overlap}: passed")
    except AssertionError as exc:
        print(f"splits {splits}, overlap {overlap}: FAILED {str(exc)[:300]}")
        sys.exit(1)
