"""The one-row-a-lane loader against the tree's loader, from call1/tune.tar.gz: per shape and
mode, the register kernel's median ms in each process of each form, the warp-specialised
kernel's median over the same processes, and new over before (medians of each form's runs).
Writes loader_vs_before.csv.

    python3 summarize.py
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
with tarfile.open(HERE / "call1" / "tune.tar.gz") as tar:
    d = pd.concat(
        pd.read_csv(io.BytesIO(tar.extractfile(m).read())).assign(run=Path(m.name).parent.name)
        for m in tar.getmembers()
        if m.name.endswith("tune.csv")
    )
assert d.passed.all(), "every timed variant passed its check"
d["form"] = d.run.str.split("-").str[0]  # new-<width>-r<rep> or before-<width>-r<rep>
keys = ["heads", "tokens", "width", "mode"]
reg = d[d.kernel == "register"]
out = reg.pivot_table(index=keys, columns="run", values="median_ms")
out["hopper_ws_ms"] = d[d.kernel == "hopper_ws"].groupby(keys).median_ms.median()
by_form = reg.groupby(keys + ["form"]).median_ms.median().unstack("form")
out["new_over_before"] = by_form["new"] / by_form["before"]
for col in ("gpu", "driver", "torch", "triton", "git_sha", "timestamp"):
    out[col] = d.iloc[0][col]
out.reset_index().to_csv(HERE / "loader_vs_before.csv", index=False, float_format="%.5f")
print(out[["hopper_ws_ms", "new_over_before"]].round(4).to_string())
