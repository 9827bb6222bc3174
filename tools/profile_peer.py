"""Launch one bench-decode implementation (native or a peer) on one cell inside an NVTX range
named "profile", for Nsight Compute (a developer tool). The cache, queries and index rows are
the ones bench-decode builds for that cell, and the output is checked as bench-decode checks it
(poisoned, run again, the first query tokens against the reference under the implementation's
tolerance) before anything is launched in the range.

    ncu --clock-control none --nvtx --nvtx-include "profile/" --section SpeedOfLight \\
        --section LaunchStats --section Occupancy --csv --page details \\
        python3 tools/profile_peer.py --impl flashinfer-fa3-bf16 --heads 128 --tokens 512
"""

from __future__ import annotations

import argparse
import sys

import torch

from nopebench.bench.decode_cases import DecodeCase, build_cache, make_problem
from nopebench.bench.decode_runner import check_output
from nopebench.config import load_model_config
from nopebench.impls import registry as impl_registry
from nopebench.impls.reference import reference_of

CHECK_TOKENS = 8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, choices=impl_registry.names())
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--width", type=int, default=2176)
    ap.add_argument("--active", type=int, default=2051)
    ap.add_argument("--mode", default="nope", choices=("nope", "shim"))
    ap.add_argument("--rows", type=int, default=1 << 20, help="cache rows (bench-decode's)")
    ap.add_argument("--launches", type=int, default=2, help="launches inside the range")
    ap.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run, no range"
    )
    args = ap.parse_args()
    model = load_model_config("glm53-flash")
    case = DecodeCase(args.heads, args.tokens, args.width, args.active, args.mode)
    cache, usable = build_cache(
        args.mode, args.rows, model.block_size, model.kv_scale_format, args.device
    )
    problem = make_problem(case, cache, usable, model, 0)
    # Plans, JIT builds and the check's two runs all happen before the range.
    run = impl_registry.prepare(problem, args.impl)
    tokens = min(CHECK_TOKENS, args.tokens)
    ref, lse = reference_of(problem, tokens)
    tolerance = impl_registry.lookup(args.impl).tolerance
    check = check_output(run, ref, lse, tokens, tolerance)
    if not check["passed"]:
        print(f"error: {args.impl} on {case.case_id}: {check['check_detail']}", file=sys.stderr)
        return 1
    if args.device == "cuda":
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("profile"):
            for _ in range(args.launches):
                run()
        torch.cuda.synchronize()
    launched = args.launches if args.device == "cuda" else 0
    print(f"{args.impl} {case.case_id}: checked, then {launched} launches in the range")
    return 0


if __name__ == "__main__":
    sys.exit(main())
