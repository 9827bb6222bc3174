import os, torch
from nopebench.bench.decode_cases import build_cache
import run_reg16 as R
stages, minb, extra = int(os.environ.get("ST", 4)), int(os.environ.get("MB", 2)), os.environ.get("EXTRA", "")
lib = R.build(stages, minb, extra)
cache, usable = build_cache("nope", R.ROWS, 64, "arbitrary_fp32", "cuda", seed=1234)
gen = torch.Generator(device="cuda").manual_seed(1)
tokens = int(os.environ.get("TOK", 512))
q = torch.randn(tokens, 16, 512, device="cuda", generator=gen).clamp(-1, 1).to(torch.bfloat16)
idx = R.make_indices(tokens, 2176, usable, gen)
r = R.Reg16(lib, tokens, 2176, per_sm=minb)
for _ in range(3):
    r(q, cache, idx)
torch.cuda.synchronize()
