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


def ratio_heatmaps(ratios: pd.DataFrame, subject: str, path: Path) -> Path:
    """`acceptance.vs_fastest_other`'s ratios as one heatmap per mode and width (heads by query
    tokens), each cell its ratio and the implementation it is against; green where the subject
    is faster, red where slower, white at 1."""
    from matplotlib.colors import TwoSlopeNorm

    panels = list(dict.fromkeys(zip(ratios["mode"], ratios.width, ratios.active, strict=True)))
    cols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.2 * cols, 3.4 * nrows), squeeze=False)
    low = min(0.5, float(ratios.ratio.min()))
    high = max(1.5, float(ratios.ratio.max()))
    norm = TwoSlopeNorm(vmin=low, vcenter=1.0, vmax=high)
    for ax, (mode, width, active) in zip(axes.flat, panels, strict=False):
        sub = ratios[(ratios["mode"] == mode) & (ratios.width == width) & (ratios.active == active)]
        grid = sub.pivot_table(index="heads", columns="query_tokens", values="ratio")
        who = sub.pivot_table(
            index="heads", columns="query_tokens", values="other", aggfunc="first"
        )
        ax.imshow(grid.to_numpy(), cmap="RdYlGn", norm=norm, aspect="auto")
        for i, heads in enumerate(grid.index):
            for j, tokens in enumerate(grid.columns):
                value = grid.loc[heads, tokens]
                if pd.notna(value):
                    label = f"{value:.2f}\n{who.loc[heads, tokens]}"
                    ax.text(j, i, label, ha="center", va="center", fontsize=6.5)
        ax.set_xticks(range(len(grid.columns)), [str(t) for t in grid.columns])
        ax.set_yticks(range(len(grid.index)), [str(h) for h in grid.index])
        ax.set_xlabel("query tokens")
        ax.set_ylabel("heads")
        ax.set_title(f"{mode}, width {width} ({active} active)", fontsize=10)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"fastest other implementation / {subject} (> 1: {subject} is faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def decode_plots(rows: pd.DataFrame, out_dir: Path, subject: str = "native") -> list[Path]:
    """Latency per case and % of roofline per case, one panel per mode and width; where
    `subject` ran beside other implementations, its ratio to the fastest of them per cell."""
    from nopebench.bench import acceptance

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
    paths = [
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
    ratios = acceptance.vs_fastest_other(rows, subject)
    if not ratios.empty:
        paths.append(ratio_heatmaps(ratios, subject, out_dir / "decode_vs_fastest_other.png"))
    return paths
