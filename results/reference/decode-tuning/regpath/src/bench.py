"""Prototype check and A/B: the register-path kernel (regpath.cu) against the planned native
kernel, on tune_native's problem (1M-row NaN-poisoned cache, 2051 active entries, -1 tail).

    PYTHONPATH=$PWD:/tmp/site python3 results/reference/decode-tuning/regpath/src/bench.py --rings 2,3 --cases 16x512,16x128
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "tools"))
import tune_native as tn  # noqa: E402

from nopebench.bench.decode_cases import build_cache  # noqa: E402
from nopebench.bench.timing import measure_ceilings, time_gpu  # noqa: E402
from nopebench.compare import close  # noqa: E402
from nopebench.environment import environment_header  # noqa: E402
from nopebench.impls.native import triton_decode as td  # noqa: E402
from nopebench.impls.native.adapter import DecodeBuffers, choose_plan, native_decode  # noqa: E402
from nopebench.impls.reference import sparse_decode_reference  # noqa: E402

HERE = Path(__file__).resolve().parent


def build(ring: int, extra: str, out: Path) -> ctypes.CDLL:
    so = out / f"{os.environ.get('REGPATH_SRC', 'regpath.cu')[:-3]}-r{ring}{extra.replace(' ', '').replace('-D', '_')}.so"
    cmd = ["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC",
           "-Xptxas", "-v", "-lineinfo", f"-DRING={ring}", f"-DDEPTH={ring}", *extra.split(),
           "-o", str(so), str(HERE / os.environ.get("REGPATH_SRC", "regpath.cu"))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(" ".join(l for l in r.stderr.splitlines() if "Used" in l or "spill" in l), flush=True)
    if r.returncode:
        print(r.stderr)
        raise SystemExit(2)
    lib = ctypes.CDLL(str(so))
    p, i, ll, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
    lib.regpath_decode.argtypes = [p] * 7 + [i] * 6 + [ll] * 3 + [f, p]
    lib.regpath_decode.restype = i
    return lib


def run(lib, q, cache, idx, splits, bufs):
    tokens, heads, _ = q.shape
    width = idx.shape[1]
    per = math.ceil(width / splits / 32) * 32
    out, lse, part, plse = bufs
    rc = lib.regpath_decode(
        q.data_ptr(), cache.data_ptr(), idx.data_ptr(), part.data_ptr(), plse.data_ptr(),
        out.data_ptr(), lse.data_ptr(), tokens, heads, width, per, splits, cache.shape[-1],
        q.stride(0), q.stride(1), idx.stride(0), 0.0625 * td.LOG2E,
        torch.cuda.current_stream().cuda_stream)
    if rc:
        raise RuntimeError(f"launch failed: {rc}")
    if splits > 1:
        td.combine_kernel[(tokens * heads,)](
            part, plse, out, lse, heads, splits, part.stride(0), part.stride(1),
            part.stride(2), plse.stride(0), plse.stride(1), out.stride(0), out.stride(1),
            BLOCK_S=max(2, 1 << (splits - 1).bit_length()), num_warps=4)
    return out, lse


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="16x128,16x512,32x128,32x512")
    ap.add_argument("--rings", default="3")
    ap.add_argument("--extra", default="")
    ap.add_argument("--widths", default="2176")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "regpath-out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    libs = {r: build(int(r), args.extra, out_dir) for r in args.rings.split(",")}
    ceil = measure_ceilings()
    env = {**environment_header(), **ceil.as_row()}
    (out_dir / "env.json").write_text(json.dumps(env, indent=1, default=str))
    gen = torch.Generator(device="cuda").manual_seed(1234)
    cache, usable = build_cache("nope", tn.ROWS, 64, "arbitrary_fp32", "cuda", seed=1234)
    lib0 = next(iter(libs.values()))
    for dh, dt, dw in ((16, 3, 64), (16, 2, 176), (32, 2, 96)):
        q = torch.randn(dt, dh, 512, device="cuda", generator=gen).clamp(-1, 1).to(torch.bfloat16)
        idx = torch.randint(0, usable, (dt, dw), device="cuda", generator=gen, dtype=torch.int32)
        idx[:, -5:] = -1
        ref, ref_lse = sparse_decode_reference(q, cache, idx, 0.0625, 0)
        for splits in (1, 2):
            bufs = (torch.full((dt, dh, 512), float("nan"), dtype=torch.bfloat16, device="cuda"),
                    torch.full((dt, dh), float("nan"), device="cuda"),
                    torch.full((splits, dt, dh, 512), float("nan"), device="cuda"),
                    torch.full((splits, dt, dh), float("nan"), device="cuda"))
            o, lse = run(lib0, q, cache, idx, splits, bufs)
            torch.cuda.synchronize()
            cmp = close(o, ref)
            err = (o.float() - ref.float()).abs()
            print(f"debug {dh}x{dt} w{dw} s{splits}: {cmp.passed} {cmp.detail} "
                  f"lse {float((lse - ref_lse).abs().max()):.3g} "
                  f"err by 16-dim group {err.amax(dim=(0, 1)).view(32, 16).amax(1).tolist()}",
                  flush=True)
    rows = []
    for width in map(int, args.widths.split(",")):
        tn.set_width(width)
        for case in args.cases.split(","):
            heads, tokens = map(int, case.split("x"))
            sets = 4 if tokens >= 64 else 64
            qs = [torch.randn(tokens, heads, 512, device="cuda", generator=gen).clamp(-1, 1)
                  .to(torch.bfloat16) for _ in range(sets)]
            idxs = [tn.make_indices(tokens, usable, gen) for _ in range(sets)]
            ref, ref_lse = sparse_decode_reference(qs[0], cache, idxs[0], 0.0625, 0)
            nbytes = tokens * tn.ACTIVE * 528 + tokens * heads * 512 * 4
            flops = 4 * tokens * heads * tn.ACTIVE * 512
            roof = max(nbytes / ceil.copy_gbps / 1e6, flops / ceil.matmul_tflops / 1e9)
            plan = choose_plan(tokens, heads, width, 0, "cuda")
            nb = DecodeBuffers.allocate(tokens, heads, plan, "cuda")
            res = native_decode(qs[0], cache, idxs[0], 0.0625, 0, plan, nb)
            assert close(res.out, ref).passed
            calls = [lambda q=q, i=i: native_decode(q, cache, i, 0.0625, 0, plan, nb)
                     for q, i in zip(qs, idxs)]
            t = time_gpu(calls)
            base = {"heads": heads, "tokens": tokens, "width": width, "roofline_ms": roof}
            rows.append({**base, "impl": "native", "ms": t.median_ms, "passed": True})
            hg = heads // 16
            split_opts = sorted({max(1, min(8, math.ceil(264 / (tokens * hg)))), 1} | (
                {2, 4} if tokens * hg < 264 else set()))
            for ring, lib in libs.items():
                for splits in split_opts:
                    mk = lambda: (  # noqa: E731
                        torch.full((tokens, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda"),
                        torch.full((tokens, heads), float("nan"), device="cuda"),
                        torch.full((splits, tokens, heads, 512), float("nan"), device="cuda"),
                        torch.full((splits, tokens, heads), float("nan"), device="cuda"))
                    bufs = mk()
                    o, lse = run(lib, qs[0], cache, idxs[0], splits, bufs)
                    torch.cuda.synchronize()
                    cmp = close(o, ref)
                    lse_err = float((lse - ref_lse).abs().max())
                    tcalls = [lambda q=q, i=i, b=bufs: run(lib, q, cache, i, splits, b)
                              for q, i in zip(qs, idxs)]
                    tt = time_gpu(tcalls)
                    rows.append({**base, "impl": f"regpath-r{ring}-s{splits}", "ms": tt.median_ms,
                                 "passed": cmp.passed, "max_abs_err": cmp.max_abs_err,
                                 "cos_diff": cmp.cos_diff, "lse_err": lse_err,
                                 "detail": cmp.detail})
                    print(rows[-1], flush=True)
            print(rows[-1 - len(libs) * len(split_opts)], flush=True)
    import csv

    with open(out_dir / "regpath.csv", "w", newline="") as f:
        keys = sorted({k for r in rows for k in r})
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    print("\nheads tokens width impl ms vs_native pct_roof passed")
    nat = {}
    for r in rows:
        if r["impl"] == "native":
            nat[(r["heads"], r["tokens"], r["width"])] = r["ms"]
    for r in rows:
        n = nat[(r["heads"], r["tokens"], r["width"])]
        print(f"{r['heads']:3d} {r['tokens']:4d} {r['width']} {r['impl']:16s} {r['ms']:.4f} "
              f"{n / r['ms']:.3f} {100 * r['roofline_ms'] / r['ms']:.1f} {r['passed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
