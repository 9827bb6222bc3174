"""Where each warp-specialised partition of a kernel spends its time, from Nsight Compute's
source-level stall sampling (a developer tool).

A Gluon warp-specialised kernel's SASS holds each partition's code in one stretch that starts
with its register reallocation (USETMAXREG); this splits the SASS table there and prints, per
stretch, its share of all samples and its main stall reasons, then the most-sampled
instructions. With --shared it prints instead where the shared-memory traffic goes: the L1
shared wavefronts (all, beyond the ideal, the ideal) of each SASS opcode, per executed warp
instruction and per `--blocks` (the kernel's KV blocks, for a per-block count).

    ncu --clock-control none -k regex:hopper_wide --launch-skip 2 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters --import-source no -o prof \\
        python3 tools/profile_native.py --wide --heads 64 --tokens 512
    ncu -i prof.ncu-rep --page source --csv --print-source sass > src.csv
    python3 tools/ncu_partitions.py src.csv [--top 30]
    python3 tools/ncu_partitions.py src.csv --shared [--blocks 16896]
"""

from __future__ import annotations

import argparse
import re

import pandas as pd

SAMPLES = "Warp Stall Sampling (All Samples)"
WAVES = {
    "wavefronts": "L1 Wavefronts Shared",
    "excessive": "L1 Wavefronts Shared Excessive",
    "ideal": "L1 Wavefronts Shared Ideal",
}


def load(path: str) -> pd.DataFrame:
    """The SASS table: one row per instruction, numeric sample and stall columns."""
    df = pd.read_csv(path, skiprows=1)  # the first line names the kernel
    df = df[df.Address.notna()].reset_index(drop=True)
    for col in [SAMPLES, "Instructions Executed", *stall_columns(df), *WAVES.values()]:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0)
    return df


def stall_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("stall_") and "Not Issued" not in c]


def partitions(df: pd.DataFrame) -> list[tuple[int, int, str]]:
    """(first row, end row, register reallocation) of each stretch of the SASS."""
    marks = [i for i, s in enumerate(df.Source) if "USETMAXREG" in str(s)]
    bounds = [0, *marks, len(df)]
    return [
        (a, b, re.sub(r"\s+", " ", str(df.Source[a])).strip() if a in marks else "prologue")
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def shared_traffic(df: pd.DataFrame, blocks: int | None) -> pd.DataFrame:
    """Shared wavefronts by opcode (predicates dropped), most first, with their share of the
    total and, per executed instruction and per block, the wavefronts and the ideal."""
    ops = df.Source.astype(str).str.replace(r"^\s*@!?U?P\w+\s+", "", regex=True)
    by = df.assign(op=ops.str.split().str[0]).groupby("op")
    t = (
        by[[*WAVES.values(), "Instructions Executed"]]
        .sum()
        .rename(
            columns={v: k for k, v in WAVES.items()} | {"Instructions Executed": "instructions"}
        )
    )
    t = t[t.wavefronts > 0].sort_values("wavefronts", ascending=False)
    t["share"] = t.wavefronts / t.wavefronts.sum()
    t["per_instruction"] = t.wavefronts / t.instructions
    t["ideal_per_instruction"] = t.ideal / t.instructions
    if blocks:
        t["per_block"] = t.wavefronts / blocks
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=20, help="most-sampled instructions to list")
    ap.add_argument("--shared", action="store_true", help="shared-memory wavefronts by opcode")
    ap.add_argument("--blocks", type=int, help="with --shared: KV blocks the kernel ran")
    args = ap.parse_args()
    df = load(args.csv)
    if args.shared:
        if not set(WAVES.values()) <= set(df.columns):
            raise SystemExit(
                f"error: {args.csv} has no shared-wavefront columns "
                "(profile with --section SourceCounters, as above)"
            )
        t = shared_traffic(df, args.blocks)
        print(t.to_string(float_format=lambda v: f"{v:.3g}"))
        print(f"total {int(t.wavefronts.sum())} wavefronts, {int(t.excessive.sum())} beyond ideal")
        return
    stalls = stall_columns(df)
    total = df[SAMPLES].sum()
    share = lambda v: f"{100 * v / total:.1f}%"  # noqa: E731
    print(f"{int(total)} samples")
    for a, b, mark in partitions(df):
        part = df.iloc[a:b]
        if part[SAMPLES].sum() < 0.005 * total:
            continue
        top = part[stalls].sum().sort_values(ascending=False).head(5)
        reasons = ", ".join(f"{k.removeprefix('stall_')} {share(v)}" for k, v in top.items())
        print(f"rows {a}-{b} ({mark}): {share(part[SAMPLES].sum())} of samples; {reasons}")
    print("\nmost-sampled instructions:")
    for i, row in df.sort_values(SAMPLES, ascending=False).head(args.top).iterrows():
        top = row[stalls].sort_values(ascending=False).head(2)
        why = ", ".join(f"{k.removeprefix('stall_')} {share(v)}" for k, v in top.items() if v)
        print(f"{i:5d} {share(row[SAMPLES]):>6} {str(row.Source).strip()[:64]:64} {why}")


if __name__ == "__main__":
    main()
