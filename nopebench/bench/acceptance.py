"""Pure functions over bench-decode records: the NoPE-against-shim answer, speed-up ratios, the
config's acceptance criteria, and regressions against a baseline run. Tables, plots and the
report all read these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from nopebench.bench.decode_cases import CriterionSpec

NOPE_MODES = ("nope", "nope-pool")
CELL_KEYS = ["heads", "query_tokens", "width", "active"]


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
    cell: str | None = None  # the grid point a ratio criterion reads

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
            "cell": self.cell,
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
    df: pd.DataFrame, impl: str, mode: str, spec: CriterionSpec
) -> tuple[float, float] | None:
    """Median ms and spread of one timed cell, or None."""
    cell = spec.cell
    sel = df[
        (df.impl == impl)
        & (df["mode"] == mode)
        & (df.heads == cell.heads)
        & (df.query_tokens == cell.tokens)
        & (df.width == cell.width)
        & (df.active == cell.active)
    ]
    if not len(sel):
        return None
    spread = sel.spread.iloc[0] if "spread" in sel else float("nan")
    return float(sel.median_ms.iloc[0]), float(spread)


def evaluate(df: pd.DataFrame, spec: CriterionSpec) -> Criterion:
    """baseline time / subject time >= min_speedup, with the two cells' spreads added as the
    ratio's noise band; not measurable (passed None) when either cell was not timed."""
    target = f">= {spec.min_speedup:.2f}"
    subject = _cell(df, spec.subject.impl, spec.subject.mode, spec)
    baseline = _cell(df, spec.baseline.impl, spec.baseline.mode, spec)
    if subject is None or baseline is None:
        return Criterion(spec.name, None, target, None, spec.min_speedup, cell=spec.cell.label())
    ratio, spread = baseline[0] / subject[0], baseline[1] + subject[1]
    return Criterion(
        spec.name,
        ratio,
        target,
        ratio >= spec.min_speedup,
        spec.min_speedup,
        None if pd.isna(spread) else spread,
        cell=spec.cell.label(),
    )


def criteria(rows: pd.DataFrame, specs: Sequence[CriterionSpec]) -> list[Criterion]:
    """The config's speed criteria, in its order, then the one every run has: every case that
    ran passed its correctness check (always last)."""
    df = timed(rows)
    out = [evaluate(df, spec) for spec in specs]
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


def _deployable(df: pd.DataFrame) -> pd.Series:
    """Rows of implementations a serving engine runs on the fp8 cache (a serving backend named)."""
    if "serving_backend" not in df:
        return pd.Series(False, index=df.index)
    named = df.serving_backend.fillna("").astype(str).str.strip()
    return named != ""


def _fastest(df: pd.DataFrame, label) -> pd.DataFrame:
    """Per cell: the fastest row's median ms and a label for it."""
    if df.empty:
        return pd.DataFrame(columns=[*CELL_KEYS, "ms", "by"])
    best = df.loc[df.groupby(CELL_KEYS, sort=False).median_ms.idxmin()]
    return pd.DataFrame(
        {
            **{k: best[k].to_numpy() for k in CELL_KEYS},
            "ms": best.median_ms.to_numpy(),
            "by": [label(r) for r in best.itertuples()],
        }
    )


