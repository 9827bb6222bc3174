"""Probe: per-block clock stamps (NB_TRACE=1) of the planned kernels at given shapes, generic
summary: per role, the median cycles between consecutive stamped points and the period."""
import json, os, sys, statistics as st
import torch
sys.path.insert(0, os.getcwd())
from tools import tune_native as tn
from nopebench.bench.decode_cases import build_cache
from nopebench.bench.timing import time_gpu
from nopebench.compare import close
from nopebench.impls.native.adapter import native_decode, choose_plan
from nopebench.impls.native import hopper_wide_decode as wide
from nopebench.impls.reference import sparse_decode_reference

out = os.environ["OUT"]
cases = json.loads(sys.argv[1])  # [[heads, tokens, width], ...]
gen = torch.Generator(device="cuda"); gen.manual_seed(7)
cache, usable = build_cache("nope", tn.ROWS, 64, "arbitrary_fp32", "cuda", seed=1234)
for heads, tokens, width in cases:
    tn.set_width(width)
    plan = choose_plan(tokens, heads, width, 0, torch.device("cuda"))
    q = torch.randn(tokens, heads, 512, device="cuda", generator=gen).clamp(-1, 1).to(torch.bfloat16)
    idx = tn.make_indices(tokens, usable, gen)
    ref, _ = sparse_decode_reference(q, cache, idx, 0.0625, 0)
    res = native_decode(q, cache, idx, 0.0625, 0, plan)
    cmp = close(res.out, ref)
    tm = time_gpu([lambda: native_decode(q, cache, idx, 0.0625, 0, plan)], budget_s=0.3)
    buf = wide.trace_buffer(q.device)
    buf.fill_(-1)
    for _ in range(3):
        native_decode(q, cache, idx, 0.0625, 0, plan)
    torch.cuda.synchronize()
    t = buf.view(32, 4, 64, 8).cpu()
    tag = f"h{heads}-t{tokens}-w{width}"
    torch.save(t, f"{out}/{tag}.pt")
    row = dict(case=tag, kernel=plan.kernel, role_split=plan.role_split, block_h=plan.block_h,
               passed=cmp.passed, max_abs_err=cmp.max_abs_err, median_ms=tm.median_ms)
    for r in range(4):
        for k in range(7):
            v = [int(t[s, r, i, k + 1] - t[s, r, i, k]) for s in range(32) for i in range(4, 28)
                 if t[s, r, i, k] >= 0 and t[s, r, i, k + 1] >= 0]
            if v:
                row[f"r{r}_k{k}{k + 1}"] = round(st.median(v))
        v = [int(t[s, r, i + 1, 0] - t[s, r, i, 0]) for s in range(32) for i in range(4, 28)
             if t[s, r, i, 0] >= 0 and t[s, r, i + 1, 0] >= 0]
        if v:
            row[f"r{r}_period"] = round(st.median(v))
    # cross-role: producer's arrive (r2 k3) -> scorer's S done (r0 k1); scorer's arrive (r0 k3)
    # -> accumulator wakes (r1 k1); accumulator PV done (r1 k2) -> producer empty done two blocks on
    def cross(r1, k1, r2, k2, off=0):
        v = [int(t[s, r2, i + off, k2] - t[s, r1, i, k1]) for s in range(32) for i in range(4, 28)
             if t[s, r1, i, k1] >= 0 and t[s, r2, i + off, k2] >= 0]
        return round(st.median(v)) if v else None
    row["prod_arrive_to_scorer_S_done"] = cross(2, 3, 0, 1)
    row["scorer_arrive_to_acc_wakes"] = cross(0, 3, 1, 1)
    row["acc_done_to_prod_empty_done_2on"] = cross(1, 2, 2, 1, 2)
    print(json.dumps(row), flush=True)
