"""Device driver for the reg16 prototype: build variants, check against the reference on every
query token, time beside the planned native kernel in the same process (CUDA graphs)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from nopebench.bench.decode_cases import build_cache
from nopebench.bench.timing import time_gpu
from nopebench.compare import close
from nopebench.environment import environment_header
from nopebench.impls.native import triton_decode as tk
from nopebench.impls.native.adapter import native_decode
from nopebench.impls.reference import sparse_decode_reference

OUT = Path(os.environ.get("OUT", "reg16-out"))
OUT.mkdir(parents=True, exist_ok=True)
HERE = Path(__file__).resolve().parent
ROWS, TOPK = 1 << 20, 2051
SCALE = 0.0625
LOG2E = 1.4426950408889634


def build(stages: int, minb: int, extra: str = "") -> ctypes.CDLL:
    so = Path(f"/tmp/reg16_s{stages}_b{minb}{extra.replace(' ', '').replace('-D', '_')}.so")
    cmd = [
        "nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC",
        "-Xptxas", "-v", f"-DSTAGES={stages}", f"-DMINB={minb}", *extra.split(),
        "-o", str(so), str(HERE / "reg16.cu"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    (OUT / f"ptxas-{so.stem}.txt").write_text(r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    lib = ctypes.CDLL(str(so))
    lib.reg16_launch.restype = ctypes.c_int
    return lib


def make_indices(tokens, width, usable, gen):
    idx = torch.full((tokens, width), -1, dtype=torch.int32, device="cuda")
    act = min(width, TOPK)
    idx[:, :act] = torch.randint(0, usable, (tokens, act), device="cuda", generator=gen,
                                 dtype=torch.int32)
    return idx


class Reg16:
    def __init__(self, lib, tokens, width, sms=132, splits=None, per_sm=2):
        self.lib = lib
        if splits is None:
            slots = per_sm * sms
            if tokens < slots:
                splits = max(1, min(width // 64, -(-slots // tokens)))
            else:
                effs = []
                for s in range(1, 5):
                    waves = tokens * s / slots
                    effs.append((waves / -(-waves // 1), s))
                good = [s for e, s in effs if e >= 0.9]
                splits = good[0] if good else max(effs)[1]
        per = -(-width // splits)
        per = -(-per // 32) * 32
        self.splits = -(-width // per)
        self.per = per
        self.out = torch.empty(tokens, 16, 512, dtype=torch.bfloat16, device="cuda")
        self.lse = torch.empty(tokens, 16, dtype=torch.float32, device="cuda")
        self.part = torch.empty(self.splits, tokens, 16, 512, dtype=torch.float32, device="cuda")
        self.plse = torch.empty(self.splits, tokens, 16, dtype=torch.float32, device="cuda")

    def __call__(self, q, cache, idx):
        tokens, width = idx.shape
        rc = self.lib.reg16_launch(
            ctypes.c_void_p(q.data_ptr()), ctypes.c_longlong(q.stride(0)),
            ctypes.c_void_p(cache.data_ptr()), ctypes.c_void_p(idx.data_ptr()),
            ctypes.c_longlong(idx.stride(0)), ctypes.c_int(width), ctypes.c_int(self.per),
            ctypes.c_int(self.splits), ctypes.c_float(SCALE * LOG2E),
            ctypes.c_void_p(self.out.data_ptr()), ctypes.c_void_p(self.lse.data_ptr()),
            ctypes.c_void_p(self.part.data_ptr()), ctypes.c_void_p(self.plse.data_ptr()),
            ctypes.c_int(tokens), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
        )
        if rc:
            raise RuntimeError(f"launch failed: {rc}")
        if self.splits > 1:
            p, pl = self.part, self.plse
            tk.combine_kernel[(tokens * 16,)](
                p, pl, self.out, self.lse, 16, self.splits, p.stride(0), p.stride(1),
                p.stride(2), pl.stride(0), pl.stride(1), self.out.stride(0), self.out.stride(1),
                BLOCK_S=1 << max(0, (self.splits - 1).bit_length()),
            )
        return self.out, self.lse


def main() -> int:
    cases = os.environ.get("CASES", "16x1,16x8,16x64,16x128,16x512")
    widths = [int(x) for x in os.environ.get("WIDTHS", "2176").split(",")]
    variants = json.loads(os.environ.get("VARIANTS", '[[4, 2, ""]]'))
    env = environment_header()
    (OUT / "env.json").write_text(json.dumps(env, indent=1, default=str))
    libs = {tuple(v): build(*v) for v in variants}
    mode = os.environ.get("MODE", "nope")
    rope = 64 if mode == "shim" else 0
    cache, usable = build_cache(mode, ROWS, 64, "arbitrary_fp32", "cuda", seed=1234)
    random_rope = rope and os.environ.get("RANDOM_ROPE") == "1"
    if random_rope:  # nonzero RoPE lanes in the cache and in q, to check the RoPE k-step itself
        g0 = torch.Generator(device="cuda").manual_seed(7)
        lanes = torch.randn(usable, 64, device="cuda", generator=g0).to(torch.bfloat16)
        cache.view(-1, cache.shape[-1])[:usable, 528:] = lanes.view(torch.uint8)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    rows = []
    for width in widths:
        for case in cases.split(","):
            heads, tokens = map(int, case.split("x"))
            sets = 4 if tokens >= 64 else 64
            qs = [torch.randn(tokens, heads, 512 + rope, device="cuda", generator=gen)
                  .clamp(-1, 1).to(torch.bfloat16) for _ in range(sets)]
            if not random_rope:
                for qq in qs:
                    qq[..., 512:] = 0  # the shim's q: zero RoPE lanes
            idxs = [make_indices(tokens, width, usable, gen) for _ in range(sets)]
            ref, ref_lse = sparse_decode_reference(qs[0], cache, idxs[0], SCALE, rope)
            base = dict(heads=heads, tokens=tokens, width=width,
                        mode=mode + ("+random-rope" if random_rope else ""))
            # planned native kernel
            res = native_decode(qs[0], cache, idxs[0], SCALE, rope)
            cmp = close(res.out, ref)
            tm = time_gpu([lambda q=q, i=i: native_decode(q, cache, i, SCALE, rope)
                           for q, i in zip(qs, idxs)], budget_s=0.3)
            rows.append({**base, "impl": "native", "passed": cmp.passed,
                         "max_abs_err": cmp.max_abs_err, "cos_diff": cmp.cos_diff,
                         "lse_err": float((res.lse - ref_lse).abs().max()),
                         "median_ms": tm.median_ms})
            print(rows[-1], flush=True)
            for v, lib in libs.items():
                runs = [Reg16(lib, tokens, width, per_sm=v[1]) for _ in range(sets)]
                r0 = runs[0]
                r0(qs[0], cache, idxs[0])
                r0.out.fill_(float("nan"))
                r0.lse.fill_(float("nan"))
                out, lse = r0(qs[0], cache, idxs[0])
                torch.cuda.synchronize()
                cmp = close(out, ref)
                fin = torch.isfinite(ref_lse)
                lerr = float((lse[fin] - ref_lse[fin]).abs().max()) if fin.any() else 0.0
                tm = time_gpu([lambda r=r, q=q, i=i: r(q, cache, i)
                               for r, q, i in zip(runs, qs, idxs)], budget_s=0.3)
                rows.append({**base, "impl": f"reg16 s{v[0]} b{v[1]} {v[2]}",
                             "splits": r0.splits, "passed": cmp.passed,
                             "max_abs_err": cmp.max_abs_err, "cos_diff": cmp.cos_diff,
                             "detail": cmp.detail[:200], "lse_err": lerr,
                             "median_ms": tm.median_ms,
                             "vs_native": rows[-1 - list(libs).index(v)]["median_ms"]
                             / tm.median_ms})
                print(rows[-1], flush=True)
    import csv

    with open(OUT / "reg16.csv", "w", newline="") as f:
        keys = sorted({k for r in rows for k in r})
        wr = csv.DictWriter(f, keys)
        wr.writeheader()
        wr.writerows(rows)
    print("\n| case | impl | splits | passed | ms | native/this |")
    for r in rows:
        print(f"| {r['heads']}x{r['tokens']} w{r['width']} | {r['impl']} | {r.get('splits', '')} "
              f"| {r['passed']} | {r['median_ms']:.4f} | {r.get('vs_native', 1):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
