"""Same-process timing: the reg16 prototype (RS, staged index) against the product's register
kernel, NoPE and shim, 16 x 512, both widths; each pair timed twice in alternating order."""
import os, sys, json
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).parent))
import run_reg16 as proto
from nopebench.bench.decode_cases import build_cache
from nopebench.bench.timing import time_gpu
from nopebench.compare import close
from nopebench.environment import environment_header
from nopebench.impls.native.adapter import native_decode, DecodeBuffers
from nopebench.impls.native.plans import plan_register
from nopebench.impls.reference import sparse_decode_reference

OUT = Path(os.environ["OUT"]); OUT.mkdir(parents=True, exist_ok=True)
(OUT / "env.json").write_text(json.dumps(environment_header(), indent=1, default=str))
gen = torch.Generator(device="cuda").manual_seed(99)
rows = []
for mode in ("nope", "shim"):
    rope = 64 if mode == "shim" else 0
    lib = proto.build(4, 2, "-DRS -DIDX_SMEM=2208" + (" -DROPE" if rope else ""))
    cache, usable = build_cache(mode, 1 << 20, 64, "arbitrary_fp32", "cuda", seed=1234)
    for width in (2176, 2048):
        tokens = 512
        qs = [torch.randn(tokens, 16, 512 + rope, device="cuda", generator=gen).clamp(-1, 1).to(torch.bfloat16) for _ in range(4)]
        for q in qs:
            q[..., 512:] = 0
        idxs = [proto.make_indices(tokens, width, usable, gen) for _ in range(4)]
        ref, _ = sparse_decode_reference(qs[0], cache, idxs[0], 0.0625, rope)
        plan = plan_register(tokens, 16, width, rope=bool(rope))
        bufs = [DecodeBuffers.allocate(tokens, 16, plan, "cuda") for _ in range(4)]
        prod = [lambda q=q, i=i, b=b: native_decode(q, cache, i, 0.0625, rope, plan, b) for q, i, b in zip(qs, idxs, bufs)]
        runs = [proto.Reg16(lib, tokens, width) for _ in range(4)]
        pro = [lambda r=r, q=q, i=i: r(q, cache, i) for r, q, i in zip(runs, qs, idxs)]
        ok_prod = close(prod[0]().out, ref).passed
        ok_pro = close(pro[0]()[0], ref).passed
        for rep in range(2):
            order = [("product", prod), ("prototype", pro)] if rep == 0 else [("prototype", pro), ("product", prod)]
            for name, calls in order:
                tm = time_gpu(calls, budget_s=0.4)
                rows.append(dict(mode=mode, width=width, impl=name, rep=rep, ms=tm.median_ms, passed=ok_prod if name == "product" else ok_pro))
                print(rows[-1], flush=True)
import csv
with open(OUT / "same_process.csv", "w", newline="") as f:
    w = csv.DictWriter(f, list(rows[0])); w.writeheader(); w.writerows(rows)
