"""Probe variants of regpath.cu at one shape (timings only; the plain build is checked)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as b  # noqa: E402

from nopebench.bench.decode_cases import build_cache  # noqa: E402
from nopebench.bench.timing import time_gpu  # noqa: E402
from nopebench.compare import close  # noqa: E402
from nopebench.impls.reference import sparse_decode_reference  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",-DNO_DEQ,-DNO_XCHG,-DNO_PV")
    ap.add_argument("--case", default="16x512")
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "probe-out"))
    out.mkdir(parents=True, exist_ok=True)
    heads, tokens = map(int, args.case.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(1234)
    cache, usable = build_cache("nope", b.tn.ROWS, 64, "arbitrary_fp32", "cuda", seed=1234)
    sets = 4
    qs = [torch.randn(tokens, heads, 512, device="cuda", generator=gen).clamp(-1, 1)
          .to(torch.bfloat16) for _ in range(sets)]
    idxs = [b.tn.make_indices(tokens, usable, gen) for _ in range(sets)]
    bufs = (torch.full((tokens, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda"),
            torch.full((tokens, heads), float("nan"), device="cuda"),
            torch.full((1, tokens, heads, 512), float("nan"), device="cuda"),
            torch.full((1, tokens, heads), float("nan"), device="cuda"))
    if args.ncu:
        v = args.variants.split(";")[0]
        ring, extra = (int(v[1]), v[2:]) if v.startswith("R") else (3, v)
        if extra.startswith("@"):
            os.environ["REGPATH_SRC"], extra = extra[1:].split(" ", 1) if " " in extra else (extra[1:], "")
        lib = b.build(ring, extra, out)
        b.run(lib, qs[0], cache, idxs[0], 1, bufs)
        torch.cuda.synchronize()
        return 0
    ref, _ = sparse_decode_reference(qs[0], cache, idxs[0], 0.0625, 0)
    from nopebench.impls.native.adapter import DecodeBuffers, choose_plan, native_decode
    plan = choose_plan(tokens, heads, b.tn.WIDTH, 0, "cuda")
    nbuf = DecodeBuffers.allocate(tokens, heads, plan, "cuda")
    t = time_gpu([lambda q=q, i=i: native_decode(q, cache, i, 0.0625, 0, plan, nbuf)
                  for q, i in zip(qs, idxs)])
    print(f"native {args.case}: {t.median_ms:.4f} ms", flush=True)
    for v in args.variants.split(";"):
        ring = 3
        extra = v
        if v.startswith("R"):
            ring, extra = int(v[1]), v[2:]
        if extra.startswith("@"):
            os.environ["REGPATH_SRC"], extra = extra[1:].split(" ", 1) if " " in extra else (extra[1:], "")
        lib = b.build(ring, extra, out)
        o, _ = b.run(lib, qs[0], cache, idxs[0], 1, bufs)
        torch.cuda.synchronize()
        ok = close(o, ref).passed
        t = time_gpu([lambda q=q, i=i: b.run(lib, q, cache, i, 1, bufs) for q, i in zip(qs, idxs)])
        print(f"variant [{v}] {args.case}: {t.median_ms:.4f} ms  passed={ok}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
