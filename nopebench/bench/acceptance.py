"""Pure functions over bench-decode records: the NoPE-against-shim answer, speed-up ratios, the
config's acceptance criteria, and regressions against a baseline run. Tables, plots and the
report all read these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from nopebench.bench.decode_cases import RECORD_COLUMN, CriterionSpec, Side, cell_label

NOPE_MODES = ("nope", "nope-pool")
CELL_KEYS = list(RECORD_COLUMN.values())  # the columns that name a cell of the grid
CELL_ROW_COLUMNS = ["criterion", "cell", "measured", "target", "passed", "spread"]


@dataclass(frozen=True)
class CellResult:
    """A criterion at one cell of its selection."""

    cell: str
    measured: float
    passed: bool
    spread: float | None  # the noise band, as Criterion.spread


@dataclass(frozen=True)
class Criterion:
    name: str
    measured: float | None  # over a selection: its worst cell's value
    target: str
    passed: bool | None  # None: not measurable in this run (an implementation missing)
    bound: float | None = None  # a speed criterion's threshold
    # The noise band: a ratio's is the sum of its two cells' (p90 - p10) / median, a share of
    # the roofline's its cell's.
    spread: float | None = None
    cell: str | None = None  # the grid point it reads (over a selection: the worst)
    per_cell: tuple[CellResult, ...] = ()  # every cell it was measured at, in grid order
    scope: str | None = None  # the cells it is held at, as its config names them
    unmeasured: int = 0  # cells of its selection that ran, but not with both its sides timed

    @property
    def within_spread(self) -> bool:
        """The ratio lies nearer its bound than the noise measured in the same run, so another
        run could give the other verdict. The verdict itself stays the strict comparison."""
        if self.measured is None or self.bound is None or self.spread is None:
            return False
        return abs(self.measured / self.bound - 1) <= self.spread

    @property
    def failing(self) -> list[CellResult]:
        return [r for r in self.per_cell if not r.passed]

    def where(self) -> str:
        """The cell column of tables: the cell, or the selection and its worst cell."""
        if self.scope is None:
            return self.cell or "every case"
        return f"{self.scope} (worst: {self.cell})" if self.per_cell else self.scope

    def cells_note(self) -> str:
        """How a selection fared, for tables: '3 of 40 cells fail' (', 2 not measured'); empty
        for a criterion at one cell."""
        if self.scope is None:
            return ""
        note = f"{len(self.failing)} of {len(self.per_cell)} cells fail"
        return note + (f", {self.unmeasured} not measured" if self.unmeasured else "")

    def as_row(self) -> dict:
        return {
            "criterion": self.name,
            "cell": self.cell,
            "measured": self.measured,
            "target": self.target,
            "passed": self.passed,
            "spread": self.spread,
            "within_spread": self.within_spread,
            "cells": len(self.per_cell) if self.scope is not None else None,
            "failing_cells": len(self.failing) if self.scope is not None else None,
            "unmeasured_cells": self.unmeasured if self.scope is not None else None,
        }

    def cell_rows(self) -> list[dict]:
        """One record per cell it was measured at (bench-decode's criteria_cells.csv)."""
        return [
            dict(
                zip(
                    CELL_ROW_COLUMNS,
                    (self.name, r.cell, r.measured, self.target, r.passed, r.spread),
                    strict=True,
                )
            )
            for r in self.per_cell
        ]


def spread_band(c: Criterion) -> str:
    """A ratio criterion's noise band for tables, as a percentage of the ratio."""
    return "-" if c.spread is None else f"±{100 * c.spread:.1f}%"


def timed(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows that were checked and timed."""
    if "median_ms" not in rows:
        return rows.iloc[0:0]
    return rows[rows["median_ms"].notna() & rows["error"].isna()]


def _fastest_rows(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of `keys` (in first-seen order), the row with the smallest median ms."""
    return df.loc[df.groupby(keys, sort=False).median_ms.idxmin()] if len(df) else df


def _side(df: pd.DataFrame, side: Side) -> pd.DataFrame:
    """Per cell (the CELL_KEYS columns), the median ms, spread and % of roofline of the side's
    implementation in its mode; with `fastest_of`, of the fastest of them, at the cells where
    every one of them was timed (elsewhere the fastest is not known)."""
    rows = df[df.impl.isin(side.impls()) & (df["mode"] == side.mode)]
    if len(side.impls()) > 1 and len(rows):
        count = rows.groupby(CELL_KEYS, sort=False).impl.transform("nunique")
        rows = rows[count == len(set(side.impls()))]
    best = _fastest_rows(rows, CELL_KEYS)
    out = best[CELL_KEYS].copy()
    out["ms"] = best.median_ms.astype(float)
    for column, source in (("spread", "spread"), ("roof", "pct_roofline")):
        out[column] = best[source].astype(float) if source in best else float("nan")
    return out


def _noise(value: float) -> float | None:
    return None if pd.isna(value) else float(value)


def evaluate(df: pd.DataFrame, spec: CriterionSpec) -> Criterion:
    """The criterion at each timed cell of its selection where both sides were timed: baseline
    time / subject time >= min_speedup (the two cells' spreads added as the ratio's noise band),
    or the subject's % of roofline >= min_pct_roofline (its spread as the band). It holds when
    it holds at every such cell; measured, cell and spread are its worst cell's. Not measurable
    (passed None) when no cell had both sides timed."""
    sel = df
    for column, value in spec.selection().items():
        sel = sel[sel[column] == value]
    subject = _side(sel, spec.subject)
    if spec.min_pct_roofline is not None:
        bound = spec.min_pct_roofline
        target = f">= {bound:g}% of roofline"
        joined = subject.dropna(subset=["roof"])
        measured, spread = joined.roof, joined.spread
    else:
        bound = spec.min_speedup
        target = f">= {bound:.2f}"
        baseline = _side(sel, spec.baseline)
        joined = subject.merge(baseline, on=CELL_KEYS, suffixes=("", "_base"), sort=False)
        measured = joined.ms_base / joined.ms
        spread = joined.spread_base + joined.spread
    per_cell = tuple(
        CellResult(cell_label(*key), float(m), bool(m >= bound), _noise(band))
        for key, m, band in zip(
            joined[CELL_KEYS].itertuples(index=False, name=None), measured, spread, strict=True
        )
    )
    scope = spec.cells.label() if spec.cells is not None else None
    unmeasured = len(sel[CELL_KEYS].drop_duplicates()) - len(per_cell)
    if not per_cell:
        return Criterion(
            spec.name,
            None,
            target,
            None,
            bound,
            cell=spec.scope(),
            scope=scope,
            unmeasured=unmeasured,
        )
    worst = min(per_cell, key=lambda r: r.measured)
    # A failing cell decides; otherwise a cell without both sides timed leaves it open.
    failed = any(not r.passed for r in per_cell)
    return Criterion(
        spec.name,
        worst.measured,
        target,
        False if failed else (None if unmeasured else True),
        bound,
        worst.spread,
        cell=worst.cell,
        per_cell=per_cell,
        scope=scope,
        unmeasured=unmeasured,
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
    best = _fastest_rows(df, CELL_KEYS)
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


def vs_fastest_other(rows: pd.DataFrame, subject: str) -> pd.DataFrame:
    """Per mode and cell where `subject` was timed: the fastest other implementation there (the
    reference left out: it is no peer) and other's time / subject's time (> 1: the subject is
    faster). Cells where nothing else was timed are left out."""
    df = timed(rows)
    keys = ["mode", *CELL_KEYS]
    cols = [*keys, "subject_ms", "other_ms", "other", "ratio"]
    mine = df[df.impl == subject]
    others = df[(df.impl != subject) & (df.impl != "reference")]
    if mine.empty or others.empty:
        return pd.DataFrame(columns=cols)
    best = _fastest_rows(others, keys)
    out = mine[[*keys, "median_ms"]].rename(columns={"median_ms": "subject_ms"})
    out = out.merge(
        best[[*keys, "median_ms", "impl"]].rename(
            columns={"median_ms": "other_ms", "impl": "other"}
        ),
        on=keys,
    )
    out["ratio"] = out.other_ms / out.subject_ms
    return out[cols].reset_index(drop=True)


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
