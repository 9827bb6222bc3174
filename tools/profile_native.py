"""Launch one native decode variant a few times, for `ncu` (a developer tool).

    ncu --clock-control none -k regex:sparse_decode --launch-skip 2 --launch-count 1 \
        python3 tools/profile_native.py --heads 16 --tokens 512 --block-n 32 --splits 2
    ncu --clock-control none -k regex:hopper_decode --launch-skip 2 --launch-count 1 \
        python3 tools/profile_native.py --hopper --heads 16 --tokens 512
    ncu --clock-control none -k regex:hopper_ws --launch-skip 2 --launch-count 1 \
        python3 tools/profile_native.py --ws --heads 16 --tokens 512
    ncu --clock-control none -k regex:hopper_wide --launch-skip 2 --launch-count 1 \
        python3 tools/profile_native.py --wide --heads 64 --tokens 512
    ncu --clock-control none -k regex:register_decode --launch-skip 2 --launch-count 1 \
        python3 tools/profile_native.py --register --heads 16 --tokens 512
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from nopebench.bench.decode_cases import build_cache
from nopebench.impls.native.adapter import native_decode
from nopebench.impls.native.plans import (
    plan_hopper,
    plan_hopper_wide,
    plan_hopper_ws,
    plan_launch,
    plan_register,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--block-n", type=int, default=32)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--splits", type=int, default=None)
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("--factored", action="store_true")
    ap.add_argument("--max-block-h", type=int, default=64)
    ap.add_argument(
        "--hopper", action="store_true", help="the SM90 Gluon kernel (--stages, --splits apply)"
    )
    ap.add_argument(
        "--ws", action="store_true", help="the warp-specialised SM90 kernel (--splits applies)"
    )
    ap.add_argument("--wide", action="store_true", help="the 64-head SM90 kernel")
    ap.add_argument(
        "--register", action="store_true", help="the CUDA C++ register kernel (--splits applies)"
    )
    ap.add_argument("--rope", action="store_true", help="576-wide QK (shim rows)")
    args = ap.parse_args()
    rows, width, active = 1 << 20, 2176, 2051
    rope = 64 if args.rope else 0
    cache, usable = build_cache("shim" if rope else "nope", rows, 64, "arbitrary_fp32", "cuda")
    idx = torch.full((args.tokens, width), -1, dtype=torch.int32, device="cuda")
    idx[:, :active] = torch.randint(
        0, usable, (args.tokens, active), device="cuda", dtype=torch.int32
    )
    q = (
        torch.randn(args.tokens, args.heads, 512 + rope, device="cuda")
        .clamp(-1, 1)
        .to(torch.bfloat16)
    )
    plan = plan_launch(
        args.tokens,
        args.heads,
        width,
        torch.cuda.get_device_properties(0).multi_processor_count,
        block_n=args.block_n,
        num_warps=args.warps,
        splits=args.splits,
        max_block_h=args.max_block_h,
    )
    plan = dataclasses.replace(
        plan, prefetch=not args.no_prefetch, num_stages=args.stages, factored=args.factored
    )
    if args.hopper:
        plan = plan_hopper(
            args.tokens,
            args.heads,
            width,
            bool(rope),
            stages=args.stages,
            splits=args.splits,
            block_n=args.block_n,
        )
    if args.ws:
        plan = plan_hopper_ws(args.tokens, args.heads, width, splits=args.splits, rope=bool(rope))
    if args.wide:
        plan = plan_hopper_wide(args.tokens, args.heads, width, splits=args.splits, rope=bool(rope))
    if args.register:
        plan = plan_register(args.heads, width, rope=bool(rope), splits=args.splits)
    for _ in range(4):
        native_decode(q, cache, idx, 0.0625, rope, plan)
    torch.cuda.synchronize()
    print(plan)


if __name__ == "__main__":
    main()