def nope_answer(rows: pd.DataFrame) -> pd.DataFrame:
    """How fast NoPE decode is against the shim, per implementation and cell (heads, tokens,
    width, active), for every NoPE mode that ran:

    - vs_best_shim = fastest shim time of any implementation that ran / this NoPE time: the
      answer to "how much faster is NoPE than the shim on this GPU";
    - vs_best_deployable = fastest time of any deployable fp8 path (an implementation a serving
      engine runs, in any mode; bounds such as a bf16 copy of the cache excluded) / this time;
    - vs_own_shim = this implementation's own shim time / its NoPE time.
    Each ratio > 1 means this NoPE time is the faster. Columns best_shim / best_deployable name
    the implementation (and mode) behind each best time.
    """
    df = timed(rows)
    cols = [
        "impl",
        "mode",
        *CELL_KEYS,
        "nope_ms",
        "best_shim_ms",
        "best_shim",
        "vs_best_shim",
        "best_deployable_ms",
        "best_deployable",
        "vs_best_deployable",
        "own_shim_ms",
        "vs_own_shim",
    ]
    nope = df[df["mode"].isin(NOPE_MODES)]
    if nope.empty:
        return pd.DataFrame(columns=cols)
    shim = _fastest(df[df["mode"] == "shim"], lambda r: r.impl)
    deploy = _fastest(df[_deployable(df)], lambda r: f"{r.impl} {r.mode}")
    own = df[df["mode"] == "shim"][["impl", *CELL_KEYS, "median_ms"]].rename(
        columns={"median_ms": "own_shim_ms"}
    )
    out = nope[["impl", "mode", *CELL_KEYS, "median_ms"]].rename(columns={"median_ms": "nope_ms"})
    out = out.merge(
        shim.rename(columns={"ms": "best_shim_ms", "by": "best_shim"}), on=CELL_KEYS, how="left"
    )
    out = out.merge(
        deploy.rename(columns={"ms": "best_deployable_ms", "by": "best_deployable"}),
        on=CELL_KEYS,
        how="left",
    )
    out = out.merge(own, on=["impl", *CELL_KEYS], how="left")
    out["vs_best_shim"] = out.best_shim_ms / out.nope_ms
    out["vs_best_deployable"] = out.best_deployable_ms / out.nope_ms
    out["vs_own_shim"] = out.own_shim_ms / out.nope_ms
    return out[cols].sort_values([*CELL_KEYS, "mode"], kind="stable").reset_index(drop=True)


def spread_tolerance(
    spread: pd.Series, baseline_spread: pd.Series, noise_floor: float
) -> pd.Series:
    """How far a time may move from its baseline within noise: the larger of the two spreads,
    and at least `noise_floor` (run-to-run noise, which a within-run spread understates)."""
    return pd.concat([spread, baseline_spread], axis=1).max(axis=1).clip(lower=noise_floor)


def noise_floor_pct(value: float) -> str:
    """A noise floor for text: 6% (or 2.5%)."""
    return f"{100 * value:.3g}%"


BASELINE_COLUMNS = ("baseline_ms", "baseline_spread", "vs_baseline", "noise_floor", "regression")


def mark_regressions(
    rows: pd.DataFrame,
    baseline: pd.DataFrame,
    noise_floor: float,
    keys: tuple[str, ...] = ("case", "impl"),
) -> pd.DataFrame:
    """Add vs_baseline (time / baseline time), the noise_floor used, and regression: slower by
    more than the spread_tolerance. A cell is one row per `keys` in each run; columns from an
    earlier marking of `rows` are replaced."""
    keys = list(keys)
    base = timed(baseline)[keys + ["median_ms", "spread"]].rename(
        columns={"median_ms": "baseline_ms", "spread": "baseline_spread"}
    )
    rows = rows.drop(columns=[c for c in BASELINE_COLUMNS if c in rows])
    merged = rows.merge(base, on=keys, how="left")
    merged["vs_baseline"] = merged.median_ms / merged.baseline_ms
    merged["noise_floor"] = noise_floor
    tolerance = spread_tolerance(merged["spread"], merged["baseline_spread"], noise_floor)
    merged["regression"] = (merged.vs_baseline - 1 > tolerance) & merged.baseline_ms.notna()
    return merged


ANSWER_COLUMNS = (
    "impl",
    "mode",
    "heads",
    "tokens",
    "width",
    "NoPE ms",
    "best shim ms (impl)",
    "vs best shim",
    "best deployable ms (impl mode)",
    "vs best deployable",
    "vs own shim",
)


def ratio_text(value: object) -> str:
    """A ratio of times as printed: '1.23x', or '-' where there is none."""
    return "-" if value is None or pd.isna(value) else f"{value:.2f}x"


def answer_rows(
    answer: pd.DataFrame, ms: Callable[[object], str], text: Callable[[object], str]
) -> list[list[object]]:
    """`nope_answer`'s rows under ANSWER_COLUMNS, for the terminal and the report alike; `ms`
    and `text` format times and implementation names for the medium."""
    return [
        [
            r.impl,
            r.mode,
            r.heads,
            r.query_tokens,
            r.width,
            ms(r.nope_ms),
            f"{ms(r.best_shim_ms)} ({text(r.best_shim)})",
            ratio_text(r.vs_best_shim),
            f"{ms(r.best_deployable_ms)} ({text(r.best_deployable)})",
            ratio_text(r.vs_best_deployable),
            ratio_text(r.vs_own_shim),
        ]
        for r in answer.itertuples()
    ]
