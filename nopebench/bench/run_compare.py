"""Two runs of one kind side by side, cell by cell.

A cell is one timed measurement: bench-decode's (case, impl), bench-cache's (op, variant,
tokens, impl). Run A is the baseline: ratio = B ms / A ms (> 1: B is slower). A cell is a
regression when B is slower by more than its tolerance: the largest of the two cells' spreads
((p90 - p10) / median) and the run-to-run noise floor (options.DEFAULT_NOISE_FLOOR unless
given), the rule bench-decode's --baseline applies (acceptance.mark_regressions); faster when
the same rule marks A a regression against B. Inside the tolerance the two runs agree within
their noise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from nopebench.bench import acceptance
from nopebench.commands.options import DEFAULT_NOISE_FLOOR
from nopebench.errors import UsageError
from nopebench.records import RUN_FILE, read_csv, read_run

CELL_KEYS: dict[str, tuple[str, ...]] = {
    "bench-decode": ("case", "impl"),
    "bench-cache": ("op", "variant", "tokens", "impl"),
}
RESULTS = "results.csv"
# Run facts that, when they differ, make a difference in time more than a code change
FACTS = ("gpu", "driver", "cuda_runtime", "torch", "triton", "flashinfer-python", "quick", "config")


def read_results(path: Path, label: str, required: tuple[str, ...], what: str) -> pd.DataFrame:
    """A results.csv with the `required` columns, or one UsageError line naming `label`."""
    if not path.is_file():
        raise UsageError(f"{label} {path}: not a file (give {what})")
    try:
        df = read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same usage error
        raise UsageError(f"{label} {path}: cannot read as CSV ({type(exc).__name__})") from None
    missing = set(required) - set(df.columns)
    if missing:
        raise UsageError(f"{label} {path}: not {what} (missing {', '.join(sorted(missing))})")
    return df


@dataclass(frozen=True)
class Run:
    path: Path
    header: dict[str, Any]
    results: pd.DataFrame

    @property
    def kind(self) -> str:
        return str(self.header.get("kind"))

    def facts(self) -> dict[str, Any]:
        h, summary = self.header, self.header.get("summary") or {}
        versions = h.get("versions") or {}
        config = summary.get("config")
        return {
            "gpu": h.get("gpu"),
            "driver": h.get("driver"),
            "cuda_runtime": h.get("cuda_runtime"),
            **{name: versions.get(name) for name in ("torch", "triton", "flashinfer-python")},
            "quick": summary.get("quick"),
            "config": None if config is None else json.dumps(config, sort_keys=True),
        }

    def describe(self) -> dict[str, Any]:
        h = self.header
        return {
            "path": str(self.path),
            "run_id": h.get("run_id"),
            "kind": self.kind,
            "status": h.get("status"),
            "timestamp": h.get("timestamp"),
            "git_sha": h.get("git_sha"),
            "git_dirty": h.get("git_dirty"),
            "gpu": h.get("gpu"),
            "nopebench": (h.get("versions") or {}).get("nopebench"),
        }


def load_run(path: Path, label: str) -> Run:
    """A finished bench-decode or bench-cache run directory and its results, else one line."""
    path = Path(path)
    if not (path / RUN_FILE).is_file():
        raise UsageError(f"{label} {path}: not a nopebench run directory (no {RUN_FILE})")
    try:
        header = read_run(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{label} {path}: unreadable {RUN_FILE} ({type(exc).__name__})") from None
    kind = header.get("kind")
    if header.get("status") == "running":
        raise UsageError(f"{label} {path}: the run has not finished (status running)")
    if kind == "run":
        raise UsageError(
            f"{label} {path}: a main-job run; "
            "give its bench-decode/ or bench-cache/ step's directory"
        )
    if kind not in CELL_KEYS:
        raise UsageError(
            f"{label} {path}: a {kind} run; compare takes {' or '.join(CELL_KEYS)} runs"
        )
    keys = CELL_KEYS[kind]
    results = read_results(
        path / RESULTS, label, (*keys, "median_ms", "spread", "error"), f"a {kind} {RESULTS}"
    )
    return Run(path, header, results)


def _state(rows: pd.DataFrame) -> pd.Series:
    """Per row: 'timed', 'error', 'skipped' or 'not timed'."""
    state = pd.Series("not timed", index=rows.index, dtype=object)
    if "skipped" in rows:
        state[rows["skipped"].notna()] = "skipped"
    state[rows["error"].notna()] = "error"
    state[rows.index.isin(acceptance.timed(rows).index)] = "timed"
    return state


def compare_cells(
    a: pd.DataFrame, b: pd.DataFrame, keys: tuple[str, ...], noise_floor: float
) -> pd.DataFrame:
    """Every cell either run timed: both times and spreads, ratio B / A, the noise floor and
    the marks."""
    keys = tuple(keys)
    for name, df in (("A", a), ("B", b)):
        if df.duplicated(list(keys)).any():
            raise UsageError(f"run {name}: more than one row per cell ({', '.join(keys)})")
    marked = acceptance.mark_regressions(b, a, noise_floor, keys)  # A is B's baseline
    cells = marked[[*keys]].copy()
    cells["a_ms"], cells["a_spread"] = marked["baseline_ms"], marked["baseline_spread"]
    b_timed = marked.index.isin(acceptance.timed(marked).index)
    cells["b_ms"] = marked["median_ms"].where(b_timed)
    cells["b_spread"] = marked["spread"].where(b_timed)
    cells["ratio"] = cells.b_ms / cells.a_ms
    cells["noise_floor"] = noise_floor
    cells["regression"] = marked["regression"].astype(bool) & b_timed
    tolerance = acceptance.spread_tolerance(cells.a_spread, cells.b_spread, noise_floor)
    cells["faster"] = (1 / cells.ratio - 1 > tolerance) & cells.ratio.notna()
    # A's cells that B lacks altogether
    gone = a.merge(b[list(keys)], on=list(keys), how="left", indicator=True)
    gone = gone[gone["_merge"] == "left_only"]
    gone_timed = acceptance.timed(gone)
    if len(gone_timed):
        extra = gone_timed[[*keys]].assign(
            a_ms=gone_timed.median_ms,
            a_spread=gone_timed.spread,
            noise_floor=noise_floor,
            regression=False,
            faster=False,
        )
        cells = pd.concat([cells, extra], ignore_index=True)
    state_a = _keyed_state(a, keys)
    state_b = _keyed_state(b, keys)
    index = pd.MultiIndex.from_frame(cells[list(keys)])
    sa = state_a.reindex(index).fillna("absent").to_numpy()
    sb = state_b.reindex(index).fillna("absent").to_numpy()
    cells["note"] = [_note(x, y) for x, y in zip(sa, sb, strict=True)]
    ka, kb = _kernels(a, keys).reindex(index), _kernels(b, keys).reindex(index)
    cells["a_kernel"], cells["b_kernel"] = ka.to_numpy(), kb.to_numpy()
    cells["kernel_changed"] = (ka.notna() & kb.notna() & (ka != kb)).to_numpy()
    either = (sa == "timed") | (sb == "timed")
    return cells[either].reset_index(drop=True)


def _keyed(values: pd.Series, rows: pd.DataFrame, keys: tuple[str, ...]) -> pd.Series:
    """`values` (one per row of `rows`) indexed by the rows' cell keys."""
    return pd.Series(values.to_numpy(), index=pd.MultiIndex.from_frame(rows[list(keys)]))


