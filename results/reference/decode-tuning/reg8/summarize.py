"""The 8-warp and 4-warp register kernels from call1/tune.tar.gz: per shape, each form's median
ms in each of its two processes, the warp-specialised kernel's in the same processes, and the
8-warp form's time over the 4-warp form's (medians of the two runs). Writes reg8_vs_reg4.csv.

    python3 summarize.py
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
frames = []
with tarfile.open(HERE / "call1" / "tune.tar.gz") as tar:
    for member in tar.getmembers():
        if member.name.endswith("tune.csv"):
            run = Path(member.name).parent.name  # w<warps>-<width>-r<rep>
            d = pd.read_csv(io.BytesIO(tar.extractfile(member).read()))
            frames.append(d.assign(warps=int(run[1]), rep=run.rsplit("-", 1)[1]))
d = pd.concat(frames)
assert d.passed.all(), "every timed variant passed its check"
keys = ["heads", "tokens", "width", "mode"]
reg = d[d.kernel == "register"].pivot_table(index=keys, columns=["warps", "rep"], values="median_ms")
ws = d[d.kernel == "hopper_ws"].groupby(keys).median_ms.median()
out = pd.DataFrame(
    {
        "w4_r1_ms": reg[(4, "r1")],
        "w4_r2_ms": reg[(4, "r2")],
        "w8_r1_ms": reg[(8, "r1")],
        "w8_r2_ms": reg[(8, "r2")],
        "hopper_ws_ms": ws,
    }
)
out["w8_over_w4"] = reg[8].median(axis=1) / reg[4].median(axis=1)
prov = d.iloc[0]
for col in ("gpu", "driver", "torch", "triton", "git_sha", "timestamp"):
    out[col] = prov[col]
out.reset_index().to_csv(HERE / "reg8_vs_reg4.csv", index=False, float_format="%.5f")
print(out[["w4_r1_ms", "w4_r2_ms", "w8_r1_ms", "w8_r2_ms", "hopper_ws_ms", "w8_over_w4"]].round(4))
