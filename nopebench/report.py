"""`nopebench report`: run directories -> one Markdown report with PNG plots.

Every number comes from the records of the runs the report names (their CSV/JSON files);
plots are rendered again from those records into the report's own directory, so the report
directory is self-contained and can be attached to a pull request as is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from nopebench import SUMMARY
from nopebench.errors import UsageError
from nopebench.records import RUN_FILE, read_csv, read_run, run_status

KIND_ORDER = ("run", "verify-layout", "check-pagetable", "bench-decode", "bench-cache", "gsm8k")
EXCLUDED_KINDS = {"report"}


# ---------------------------------------------------------------- finding runs


def _is_run(path: Path) -> bool:
    return (path / RUN_FILE).is_file()


def _finished(path: Path) -> bool:
    """Ended with a status of its own: not `running`, and not `died` (running, process gone)."""
    try:
        return run_status(read_run(path)) not in ("running", "died")
    except (OSError, json.JSONDecodeError):
        return False


def runs_under(root: Path) -> list[Path]:
    """The newest finished run of each kind directly under `root` (results/ or a main-job run)."""
    found = []
    if not root.is_dir():
        return found
    for kind_dir in sorted(
        p for p in root.iterdir() if p.is_dir() and p.name not in EXCLUDED_KINDS
    ):
        runs = sorted(p for p in kind_dir.iterdir() if p.is_dir() and _is_run(p) and _finished(p))
        if runs:
            found.append(runs[-1])
    return sorted(found, key=lambda p: _kind_rank(read_run(p).get("kind", "")))


def _kind_rank(kind: str) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def collect_runs(paths: list[Path] | None, results_root: Path) -> list[Path]:
    """The run directories to report on: those given (a main-job run expands to its steps), or
    the newest of each kind under results/."""
    if not paths:
        runs = runs_under(results_root)
        main = [p for p in runs if read_run(p).get("kind") == "run"]
        if main:  # the newest main job already holds a run of each step
            runs = [main[0], *runs_under(main[0])]
        if not runs:
            raise UsageError(
                f"no finished runs under {results_root}: run `nopebench run` (or any check) first"
            )
        return runs
    runs = []
    for path in paths:
        if not _is_run(path):
            raise UsageError(f"{path}: not a nopebench run directory (no {RUN_FILE})")
        runs.append(path)
        if read_run(path).get("kind") == "run":
            runs.extend(runs_under(path))
    return runs


# ---------------------------------------------------------------- markdown helpers


def md_cell(value: object, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "pass" if value else "**FAIL**"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(columns: list[str], rows: list[list[object]]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(md_cell(c) for c in row) + " |\n" for row in rows)


def _csv(run: Path, name: str) -> pd.DataFrame | None:
    path = run / name
    return read_csv(path) if path.is_file() else None


def _short(text: object, limit: int = 160) -> str:
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ---------------------------------------------------------------- sections


def section_environment(runs: list[Path]) -> str:
    rows = []
    for run in runs:
        h = read_run(run)
        v = h.get("versions", {})
        sha = h.get("git_sha") or "-"
        rows.append(
            [
                h.get("kind"),
                run_status(h),
                h.get("timestamp"),
                h.get("gpu") or "none (CPU)",
                h.get("driver"),
                v.get("torch"),
                v.get("triton"),
                v.get("flashinfer-python"),
                f"{sha[:12]}{' (dirty)' if h.get('git_dirty') else ''}",
                f"`{h.get('command')}`",
            ]
        )
    return "## Runs and environment\n\n" + md_table(
        [
            "kind",
            "status",
            "when (UTC)",
            "GPU",
            "driver",
            "torch",
            "triton",
            "flashinfer",
            "git",
            "command",
        ],
        rows,
    )


def section_run(run: Path, assets: Path) -> str:
    header = read_run(run)
    steps = (header.get("summary") or {}).get("steps")
    if steps is None and (run / "steps.json").is_file():  # a job that ended before its summary
        steps = json.loads((run / "steps.json").read_text())
    title = "## Main job (`nopebench run`)\n\n"
    status = run_status(header)
    if status not in ("passed", "failed"):
        title += f"Status: **{status}**; the steps below are those that ended.\n\n"
    return title + md_table(
        ["step", "result", "seconds", "detail"],
        [[s["step"], s["status"], s["seconds"], s["detail"]] for s in steps or []],
    )


def section_verify_layout(run: Path, assets: Path) -> str:
    df = _csv(run, "checks.csv")
    if df is None:
        return _generic(run, assets)
    g = (
        df.groupby(["impl", "check"], sort=False)
        .agg(
            cases=("case", "nunique"),
            rows=("rows", "sum"),
            passed=("passed", "all"),
            worst=("worst", "max"),
        )
        .reset_index()
    )
    summary = read_run(run).get("summary", {})
    skipped = "".join(f"\n- `{k}` not run: {v}" for k, v in (summary.get("skipped") or {}).items())
    return (
        f"## KV-cache row layout (`verify-layout`, model {summary.get('model')})\n\n"
        "Each row written into a sentinel-filled cache and checked byte for byte against an "
        "independent construction. `worst` is the number of mismatching rows for byte checks and "
        "the largest error / e4m3-bound ratio for the dequantization check (<= 1 passes).\n\n"
        + md_table(["impl", "check", "cases", "rows", "result", "worst"], g.values.tolist())
        + skipped
        + "\n"
    )


def section_pagetable(run: Path, assets: Path) -> str:
    df = _csv(run, "checks.csv")
    if df is None:
        return _generic(run, assets)
    cols = [c for c in ("check", "impl", "layout", "sizing", "result", "detail") if c in df.columns]
    rows = [[_short(r[c]) for c in cols] for _, r in df.iterrows()]
    summary = read_run(run).get("summary", {})
    text = (
        f"## Sparse page-table sizing (`check-pagetable`, model {summary.get('model')}, "
        f"FlashInfer {summary.get('flashinfer')})\n\n" + md_table(cols, rows)
    )
    widths = _csv(run, "widths.csv")
    if widths is not None and {
        "index_topk",
        "kpool",
        "width",
        "max_active",
        "pre_fix_sparse_mla_top_k",
    } <= set(widths.columns):
        from nopebench.plots import grouped_bars

        point = [
            f"topk {t}, kpool {k}" for t, k in zip(widths.index_topk, widths.kpool, strict=True)
        ]
        topk = widths.pre_fix_sparse_mla_top_k
        long = pd.concat(
            [
                pd.DataFrame(
                    {
                        "point": point,
                        "what": "valid entries past index_topk (kpool - 1)",
                        "value": widths.max_active - topk,
                    }
                ),
                pd.DataFrame(
                    {
                        "point": point,
                        "what": "buffer columns past index_topk (width - index_topk)",
                        "value": widths.width - topk,
                    }
                ),
            ]
        )
        path = grouped_bars(
            long,
            "point",
            "what",
            "value",
            "what the pre-fix sizing (sparse_mla_top_k = index_topk) misses",
            "entries",
            assets / "pagetable_widths.png",
        )
        text += (
            "\nWherever a bar is above zero the pre-fix sizing does not match the buffer: "
            "FlashInfer rejects the call, or a kernel would ignore valid entries.\n\n"
            f"![page-table widths]({path.name})\n"
        )
    return text


def _run_criteria(summary: dict) -> tuple[list, str]:
    """The criteria the run's own config held (its summary records the config), and a note
    when they cannot be read back."""
    from pydantic import ValidationError

    from nopebench.bench.decode_cases import CriterionSpec

    try:
        specs = [
            CriterionSpec.model_validate(c)
            for c in (summary.get("config") or {}).get("criteria") or []
        ]
    except ValidationError as exc:
        return [], f"\n(the run's criteria could not be read back: {_short(exc, 120)})\n"
    return specs, ""


def section_bench_decode(run: Path, assets: Path) -> str:
    from nopebench.bench import acceptance
    from nopebench.plots import decode_plots

    df = _csv(run, "results.csv")
    if df is None:
        return _generic(run, assets)
    summary = read_run(run).get("summary", {})
    ceil = summary.get("ceilings", {})
    plots = decode_plots(df, assets)
    timed = acceptance.timed(df)
    pivot = timed.pivot_table(index="case", columns="impl", values="median_ms", sort=False)
    roof = timed.pivot_table(index="case", columns="impl", values="pct_roofline", sort=False)
    rows = [
        [
            case,
            *[
                f"{pivot.loc[case, i]:.4f} ({roof.loc[case, i]:.0f}%)"
                if not pd.isna(pivot.loc[case, i])
                else "-"
                for i in pivot.columns
            ],
        ]
        for case in pivot.index
    ]
    text = (
        f"## Sparse decode (`bench-decode`)\n\nCeilings measured in the same run: copy "
        f"{ceil.get('copy_gbps', float('nan')):.0f} GB/s, "
        f"bf16 matmul {ceil.get('matmul_tflops', float('nan')):.0f} TFLOP/s. "
        "Cells: median ms over CUDA-graph replays with rotating inputs (% of roofline = the larger "
        "of bytes / copy bandwidth and FLOPs / matmul rate, over the time). Every timed cell "
        "passed its correctness check against the reference in the same run, under its "
        "implementation's accuracy class.\n\n"
    )
    text += _implementations(df) + "\n" + md_table(["case", *pivot.columns], rows)
    text += _kernels(timed)
    answer = acceptance.nope_answer(df)
    if not answer.empty:
        text += (
            "\n### NoPE against the shim\n\nvs X = X's median time / this NoPE time (> 1: NoPE "
            "is faster). *best shim*: the fastest shim of any implementation that ran; *best "
            "deployable*: the fastest path a serving engine runs on the fp8 cache, in any mode "
            "(bounds such as fa3 over a bf16 copy excluded); *own shim*: the same "
            "implementation's shim.\n\n"
            + md_table(
                list(acceptance.ANSWER_COLUMNS),
                acceptance.answer_rows(answer, md_cell, md_cell),
            )
        )
    specs, note = _run_criteria(summary)
    crit = acceptance.criteria(df, specs)
    text += "\n### Acceptance criteria (the run's bench config)\n\n" + md_table(
        ["criterion", "cell", "measured", "spread", "target", "result"],
        [
            [
                c.name,
                c.where(),
                c.measured,
                acceptance.spread_band(c),
                c.target,
                "not measured"
                if c.passed is None
                else md_cell(c.passed)
                + (" (within spread)" if c.within_spread else "")
                + (f" ({c.cells_note()})" if c.cells_note() else ""),
            ]
            for c in crit
        ],
    )
    text += note + (
        "\n\nSpread: a ratio's is the sum of its two cells' (p90 - p10) / median, a share of the "
        "roofline's its cell's. *Within spread*: the value is nearer its target than that, so "
        "another run could give the other verdict. A criterion over several cells holds where it "
        "holds at each; its measured value is its worst cell's.\n"
    )
    text += "".join(
        f"\n- {c.name}: fails at " + ", ".join(f"{r.cell} ({r.measured:.3g})" for r in c.failing)
        for c in crit
        if c.scope is not None and c.failing
    )
    skipped = df[df.skipped.notna()].drop_duplicates("impl") if "skipped" in df else df.iloc[0:0]
    text += "".join(f"\n- `{r.impl}` not run: {r.skipped}" for r in skipped.itertuples())
    text += "\n" + "".join(f"\n![{p.stem}]({p.name})\n" for p in plots)
    return text


def _kernels(timed: pd.DataFrame) -> str:
    """Which kernel each implementation that names one ran, and at which cells (heads x
    tokens, mode, width), from the timed rows' `kernel` column."""
    if "kernel" not in timed:
        return ""
    named = timed[timed.kernel.notna()]
    if named.empty:
        return ""
    lines = []
    for (impl, kernel), rows in named.groupby(["impl", "kernel"], sort=False):
        cells = ", ".join(
            f"{r.heads}x{r.query_tokens} {r.mode} w{r.width}" for r in rows.itertuples()
        )
        lines.append(f"- `{impl}`, {kernel}: {cells}")
    return (
        "\n### Kernels each cell ran\n\nWhat each implementation that chooses or pads by shape "
        "ran (cells as heads x query tokens, mode, width; `kernel` in results.csv):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def _implementations(df: pd.DataFrame) -> str:
    """Which serving backend each implementation stands for, from the rows themselves."""
    cols = ["impl", "serving_backend", "deployable", "accuracy_class", "library", "library_version"]
    if "serving_backend" not in df:
        return ""
    first = df.drop_duplicates("impl").reindex(columns=cols)
    return md_table(
        ["impl", "serving backend", "deployable", "accuracy class", "library"],
        [
            [
                r.impl,
                r.serving_backend if isinstance(r.serving_backend, str) else "none",
                r.deployable,
                r.accuracy_class,
                f"{md_cell(r.library)} {md_cell(r.library_version)}",
            ]
            for r in first.itertuples()
        ],
    )


def section_bench_cache(run: Path, assets: Path) -> str:
    from nopebench.plots import grouped_bars

    df = _csv(run, "results.csv")
    if df is None or not {"op", "variant", "tokens", "impl", "gbps"} <= set(df.columns):
        return _generic(run, assets)
    summary = read_run(run).get("summary", {})
    cuda, torch_ref = (
        df[df.impl == "cuda"],
        df[df.impl == "torch"].set_index(["op", "variant", "tokens"]),
    )
    rows = []
    for r in cuda.itertuples():
        ref = (
            torch_ref.loc[(r.op, r.variant, r.tokens)]
            if (r.op, r.variant, r.tokens) in torch_ref.index
            else None
        )
        rows.append(
            [
                r.op,
                r.variant,
                r.tokens,
                r.median_ms,
                r.gbps,
                r.pct_copy,
                None if ref is None else ref.gbps,
                r.speedup,
                bool(r.check_passed) and pd.isna(r.error),
            ]
        )
    text = (
        f"## Cache kernels (`bench-cache`)\n\nCopy bandwidth measured in the same run: "
        f"{summary.get('copy_gbps', float('nan')):.0f} GB/s (read + write). Targets at T >= "
        f"{summary.get('targets', {}).get('min_tokens', 65536)}: "
        f"{'all met' if summary.get('all_targets_met') else 'NOT all met'}.\n\n"
        + md_table(
            [
                "op",
                "rows",
                "tokens",
                "cuda ms",
                "cuda GB/s",
                "% copy",
                "torch GB/s",
                "speed-up",
                "bit-exact",
            ],
            rows,
        )
    )
    data = df[df.gbps.notna()].assign(
        series=lambda d: d.impl + " " + d.variant, panel=lambda d: d.op
    )
    if not data.empty:
        path = grouped_bars(
            data,
            "tokens",
            "series",
            "gbps",
            "cache kernel throughput",
            "GB/s (log)",
            assets / "cache_gbps.png",
            facet="panel",
            log=True,
        )
        text += f"\n![cache throughput]({path.name})\n"
    return text


def section_gsm8k(run: Path, assets: Path) -> str:
    summary = read_run(run).get("summary", {})
    rows = [
        [k, v if not isinstance(v, (dict, list)) else json.dumps(v)] for k, v in summary.items()
    ]
    return "## GSM8K (`gsm8k`)\n\n" + md_table(["field", "value"], rows)


def section_comparison(a: Path, b: Path) -> str:
    """Two bench-decode runs side by side per cell (`nopebench compare`'s table)."""
    from nopebench.bench import acceptance, run_compare

    try:
        comparison = run_compare.compare_runs(
            run_compare.load_run(a, "first run"), run_compare.load_run(b, "second run")
        )
    except UsageError as exc:
        return f"## Comparison of the two bench-decode runs\n\nNot compared: {exc}\n"
    differ = "".join(f"\n- the runs differ in {d}" for d in comparison.differences())
    return (
        f"## Comparison of the two bench-decode runs (`nopebench compare`)\n\n"
        f"A: `{a}` (git {comparison.a.describe()['git_sha']}), B: `{b}` (git "
        f"{comparison.b.describe()['git_sha']}). Per cell both medians and spreads ((p90 - p10) "
        "/ median) and B / A (> 1: B is slower); REGRESSION: B slower by more than the larger "
        "of the two spreads and the run-to-run noise floor of "
        f"{acceptance.noise_floor_pct(comparison.noise_floor)}, faster: A slower by more than "
        "that.\n\n"
        f"{run_compare.summary_line(comparison)}.\n{differ}{chr(10) if differ else ''}\n"
        + md_table(run_compare.table_columns(comparison), run_compare.table_rows(comparison))
    )


def _generic(run: Path, assets: Path) -> str:
    h = read_run(run)
    rows = [
        [k, json.dumps(v) if isinstance(v, (dict, list)) else v]
        for k, v in (h.get("summary") or {}).items()
    ]
    return f"## {h.get('kind')}\n\n" + md_table(["field", "value"], rows)


SECTIONS: dict[str, Callable[[Path, Path], str]] = {
    "run": section_run,
    "verify-layout": section_verify_layout,
    "check-pagetable": section_pagetable,
    "bench-decode": section_bench_decode,
    "bench-cache": section_bench_cache,
    "gsm8k": section_gsm8k,
}


def build_report(runs: list[Path], out_dir: Path) -> Path:
    """Write report.md (and its plots) into `out_dir`; an existing report there is never
    replaced."""
    if (out_dir / "report.md").exists():
        raise UsageError(f"{out_dir}: already holds a report.md; reports never overwrite")
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [
        "# nopebench report\n",
        f"{SUMMARY} (NoPE: `qk_rope_head_dim = 0`). Its checks: the fp8_ds_mla cache row (NoPE "
        "RoPE lanes zeroed), the sparse page table sized by the top-k buffer width, decode speed "
        "against the zero-padded RoPE shim, and GSM8K.\n",
        "Runs: " + ", ".join(f"`{p}`" for p in runs) + "\n",
        section_environment(runs),
    ]
    for run in runs:
        kind = read_run(run).get("kind", "")
        parts.append(SECTIONS.get(kind, _generic)(run, out_dir))
    decode = [run for run in runs if read_run(run).get("kind") == "bench-decode"]
    if len(decode) == 2:
        parts.append(section_comparison(*decode))
    path = out_dir / "report.md"
    tmp = path.with_name("report.md.tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    tmp.replace(path)
    return path