def _keyed_state(rows: pd.DataFrame, keys: tuple[str, ...]) -> pd.Series:
    return _keyed(_state(rows), rows, keys)


def _kernels(rows: pd.DataFrame, keys: tuple[str, ...]) -> pd.Series:
    """Per cell, the kernel the run's row names (records without the column: none)."""
    kernel = rows["kernel"] if "kernel" in rows else pd.Series(None, index=rows.index)
    return _keyed(kernel, rows, keys)


def _note(a: str, b: str) -> str:
    if a == b == "timed":
        return ""
    if a == "timed":
        return "not in B" if b == "absent" else f"B: {b}"
    return "not in A" if a == "absent" else f"A: {a}"


def mark(row: Any) -> str:
    """The one word a table shows for a cell, and whether its kernel changed between the runs
    (the cell's `a_kernel` and `b_kernel` say which)."""
    word = "REGRESSION" if row.regression else "faster" if row.faster else row.note
    if row.kernel_changed:
        return f"{word} (kernel changed)" if word else "kernel changed"
    return word  # blank: within the tolerance


@dataclass(frozen=True)
class Comparison:
    kind: str
    keys: tuple[str, ...]
    a: Run
    b: Run
    cells: pd.DataFrame
    noise_floor: float

    def differences(self) -> list[str]:
        """The run facts (GPU, driver, versions, config) that differ between A and B."""
        fa, fb = self.a.facts(), self.b.facts()
        out = []
        for name in FACTS:
            if fa.get(name) != fb.get(name):
                out.append(
                    f"{name} differs" if name == "config" else f"{name}: {fa[name]} -> {fb[name]}"
                )
        return out

    def summary(self) -> dict[str, Any]:
        both = self.cells[self.cells.ratio.notna()]
        ratios = both.ratio[both.ratio > 0]
        worst = both.loc[both.ratio.idxmax()] if len(both) else None
        return {
            "kind": self.kind,
            "cells": len(self.cells),
            "compared": len(both),
            "regressions": int(self.cells.regression.sum()),
            "faster": int(self.cells.faster.sum()),
            "noise_floor": self.noise_floor,
            "within_tolerance": int(len(both) - both.regression.sum() - both.faster.sum()),
            "only_one_run": int(len(self.cells) - len(both)),
            "kernel_changed": int(self.cells.kernel_changed.sum()),
            "geomean_ratio": float(math.exp(ratios.map(math.log).mean())) if len(ratios) else None,
            "largest_ratio": None if worst is None else float(worst.ratio),
            "largest_ratio_cell": None if worst is None else [worst[k] for k in self.keys],
            "differences": self.differences(),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.describe(),
            "b": self.b.describe(),
            "summary": self.summary(),
            "cells": self.cells.assign(mark=[mark(r) for r in self.cells.itertuples()]).to_dict(
                "records"
            ),
        }


