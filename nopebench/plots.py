"""PNG plots rendered from result records (never the only output: the CSV holds every number)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or GPU machines
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def grouped_bars(
    df: pd.DataFrame,
    x: str,
    group: str,
    value: str,
    title: str,
    ylabel: str,
    path: Path,
    facet: str | None = None,
    log: bool = False,
) -> Path:
    """One grouped bar chart per facet value: bars of `value` per `x`, one colour per `group`."""
    facets = list(dict.fromkeys(df[facet])) if facet else [None]
    fig, axes = plt.subplots(
        len(facets),
        1,
        figsize=(max(8, 0.5 * df[x].nunique() * max(1, df[group].nunique())), 3.6 * len(facets)),
        squeeze=False,
    )
    groups = list(dict.fromkeys(df[group]))
    for ax, fv in zip(axes[:, 0], facets, strict=True):
        sub = df if fv is None else df[df[facet] == fv]
        xs = list(dict.fromkeys(sub[x]))
        width = 0.8 / max(1, len(groups))
        for i, gname in enumerate(groups):
            vals = sub[sub[group] == gname].set_index(x)[value].reindex(xs)
            ax.bar(
                [j + i * width for j in range(len(xs))], vals.values, width=width, label=str(gname)
            )
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(xs))])
        ax.set_xticklabels(xs, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}{'' if fv is None else f' - {fv}'}", fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def decode_plots(rows: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Latency per case and % of roofline per case, one panel per mode and width."""
    df = rows[rows["median_ms"].notna()] if "median_ms" in rows else rows.iloc[0:0]
    if df.empty:
        return []
    df = df.assign(
        point=[f"H{h} T{t}" for h, t in zip(df.heads, df.query_tokens, strict=True)],
        panel=[
            f"{m}, width {w} ({a} active)"
            for m, w, a in zip(df["mode"], df.width, df.active, strict=True)
        ],
    )
    return [
        grouped_bars(
            df,
            "point",
            "impl",
            "median_ms",
            "decode latency (median)",
            "ms (log)",
            out_dir / "decode_latency.png",
            facet="panel",
            log=True,
        ),
        grouped_bars(
            df,
            "point",
            "impl",
            "pct_roofline",
            "% of roofline (max of copy-bandwidth and matmul time)",
            "%",
            out_dir / "decode_roofline.png",
            facet="panel",
        ),
    ]
