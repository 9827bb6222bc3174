"""Pure functions over bench-decode records: speed-up ratios, issue 5's acceptance criteria,
and regressions against a baseline run. Tables, plots and the report all read these."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

TARGET_TOKENS, TARGET_WIDTH, TARGET_ACTIVE = 512, 2176, 2051


@dataclass(frozen=True)
class Criterion:
    name: str
    measured: float | None
    target: str
    passed: bool | None  # None: not measurable in this run (an implementation missing)
    bound: float | None = None  # a ratio criterion's threshold
    spread: float | None = (
        None  # the ratio's noise band: the sum of its two cells' (p90 - p10) / median
    )

    @property
    def within_spread(self) -> bool:
        """The ratio lies nearer its bound than the noise measured in the same run, so another
        run could give the other verdict. The verdict itself stays the strict comparison."""
        if self.measured is None or self.bound is None or self.spread is None:
            return False
        return abs(self.measured / self.bound - 1) <= self.spread

    def as_row(self) -> dict:
        return {
            "criterion": self.name,
            "measured": self.measured,
            "target": self.target,
            "passed": self.passed,
            "spread": self.spread,
            "within_spread": self.within_spread,
        }


def spread_band(c: Criterion) -> str:
    """A ratio criterion's noise band for tables, as a percentage of the ratio."""
    return "-" if c.spread is None else f"±{100 * c.spread:.1f}%"


def timed(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows that were checked and timed."""
    if "median_ms" not in rows:
        return rows.iloc[0:0]
    return rows[rows["median_ms"].notna() & rows["error"].isna()]


def _cell(
    df: pd.DataFrame, impl: str, heads: int, tokens: int, mode: str
) -> tuple[float, float] | None:
    """Median ms and spread of one timed cell at the target width, or None."""
    sel = df[
        (df.impl == impl)
        & (df.heads == heads)
        & (df.query_tokens == tokens)
        & (df["mode"] == mode)
        & (df.width == TARGET_WIDTH)
        & (df.active == TARGET_ACTIVE)
    ]
    if not len(sel):
        return None
    spread = sel.spread.iloc[0] if "spread" in sel else float("nan")
    return float(sel.median_ms.iloc[0]), float(spread)


def _ratio_at_least(
    name: str,
    num: tuple[float, float] | None,
    den: tuple[float, float] | None,
    bound: float,
    target: str,
) -> Criterion:
    """Time of cell `num` / time of cell `den` >= bound, with the two cells' spreads added as
    the ratio's noise band."""
    if num is None or den is None:
        return Criterion(name, None, target, None, bound)
    ratio, spread = num[0] / den[0], num[1] + den[1]
    return Criterion(
        name, ratio, target, ratio >= bound, bound, None if pd.isna(spread) else spread
    )


def criteria(rows: pd.DataFrame) -> list[Criterion]:
    """Issue 5's 'done when', at 512 query tokens, width 2176 with 2051 active (1 token for
    the last two). Ratios are times: slower / faster, so >= 1 means the first named is faster."""
    df = timed(rows)
    t = TARGET_TOKENS
    out = []
    for heads, fp8_x, bf16_bound, shim_x in ((16, 5.0, 1.0, 1.15), (64, 4.0, 1 / 1.25, 1.05)):
        native = _cell(df, "native", heads, t, "nope")
        bf16 = _cell(df, "flashinfer-fa3-bf16", heads, t, "nope")
        fp8 = _cell(df, "flashinfer-fa3-fp8", heads, t, "nope")
        shim = _cell(df, "native", heads, t, "shim")
        relation = "at least as fast as" if bf16_bound == 1.0 else "within 1.25x of"
        out.append(
            _ratio_at_least(
                f"H={heads}: native NoPE {relation} fa3 bf16 NoPE (fa3 / native)",
                bf16,
                native,
                bf16_bound,
                f">= {bf16_bound:.2f}",
            )
        )
        out.append(
            _ratio_at_least(
                f"H={heads}: native NoPE vs fa3 fp8 (fa3 fp8 / native)",
                fp8,
                native,
                fp8_x,
                f">= {fp8_x:g}",
            )
        )
        out.append(
            _ratio_at_least(
                f"H={heads}: native NoPE vs native shim (shim / NoPE)",
                shim,
                native,
                shim_x,
                f">= {shim_x:g}",
            )
        )
    for heads in (16, 64):
        native = _cell(df, "native", heads, 1, "nope")
        bf16 = _cell(df, "flashinfer-fa3-bf16", heads, 1, "nope")
        out.append(
            _ratio_at_least(
                f"H={heads}, 1 token: native no slower than fa3 bf16 (fa3 / native)",
                bf16,
                native,
                1.0,
                ">= 1.00",
            )
        )
    ran = rows[rows.skipped.isna()] if "skipped" in rows else rows
    failed = int((~ran.passed.fillna(False).astype(bool)).sum()) if "passed" in ran else len(ran)
    out.append(
        Criterion(
            "every case that ran passed its correctness check (failures)",
            float(failed),
            "0",
            failed == 0,
        )
    )
    return out


def nope_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and case: shim time / NoPE time (> 1: NoPE is faster)."""
    df = timed(rows)
    keys = ["impl", "heads", "query_tokens", "width", "active"]
    nope = df[df["mode"] == "nope"].set_index(keys).median_ms
    shim = df[df["mode"] == "shim"].set_index(keys).median_ms
    both = pd.concat({"nope_ms": nope, "shim_ms": shim}, axis=1).dropna()
    both["nope_speedup"] = both.shim_ms / both.nope_ms
    return both.reset_index()


def spread_tolerance(spread: pd.Series, baseline_spread: pd.Series) -> pd.Series:
    """How far a time may move from its baseline within noise: the larger of the two spreads."""
    return pd.concat([spread, baseline_spread], axis=1).max(axis=1)


def mark_regressions(
    rows: pd.DataFrame, baseline: pd.DataFrame, keys: tuple[str, ...] = ("case", "impl")
) -> pd.DataFrame:
    """Add vs_baseline (time / baseline time) and regression: slower by more than the larger of
    the two runs' measured spreads. A cell is one row per `keys` in each run."""
    keys = list(keys)
    base = timed(baseline)[keys + ["median_ms", "spread"]].rename(
        columns={"median_ms": "baseline_ms", "spread": "baseline_spread"}
    )
    merged = rows.merge(base, on=keys, how="left")
    merged["vs_baseline"] = merged.median_ms / merged.baseline_ms
    tolerance = spread_tolerance(merged["spread"], merged["baseline_spread"])
    merged["regression"] = (merged.vs_baseline - 1 > tolerance) & merged.baseline_ms.notna()
    return merged