def compare_runs(a: Run, b: Run, noise_floor: float = DEFAULT_NOISE_FLOOR) -> Comparison:
    """The comparison of two runs of one kind; two kinds is one UsageError line."""
    if a.kind != b.kind:
        raise UsageError(
            f"RUN_A is a {a.kind} run and RUN_B a {b.kind} run: compare takes two runs of one kind"
        )
    keys = CELL_KEYS[a.kind]
    cells = compare_cells(a.results, b.results, keys, noise_floor)
    return Comparison(a.kind, keys, a, b, cells, noise_floor)


def spread_pct(value: object) -> str:
    """A spread for tables: ±x.x% (- when unknown)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"±{100 * float(value):.1f}%"


def table_rows(comparison: Comparison) -> list[list[object]]:
    """The rows of the side-by-side table, for the terminal and the report alike."""
    rows = []
    for r in comparison.cells.itertuples():
        rows.append(
            [
                *[getattr(r, k) for k in comparison.keys],
                None if pd.isna(r.a_ms) else r.a_ms,
                spread_pct(r.a_spread),
                None if pd.isna(r.b_ms) else r.b_ms,
                spread_pct(r.b_spread),
                "-" if pd.isna(r.ratio) else f"{r.ratio:.3f}",
                mark(r),
            ]
        )
    return rows


def table_columns(comparison: Comparison) -> list[str]:
    return [*comparison.keys, "A ms", "A spread", "B ms", "B spread", "B / A", "mark"]


def summary_line(comparison: Comparison) -> str:
    s = comparison.summary()
    geo = "-" if s["geomean_ratio"] is None else f"{s['geomean_ratio']:.3f}"
    floor = acceptance.noise_floor_pct(s["noise_floor"])
    return (
        f"{s['compared']} cells timed in both runs: {s['regressions']} regressions and "
        f"{s['faster']} faster beyond the larger of their spreads and the "
        f"{floor} noise floor, {s['within_tolerance']} within; "
        f"geometric mean B / A {geo}; {s['only_one_run']} timed in one run only"
        + (f"; {s['kernel_changed']} ran another kernel in B" if s["kernel_changed"] else "")
    )
