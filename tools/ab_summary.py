"""Summarise an A/B timing of two forms of a kernel from `tools/tune_native.py` runs packed in
one tarball: each run's directory is named `<form>-<width>-r<rep>` (the forms `new` and
`before`), each holds a tune.csv. Per shape and mode: the named kernel's median ms in each run,
the fixed reference kernel's median over all runs (the same source in every process, so its
spread is the run-to-run noise), and new over before (the median of each form's runs). Writes
the table as CSV with the environment of the first row and prints the ratios. `--kernel` may name
several kernels, comma-separated, where each shape runs one of them (as a planned variant does).

    python3 tools/ab_summary.py TUNE_TARBALL OUT_CSV [--kernel register] [--reference hopper_ws]
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path

import pandas as pd

KEYS = ["heads", "tokens", "width", "mode"]
ENV = ("gpu", "driver", "torch", "triton", "git_sha", "timestamp")


def load(tarball: Path) -> pd.DataFrame:
    with tarfile.open(tarball) as tar:
        frames = [
            pd.read_csv(io.BytesIO(tar.extractfile(m).read())).assign(run=Path(m.name).parent.name)
            for m in tar.getmembers()
            if m.name.endswith("tune.csv")
        ]
    if not frames:
        raise SystemExit(f"error: no tune.csv in {tarball}")
    d = pd.concat(frames)
    d["form"] = d.run.str.split("-").str[0]
    return d


def summarise(d: pd.DataFrame, kernels: list[str], reference: str) -> pd.DataFrame:
    if not d.passed.all():
        raise SystemExit("error: a timed variant failed its check; its time means nothing")
    forms = set(d.form)
    if forms != {"new", "before"}:
        raise SystemExit(f"error: runs must be named new-* and before-*, found {sorted(forms)}")
    timed = d[d.kernel.isin(kernels)]
    out = timed.pivot_table(index=KEYS, columns="run", values="median_ms")
    ref = d[d.kernel == reference].groupby(KEYS).median_ms
    out[f"{reference}_ms"] = ref.median()
    out[f"{reference}_spread"] = ref.max() / ref.min()
    by_form = timed.groupby(KEYS + ["form"]).median_ms.median().unstack("form")
    out["new_over_before"] = by_form["new"] / by_form["before"]
    for col in ENV:
        out[col] = d.iloc[0][col]
    return out.reset_index()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tarball", type=Path)
    ap.add_argument("out_csv", type=Path)
    ap.add_argument("--kernel", default="register")
    ap.add_argument("--reference", default="hopper_ws")
    a = ap.parse_args(argv)
    if not a.tarball.is_file():
        raise SystemExit(f"error: no such file: {a.tarball}")
    out = summarise(load(a.tarball), a.kernel.split(","), a.reference)
    out.to_csv(a.out_csv, index=False, float_format="%.5f")
    cols = KEYS + [f"{a.reference}_spread", "new_over_before"]
    print(out[cols].round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
