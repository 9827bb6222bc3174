"""Per-opcode totals of the register kernel's ncu SASS pages (sass-nope.csv.gz, sass-shim.csv.gz):
instructions executed and warp-state samples, each as a share of the kernel's, and the loader's
part (the instructions that run once per refill of a ring slot, 62 of the 65 blocks a CTA at
width 2176). Writes opcodes.csv.

    python3 summarize.py
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
EXEC, SAMPLES = "Instructions Executed", "Warp Stall Sampling (All Samples)"
TOKENS, WARPS = 512, 4  # CTAs (one a token) and warps a CTA
BLOCKS, REFILLS = 65, 62  # blocks a CTA at width 2176 (2051 active, 32 keys a block); refills


def sass(mode: str) -> pd.DataFrame:
    with gzip.open(HERE / f"sass-{mode}.csv.gz", "rt") as f:
        lines = f.read().splitlines()
    d = pd.read_csv(io.StringIO("\n".join(lines[1:])))  # the first line names the kernel
    for col in (EXEC, SAMPLES):
        d[col] = pd.to_numeric(d[col].astype(str).str.replace(",", ""), errors="coerce").fillna(0)
    source = d.Source.str.strip().str.replace(r"^@!?U?P\w+\s+", "", regex=True)
    return d.assign(op=source.str.split().str[0].str.split(".").str[0])


rows = []
for mode in ("nope", "shim"):
    d = sass(mode)
    warp_blocks = TOKENS * BLOCKS * WARPS  # the block loop's instructions run this often
    loader = d[d[EXEC] == TOKENS * REFILLS * WARPS][EXEC].sum()
    ops = d.groupby("op")[[EXEC, SAMPLES]].sum()
    ops["exec_pct"] = 100 * ops[EXEC] / ops[EXEC].sum()
    ops["samples_pct"] = 100 * ops[SAMPLES] / ops[SAMPLES].sum()
    ops = ops.sort_values(EXEC, ascending=False).reset_index().assign(mode=mode)
    rows.append(ops)
    print(
        f"{mode}: {ops[EXEC].sum() / warp_blocks:.0f} instructions a warp a block; the loader "
        f"{loader / warp_blocks:.0f} ({100 * loader / ops[EXEC].sum():.1f}%); the dequantization "
        f"(FMUL, F2FP, HADD2) {ops[ops.op.isin(['FMUL', 'F2FP', 'HADD2'])].exec_pct.sum():.1f}%"
    )
    print(ops.head(12)[["op", EXEC, "exec_pct", "samples_pct"]].round(1).to_string(index=False))
out = pd.concat(rows)
out["gpu"], out["driver"], out["git_sha"], out["date"] = (
    "NVIDIA H100 80GB HBM3",
    "580.159.04",
    "1dbe30b",
    "2026-12-06",
)
out.to_csv(HERE / "opcodes.csv", index=False, float_format="%.3f")
