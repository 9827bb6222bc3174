"""Probe: per-block clock stamps of the 64-head kernel's roles (NB_TRACE=1), on tune_native's
problem. Checks the traced kernel against the reference, times it, then dumps the stamps of the
last launch and a summary of per-block phase durations (SM cycles)."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from tools import tune_native as tn
from nopebench.bench.decode_cases import build_cache
from nopebench.bench.timing import time_gpu
from nopebench.compare import close
from nopebench.impls.native.adapter import native_decode
from nopebench.impls.native import hopper_wide_decode as wide
from nopebench.impls.reference import sparse_decode_reference

out = os.environ["OUT"]
cases = json.loads(sys.argv[1])  # [[heads, tokens, {plan overrides}], ...]
gen = torch.Generator(device="cuda"); gen.manual_seed(7)
cache, usable = build_cache("nope", tn.ROWS, 64, "arbitrary_fp32", "cuda", seed=1234)
summary = []
for heads, tokens, over in cases:
    plan = tn.build_plan(tokens, heads, dict(kernel="hopper_wide", **over), False)
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
    tag = f"h{heads}-t{tokens}-" + ("-".join(f"{k}{v}" for k, v in over.items()) or "plan")
    torch.save(t, f"{out}/{tag}.pt")
    # per-slot durations, blocks 4..27, median over blocks and slots
    import statistics as st
    def med(vals):
        vals = [v for v in vals if v is not None]
        return round(st.median(vals)) if vals else None
    def d(role, a, b, lo=4, hi=28, nxt=False):
        vals = []
        for s in range(32):
            for i in range(lo, hi):
                x = t[s, role, i, a].item(); y = (t[s, role, i + 1, b] if nxt else t[s, role, i, b]).item()
                if x >= 0 and y >= 0:
                    vals.append(y - x)
        return med(vals)
    def cross(r1, i1, k1, r2, k2, off=0, lo=4, hi=28):
        vals = []
        for s in range(32):
            for i in range(lo, hi):
                x = t[s, r1, i, k1].item(); y = t[s, r2, i + off, k2].item()
                if x >= 0 and y >= 0:
                    vals.append(y - x)
        return med(vals)
    row = dict(case=tag, passed=cmp.passed, max_abs_err=cmp.max_abs_err, median_ms=tm.median_ms,
               slots=int((t[:, 0, 0, 1] >= 0).sum()),
               scorer_period=d(0, 1, 1, nxt=True), scorer_wait_tile=d(0, 0, 1), scorer_S=d(0, 1, 2),
               scorer_softmax_handover=d(0, 2, 3), scorer_softmax_math=d(0, 2, 4),
               scorer_p_convert=d(0, 4, 5), scorer_p_empty_wait=d(0, 5, 6), scorer_p_store=d(0, 6, 7),
               scorer_fence=cross(0, 0, 7, 1, 7), scorer_arrive_return=cross(1, 0, 7, 0, 3),
               right_period=d(1, 1, 1, nxt=True), right_wait_P=d(1, 0, 1), right_PV=d(1, 1, 2),
               role3_wait_P_or_issue=d(3, 0, 1), role3_PV=d(3, 1, 2) if plan.pv_split else d(3, 0, 2),
               prod_period=d(2, 0, 0, nxt=True), prod_first_loads_and_empty_wait=d(2, 0, 1),
               prod_convert=d(2, 1, 2), prod_arrive=d(2, 2, 3),
               full_arrive_to_scorer_wakes=cross(2, 0, 3, 0, 1),
               handover_to_right_wakes=cross(0, 0, 3, 1, 1),
               right_pv_done_to_prod_empty_done=cross(1, 0, 2, 2, 1, off=2),
               scorer_S_done_to_right_pv_done=cross(0, 0, 2, 1, 2))
    print(json.dumps(row), flush=True)
    summary.append(row)
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
