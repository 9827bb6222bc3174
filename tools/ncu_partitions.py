"""Where each warp-specialised partition of a kernel spends its time, from Nsight Compute's
source-level stall sampling (a developer tool).

A Gluon warp-specialised kernel's SASS holds each partition's code in one stretch that starts
with its register reallocation (USETMAXREG); this splits the SASS table there and prints, per
stretch, its share of all samples and its main stall reasons, then the most-sampled
instructions.

    ncu --clock-control none -k regex:hopper_wide --launch-skip 2 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters --import-source no -o prof \\
        python3 tools/profile_native.py --wide --heads 64 --tokens 512
    ncu -i prof.ncu-rep --page source --csv --print-source sass > src.csv
    python3 tools/ncu_partitions.py src.csv [--top 30]
"""

from __future__ import annotations

import argparse
import re

import pandas as pd

SAMPLES = "Warp Stall Sampling (All Samples)"


def load(path: str) -> pd.DataFrame:
    """The SASS table: one row per instruction, numeric sample and stall columns."""
    df = pd.read_csv(path, skiprows=1)  # the first line names the kernel
    df = df[df.Address.notna()].reset_index(drop=True)
    for col in [SAMPLES, "Instructions Executed", *stall_columns(df)]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=20, help="most-sampled instructions to list")
    args = ap.parse_args()
    df = load(args.csv)
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
