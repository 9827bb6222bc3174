"""Each variant of a tune.csv against the planned kernel of its case: planned / variant (above 1,
the variant is faster), with the check each passed. Usage: python3 summarize.py tune.csv ..."""

import sys

import pandas as pd

rows = pd.concat([pd.read_csv(p) for p in sys.argv[1:]], ignore_index=True)
rows["variant"] = rows.kernel + "/h" + rows.block_h.astype(str) + "/s" + rows.splits.astype(str)
key = ["width", "heads", "tokens", "mode"]
out = []
for (width, heads, tokens, mode), grp in rows.groupby(key):
    base = grp.iloc[0]  # "planned" comes first in every case's variant list
    for _, r in grp.iloc[1:].iterrows():
        out.append(
            dict(width=width, heads=heads, tokens=tokens, mode=mode,
                 planned=f"{base.kernel}/h{base.block_h}/s{base.splits}",
                 planned_ms=base.median_ms, variant=r.variant, variant_ms=r.median_ms,
                 planned_over_variant=base.median_ms / r.median_ms,
                 passed=f"{bool(base.passed)}/{bool(r.passed)}")
        )
with pd.option_context("display.width", 200, "display.float_format", "{:.4f}".format):
    print(pd.DataFrame(out).to_string(index=False))
