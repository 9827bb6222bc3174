"""Tuning sweep for the native decode kernels (a developer tool, not a product command).

Checks every launch variant against the reference, then times it with the project's one timing
function, on the bench-decode problem: bench-decode's 1M-row cache (cases.build_cache: unused
rows NaN-poisoned), 2176-wide index rows with 2051 random valid slots and a -1 tail.
Writes tune.csv (every variant) to $OUT or ./tune-out and prints the best per case.

    PYTHONPATH=$PWD:/tmp/site python3 tools/tune_native.py [--quick]            # portable kernel
    PYTHONPATH=$PWD:/tmp/site python3 tools/tune_native.py --hopper --cases 16x512,64x512,16x1,64x1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from nopebench.bench.decode_cases import build_cache
from nopebench.bench.timing import measure_ceilings, time_gpu
from nopebench.compare import close
from nopebench.environment import environment_header
from nopebench.impls.native.adapter import choose_plan, native_decode
from nopebench.impls.native.plans import (
    LaunchPlan,
    installed_triton,
    next_pow2,
    plan_hopper,
    plan_hopper_wide,
    plan_hopper_ws,
    plan_launch,
    plan_register,
    wide_q_reg_tiles,
)
from nopebench.impls.reference import sparse_decode_reference
from nopebench.records import write_csv, write_json

ROWS = 1 << 20
TOPK = 2051  # index entries that name rows, at most; the rest of a width are -1
WIDTH, ACTIVE = 2176, TOPK


def set_width(width: int) -> None:
    """Index entries per query token for every case, and how many of them name rows."""
    global WIDTH, ACTIVE
    WIDTH, ACTIVE = width, min(width, TOPK)


def make_indices(tokens: int, usable: int, gen: torch.Generator) -> torch.Tensor:
    idx = torch.full((tokens, WIDTH), -1, dtype=torch.int32, device="cuda")
    idx[:, :ACTIVE] = torch.randint(
        0, usable, (tokens, ACTIVE), device="cuda", generator=gen, dtype=torch.int32
    )
    return idx


def variants(heads: int, tokens: int, quick: bool) -> list[dict]:
    out = []
    bns = (32, 64) if heads <= 32 else (16, 32)
    warps = (4, 8)
    for bn in bns:
        for w in warps:
            out.append(dict(block_n=bn, num_warps=w))
            if not quick:
                out.append(dict(block_n=bn, num_warps=w, prefetch=False, num_stages=2))
                out.append(dict(block_n=bn, num_warps=w, prefetch=False, num_stages=3))
    if tokens >= 128 and not quick:
        out += [
            dict(block_n=bns[0], num_warps=4, splits=2),
            dict(block_n=bns[-1], num_warps=8, splits=2),
        ]
    return out


def explore(heads: int, tokens: int) -> list[dict]:
    """Structural alternatives: deeper splits, factored fp16 products, smaller head blocks."""
    if heads <= 32:
        return [
            dict(block_n=32, num_warps=4, splits=2),
            dict(block_n=32, num_warps=4, splits=4),
            dict(block_n=32, num_warps=4, splits=2, factored=True),
            dict(block_n=64, num_warps=8, splits=2, factored=True),
            dict(block_n=16, num_warps=4, splits=2),
            dict(block_n=16, num_warps=4, splits=2, prefetch=False, num_stages=4),
            dict(block_n=32, num_warps=4, splits=2, prefetch=False, num_stages=3, factored=True),
        ]
    return [
        dict(block_n=32, num_warps=4, prefetch=False, num_stages=2),
        dict(block_n=32, num_warps=4, prefetch=False, num_stages=2, factored=True),
        dict(block_n=32, num_warps=8, factored=True),
        dict(block_n=32, num_warps=4, max_block_h=32),
        dict(block_n=32, num_warps=4, max_block_h=16),
        dict(block_n=64, num_warps=4, max_block_h=16),
        dict(block_n=32, num_warps=4, max_block_h=32, prefetch=False, num_stages=3),
    ]


def hopper_variants(
    heads: int, tokens: int, rope: bool, few_scan: bool = False, wave_scan: bool = False
) -> list[dict]:
    """The SM90 Gluon kernel: its default plan, then the alternatives the planner chose between
    (with `few_scan`, also `planner_scan`'s; with `wave_scan`, `split_scan`'s instead)."""
    cands = [
        dict(kernel="hopper"),
        dict(kernel="hopper", block_n=64),
        dict(kernel="hopper", stages=3),
        dict(kernel="hopper", block_h=32),
        dict(kernel="hopper", block_h=64),
    ]
    if tokens * heads < 132 * 16:
        cands += [
            dict(kernel="hopper", splits=34),
            dict(kernel="hopper", block_n=128, stages=1, block_h=16),
        ]
    if heads % 16 == 0 and heads <= 32:
        # The CUDA C++ register kernel: 16 heads a CTA, as few splits as its staged index allows.
        cands += [dict(kernel="register")]
    if heads <= 32 or tokens < 64:
        # The warp-specialised kernel: its plan, one consumer instead of the role split, other
        # ring depths, 16 heads per program.
        cands += [
            dict(kernel="hopper_ws"),
            dict(kernel="hopper_ws", role_split=False),
            dict(kernel="hopper_ws", slots=3),
            dict(kernel="hopper_ws", slots=2, role_split=False),
            dict(kernel="hopper_ws", block_h=16),
        ]
        # The softmax sums: per block where the plan keeps them per thread, and the other way.
        cands += [
            dict(kernel="hopper_ws", block_h=32, l_partial=False),
            dict(kernel="hopper_ws", block_h=16, l_partial=True),
        ]
    if heads > 32:
        # The 64-head kernel: its plan (three ring slots for NoPE rows, two for RoPE) and two.
        cands += [dict(kernel="hopper_wide"), dict(kernel="hopper_wide", slots=2)]
        # Where the plan holds q's first latent tiles in the scorer's registers (this Triton's
        # `wide_q_reg_tiles`), also q all in shared memory; more tiles spill.
        if wide_q_reg_tiles(rope, installed_triton()):
            cands += [dict(kernel="hopper_wide", q_regs=0)]
    if heads > 32 and not rope:
        # NoPE rows' output warpgroups: the scorer running the left half itself (as for RoPE
        # rows), split off without dequantizing, and dequantizing 16 rows each.
        cands += [
            dict(kernel="hopper_wide", pv_split=False),
            dict(kernel="hopper_wide", helpers=0),
            dict(kernel="hopper_wide", helpers=16),
        ]
    if heads > 64 and not rope:
        # The plan runs the two head blocks in 2-CTA clusters where it can (each CTA
        # dequantizing half of every block, two ring slots): also three slots, and unpaired.
        cands += [
            dict(kernel="hopper_wide", pair=True, slots=3),
            dict(kernel="hopper_wide", pair=False),
        ]
    if heads > 32 and rope:
        # With RoPE lanes (32-row blocks) shared memory has room for a third tile, a second P
        # tile or both, at the cost of ring slots.
        cands += [
            dict(kernel="hopper_wide", kv_bufs=3),
            dict(kernel="hopper_wide", kv_bufs=3, slots=3),
            dict(kernel="hopper_wide", p_bufs=2),
            dict(kernel="hopper_wide", kv_bufs=3, p_bufs=2),
            dict(kernel="hopper_wide", slots=4),
        ]
    if wave_scan:
        cands = split_scan(heads, tokens, rope)
    out, seen = [], set()
    for v in cands + (planner_scan(heads, tokens, rope) if few_scan else []):
        try:
            plan = build_plan(tokens, heads, v, rope)
        except ValueError:
            continue
        if plan not in seen and plan.block_h <= max(16, heads):
            seen.add(plan)
            out.append(v)
    return out


def planner_scan(heads: int, tokens: int, rope: bool) -> list[dict]:
    """The single-role kernel at every head-block size, with the planner's split count, half of it
    and twice it, and the warp-specialised one at 32 heads per program: where the (token, head
    block) programs alone do not fill the SMs, how many heads a program should take and how far
    the top-k range should be cut."""
    out = []
    for bh in (16, 32, 64):
        if bh > max(16, heads):
            continue
        try:
            auto = build_plan(
                tokens, heads, dict(kernel="hopper", block_h=bh, block_n=64, stages=2), rope
            ).splits
        except ValueError:
            continue
        for splits in sorted({auto, max(1, auto // 2), min(34, 2 * auto)}):
            out.append(dict(kernel="hopper", block_h=bh, block_n=64, stages=2, splits=splits))
    if heads >= 32:
        out.append(dict(kernel="hopper_ws", block_h=32, role_split=False))
    return out


def split_scan(heads: int, tokens: int, rope: bool) -> list[dict]:
    """Where the (token, head block) programs do not fill the SMs: each kernel and head-block size
    the planner chooses between, at its own split count and at the counts that keep the
    programs (or the persistent kernel's work items) within one wave of the SMs, half of that
    and twice it. A second wave of a few programs costs as much as the first."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    widest = min(64, max(16, next_pow2(heads)))
    kernels = [
        dict(kernel="hopper", block_h=bh, block_n=64, stages=2) for bh in {widest, min(32, widest)}
    ]
    # The warp-specialised kernels read RoPE rows too (the planner picks them by shape alone).
    kernels += [dict(kernel="hopper_ws", block_h=16)] if heads <= 32 else []
    kernels += [dict(kernel="hopper_ws", block_h=32, role_split=False)] if heads >= 32 else []
    kernels += [dict(kernel="hopper_wide")] if heads >= 64 else []
    out = []
    for v in kernels:
        try:
            auto = build_plan(tokens, heads, v, rope)
        except ValueError:
            continue
        one_wave = max(1, sms // (tokens * auto.head_blocks))
        blocks = -(-WIDTH // auto.block_n)
        counts = {auto.splits, one_wave, max(1, one_wave // 2), min(blocks, 2 * one_wave)}
        out += [{**v, "splits": n} for n in sorted(counts)]
    return out


def build_plan(tokens: int, heads: int, v: dict, rope: bool = False) -> LaunchPlan:
    if v.get("kernel") == "planned":  # what `native` runs at this shape on this GPU
        return choose_plan(tokens, heads, WIDTH, 64 if rope else 0, 0)
    if v.get("kernel") == "register":
        return plan_register(heads, WIDTH, rope=rope, splits=v.get("splits"))
    if v.get("kernel") == "hopper_wide":
        return plan_hopper_wide(
            tokens,
            heads,
            WIDTH,
            torch.cuda.get_device_properties(0).multi_processor_count,
            slots=v.get("slots"),
            splits=v.get("splits"),
            rope=rope,
            **{
                k: v[k]
                for k in ("kv_bufs", "p_bufs", "q_regs", "pv_split", "helpers", "pair")
                if k in v
            },
        )
    if v.get("kernel") == "hopper_ws":
        return plan_hopper_ws(
            tokens,
            heads,
            WIDTH,
            torch.cuda.get_device_properties(0).multi_processor_count,
            slots=v.get("slots"),
            splits=v.get("splits"),
            block_h=v.get("block_h"),
            role_split=v.get("role_split"),
            rope=rope,
            l_partial=v.get("l_partial"),
        )
    if v.get("kernel") == "hopper":
        return plan_hopper(
            tokens,
            heads,
            WIDTH,
            rope,
            torch.cuda.get_device_properties(0).multi_processor_count,
            stages=v.get("stages"),
            splits=v.get("splits"),
            block_n=v.get("block_n"),
            block_h=v.get("block_h"),
        )
    base = plan_launch(
        tokens,
        heads,
        WIDTH,
        torch.cuda.get_device_properties(0).multi_processor_count,
        block_n=v["block_n"],
        num_warps=v["num_warps"],
        splits=v.get("splits"),
        max_block_h=v.get("max_block_h", 64),
    )
    return dataclasses.replace(
        base,
        prefetch=v.get("prefetch", True),
        num_stages=v.get("num_stages", 1),
        factored=v.get("factored", False),
    )


def _parse_variants(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[dict]:
    """--variants, read once before any GPU work: a JSON list of objects, with --hopper (else
    one line from argparse and exit 2)."""
    if not args.hopper:
        ap.error("--variants needs --hopper")
    try:
        given = json.loads(args.variants)
    except json.JSONDecodeError as exc:
        ap.error(f"--variants is not JSON: {exc}")
    if not isinstance(given, list) or not all(isinstance(v, dict) for v in given):
        ap.error("--variants must be a JSON list of objects")
    return given


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="16x512,64x512,16x1,64x1,128x512")
    ap.add_argument(
        "--explore",
        action="store_true",
        help="structural alternatives instead of the block/warp grid",
    )
    ap.add_argument("--modes", default="nope,shim")
    ap.add_argument(
        "--hopper", action="store_true", help="the SM90 Gluon kernel's variants instead"
    )
    ap.add_argument(
        "--few-scan",
        action="store_true",
        help="with --hopper: every head-block size and split count too",
    )
    ap.add_argument(
        "--wave-scan",
        action="store_true",
        help="with --hopper: only split counts around one wave of programs, per kernel",
    )
    ap.add_argument(
        "--kernel",
        default=None,
        help="with --hopper: only this kernel's variants (hopper, hopper_ws or hopper_wide)",
    )
    ap.add_argument(
        "--variants",
        default=None,
        help="with --hopper: a JSON list of variants to time instead of the kernel's own "
        '(build_plan\'s keys, e.g. \'[{"kernel": "hopper_wide", "p_bufs": 2}]\'; '
        '{"kernel": "planned"} is what `native` runs at the shape; "cases": ["32x64"] limits a '
        "variant to those cases)",
    )
    ap.add_argument(
        "--width",
        type=int,
        default=WIDTH,
        help=f"index entries per query token (default {WIDTH}); the first min(width, {TOPK}) "
        "name rows, the rest are -1",
    )
    args = ap.parse_args()
    if args.width < 64:
        ap.error("--width must be at least 64")
    set_width(args.width)
    given = _parse_variants(ap, args) if args.variants else None
    out_dir = Path(os.environ.get("OUT", "tune-out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    ceil = measure_ceilings()
    print(
        f"ceilings: copy {ceil.copy_gbps:.0f} GB/s, bf16 matmul {ceil.matmul_tflops:.0f} TFLOP/s",
        flush=True,
    )
    env = {**environment_header(), **ceil.as_row()}
    # Every row says where it came from, so a tune.csv read without its tune_env.json still does.
    provenance = {
        "git_sha": env.get("git_sha"),
        "git_dirty": env.get("git_dirty"),
        "gpu": env.get("gpu"),
        "driver": env.get("driver"),
        "torch": env["versions"].get("torch"),
        "triton": env["versions"].get("triton"),
        "timestamp": env["timestamp"],
    }
    caches = {
        m: build_cache(m, ROWS, 64, "arbitrary_fp32", "cuda", seed=1234)
        for m in args.modes.split(",")
    }
    rows = []
    for case in args.cases.split(","):
        heads, tokens = map(int, case.split("x"))
        for mode, (cache, usable) in caches.items():
            rope = 64 if mode == "shim" else 0
            sets = 4 if tokens >= 64 else 64
            qs = [
                torch.randn(tokens, heads, 512 + rope, device="cuda", generator=gen)
                .clamp(-1, 1)
                .to(torch.bfloat16)
                for _ in range(sets)
            ]
            if rope:
                for q in qs:
                    q[..., 512:] = 0
            idxs = [make_indices(tokens, usable, gen) for _ in range(sets)]
            ref, ref_lse = sparse_decode_reference(qs[0], cache, idxs[0], 0.0625, rope)
            if args.hopper:
                vs = hopper_variants(heads, tokens, bool(rope), args.few_scan, args.wave_scan)
                vs = [v for v in vs if args.kernel in (None, v.get("kernel"))]
                if given is not None:  # a variant's "cases" (e.g. ["32x64"]) limits it to those
                    vs = [
                        {k: x for k, x in v.items() if k != "cases"}
                        for v in given
                        if case in v.get("cases", [case])
                    ]
            elif args.explore:
                vs = explore(heads, tokens)
            else:
                vs = (
                    variants(heads, tokens, args.quick)
                    if mode == "nope"
                    else variants(heads, tokens, True)
                )
            for v in vs:
                plan = build_plan(tokens, heads, v, bool(rope))
                row = {"heads": heads, "tokens": tokens, "width": WIDTH, "mode": mode}
                row.update(dataclasses.asdict(plan))
                try:
                    t0 = time.time()
                    res = native_decode(qs[0], cache, idxs[0], 0.0625, rope, plan)
                    cmp = close(res.out, ref)
                    lse_err = float((res.lse - ref_lse).abs().max())
                    row.update(
                        passed=cmp.passed,
                        max_abs_err=cmp.max_abs_err,
                        cos_diff=cmp.cos_diff,
                        lse_err=lse_err,
                        compile_s=time.time() - t0,
                    )
                    calls = [
                        lambda q=q, i=i, c=cache, r=rope, p=plan: native_decode(
                            q, c, i, 0.0625, r, p
                        )
                        for q, i in zip(qs, idxs, strict=True)
                    ]
                    tm = time_gpu(calls, budget_s=0.3)
                    row.update(tm.as_row())
                    rb = 528 if rope == 0 else 656
                    row["tbps"] = tokens * ACTIVE * rb / (tm.median_ms * 1e-3) / 1e12
                    row["tflops"] = (
                        2
                        * tokens
                        * heads
                        * ACTIVE
                        * (512 + rope + 512)
                        / (tm.median_ms * 1e-3)
                        / 1e12
                    )
                except Exception as exc:  # noqa: BLE001 - a failing variant is a row, not a crash
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row.update(provenance)
                rows.append(row)
                print(
                    {
                        k: row.get(k)
                        for k in (
                            "heads",
                            "tokens",
                            "mode",
                            "block_h",
                            "block_n",
                            "num_warps",
                            "prefetch",
                            "num_stages",
                            "splits",
                            "kernel",
                            "role_split",
                            "kv_bufs",
                            "p_bufs",
                            "q_regs",
                            "pv_split",
                            "helpers",
                            "pair",
                            "l_partial",
                            "passed",
                            "max_abs_err",
                            "median_ms",
                            "tbps",
                            "tflops",
                            "error",
                        )
                    },
                    flush=True,
                )
            write_csv(out_dir / "tune.csv", rows)
    write_json(out_dir / "tune_env.json", env)
    print("\nbest per case:")
    import pandas as pd

    df = pd.DataFrame(rows)
    ok = df[df.get("passed", False) == True]  # noqa: E712
    for (h, t, m), g in ok.groupby(["heads", "tokens", "mode"]):
        b = g.sort_values("median_ms").iloc[0]
        print(
            f"H={h:<4} T={t:<4} {m:5} {b.median_ms:.4f} ms  bn={b.block_n} w={b.num_warps} "
            f"pf={b.prefetch} "
            f"st={b.num_stages} sp={b.splits} kv={b.kv_bufs} p={b.p_bufs} q={b.q_regs} "
            f"pv={b.pv_split} h={b.helpers} pair={b.pair} "
            f"{b.kernel}{' split' if b.role_split else ''} "
            f"{b.tbps:.2f} TB/s "
            f"{b.tflops:.0f} TFLOP/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
