"""`nopebench bench-decode`: check and time the grid, write records, print the tables."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch

from nopebench import console as out
from nopebench.bench import acceptance
from nopebench.bench.decode_cases import BenchConfig, grid, load_bench_config, model_for
from nopebench.bench.decode_runner import run_grid
from nopebench.bench.timing import measure_ceilings
from nopebench.commands.options import BenchDecodeOptions
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UnsupportedError, UsageError
from nopebench.impls import registry
from nopebench.plots import decode_plots
from nopebench.records import RunDir, check_results_root, write_csv, write_json


def resolve_impls(cfg: BenchConfig, requested: tuple[str, ...] | list[str] | None) -> list[str]:
    known = registry.names()
    impls = requested or cfg.impls
    unknown = [i for i in impls if i not in known]
    if unknown:
        raise UsageError(f"unknown implementation {unknown[0]!r}: choose from {', '.join(known)}")
    return list(dict.fromkeys(impls))


def read_baseline(path: Path | None) -> pd.DataFrame | None:
    if path is None:
        return None
    if not path.is_file():
        raise UsageError(f"--baseline {path}: not a file (give a bench-decode results.csv)")
    try:
        base = pd.read_csv(path, float_precision="round_trip")
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same usage error
        raise UsageError(f"--baseline {path}: cannot read as CSV ({type(exc).__name__})") from None
    missing = {"case", "impl", "median_ms", "spread", "error"} - set(base.columns)
    if missing:
        raise UsageError(
            f"--baseline {path}: not a bench-decode results.csv (missing {', '.join(sorted(missing))})"
        )
    return base


def execute(opts: BenchDecodeOptions) -> int:
    cfg = load_bench_config(opts.config)
    if opts.model is not None:
        cfg = cfg.model_copy(update={"model": opts.model})
    model = model_for(cfg)
    impls = resolve_impls(cfg, opts.impls)
    base = read_baseline(opts.baseline)
    check_results_root(opts.output.results_dir)
    quick = opts.quick
    if not torch.cuda.is_available():
        raise UnsupportedError(
            "bench-decode times GPU kernels and needs a CUDA GPU; none is visible "
            "(check-pagetable runs the decode checks on CPU)"
        )
    cases = grid(cfg, quick)
    budget = cfg.quick.budget_s if quick and cfg.quick else cfg.timing.budget_s
    run = RunDir.create("bench-decode", opts.output.results_dir)
    out.console.print("measuring device ceilings (copy bandwidth, bf16 matmul)...")
    ceil = measure_ceilings()
    with out.progress_bar("bench-decode", total=len(cases)) as advance:
        rows = run_grid(cfg, model, cases, impls, ceil, budget, progress=advance)
    df = pd.DataFrame(rows)
    if base is not None:
        df = acceptance.mark_regressions(df, base)
    crit = acceptance.criteria(df)
    speedups = acceptance.nope_speedups(df)
    write_csv(run.file("results.csv"), df.to_dict("records"))
    write_csv(run.file("nope_speedup.csv"), speedups.to_dict("records"))
    summary = {
        "config": cfg.model_dump(),
        "quick": quick,
        "impls": impls,
        "ceilings": ceil.as_row(),
        "criteria": [c.as_row() for c in crit],
        "all_checks_passed": bool(crit[-1].passed),
        "regressions": int(df["regression"].sum()) if "regression" in df else None,
    }
    write_json(run.file("results.json"), {"summary": summary, "rows": df.to_dict("records")})
    plots = decode_plots(df, run.path)
    failed = not crit[-1].passed or bool(summary["regressions"])
    run.finish("failed" if failed else "passed", {**summary, "plots": [p.name for p in plots]})
    print_tables(df, crit, speedups, ceil.as_row())
    out.console.print(f"results: {run.path}")
    if opts.output.json_out:
        out.print_json(df.to_dict("records"))
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def _ms(value: float | None) -> str:
    return (
        "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
    )


def print_tables(
    df: pd.DataFrame, crit: list[acceptance.Criterion], speedups: pd.DataFrame, ceil: dict
) -> None:
    out.console.print(
        f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s, bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s"
    )
    impls = list(dict.fromkeys(df.impl))
    rows = []
    for case_id, g in df.groupby("case", sort=False):
        cells = []
        for name in impls:
            r = g[g.impl == name].iloc[0]
            if isinstance(r.get("error"), str):
                cells.append("[red]error[/]")
            elif isinstance(r.get("skipped"), str) or pd.isna(r.get("median_ms")):
                cells.append("[dim]n/a[/]")
            else:
                cells.append(f"{_ms(r['median_ms'])} ({r['pct_roofline']:.0f}%)")
        rows.append([case_id, *cells])
    out.console.print(
        out.table("decode latency, median ms (% of roofline)", ["case", *impls], rows)
    )
    skipped = df[df.skipped.notna()].drop_duplicates("impl") if "skipped" in df else df.iloc[0:0]
    for _, r in skipped.iterrows():
        out.console.print(f"[dim]{r.impl}: {r.skipped}[/]", highlight=False)
    errors = df[df.error.notna()] if "error" in df else df.iloc[0:0]
    for _, r in errors.head(10).iterrows():
        out.console.print(f"[red]{r.case} {r.impl}: {r.error}[/]", highlight=False)
    if not speedups.empty:
        sp = speedups[speedups.impl == "native"] if (speedups.impl == "native").any() else speedups
        out.console.print(
            out.table(
                "NoPE speed-up over the zero-padded shim (shim ms / NoPE ms)",
                ["impl", "heads", "tokens", "width", "NoPE ms", "shim ms", "speed-up"],
                [
                    [
                        r.impl,
                        r.heads,
                        r.query_tokens,
                        r.width,
                        _ms(r.nope_ms),
                        _ms(r.shim_ms),
                        f"{r.nope_speedup:.3f}x",
                    ]
                    for r in sp.itertuples()
                ],
            )
        )
    out.console.print(
        out.table(
            "issue 5 acceptance (512 tokens, width 2176, 2051 active)",
            ["criterion", "measured", "spread", "target", "result"],
            [
                [
                    c.name,
                    c.measured,
                    acceptance.spread_band(c),
                    c.target,
                    out.verdict(c.passed)
                    + (" [yellow](within spread)[/]" if c.within_spread else ""),
                ]
                for c in crit
            ],
        )
    )
    if "regression" in df and df.regression.any():
        reg = df[df.regression]
        out.console.print(
            out.table(
                "regressions vs baseline",
                ["case", "impl", "ms", "baseline ms", "ratio"],
                [
                    [r.case, r.impl, _ms(r.median_ms), _ms(r.baseline_ms), f"{r.vs_baseline:.3f}"]
                    for r in reg.itertuples()
                ],
            )
        )
