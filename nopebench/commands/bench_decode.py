"""`nopebench bench-decode`: check and time the grid, write records, print the tables.

Every results row carries where it ran (run id, GPU, SM, git sha), the library behind its
implementation, and `repro`: the command that runs that one cell again.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pandas as pd

from nopebench import console as out
from nopebench import environment
from nopebench.bench import acceptance
from nopebench.bench.decode_cases import (
    BenchConfig,
    grid,
    load_bench_config,
    model_for,
    select_cases,
)
from nopebench.bench.decode_runner import run_grid
from nopebench.bench.run_compare import read_results
from nopebench.bench.timing import measure_ceilings
from nopebench.commands.options import BenchDecodeOptions
from nopebench.environment import clock_sampler
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UnsupportedError, UsageError
from nopebench.impls import registry
from nopebench.nvml import clock_warning
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
    required = ("case", "impl", "median_ms", "spread", "error")
    return read_results(path, "--baseline", required, "a bench-decode results.csv")


def repro_command(opts: BenchDecodeOptions, row: dict) -> str:
    """The command that runs exactly this row's cell again: same config, model and grid
    (full or quick), this implementation, and the four filters that name the cell."""
    args = ["nopebench", "bench-decode", "--config", opts.config]
    if opts.model is not None:
        args += ["--model", opts.model]
    if opts.quick:
        args.append("--quick")
    args += [
        "--impl",
        str(row["impl"]),
        "--heads",
        str(row["heads"]),
        "--tokens",
        str(row["query_tokens"]),
        "--width",
        str(row["width"]),
        "--mode",
        str(row["mode"]),
    ]
    return shlex.join(args)


def provenance(run: RunDir) -> dict:
    """The columns that say where a row was measured."""
    h = run.header
    return {
        "run_id": run.run_id,
        "gpu": h.get("gpu"),
        "sm": h.get("sm"),
        "git_sha": h.get("git_sha"),
        "git_dirty": h.get("git_dirty"),
    }


def execute(opts: BenchDecodeOptions) -> int:
    cfg = load_bench_config(opts.config)
    if opts.model is not None:
        cfg = cfg.model_copy(update={"model": opts.model})
    model = model_for(cfg)
    impls = resolve_impls(cfg, opts.impls)
    base = read_baseline(opts.baseline)
    check_results_root(opts.output.results_dir)
    quick = opts.quick and cfg.quick is not None
    cases = select_cases(
        grid(cfg, quick),
        opts.heads,
        opts.tokens,
        opts.widths,
        opts.modes,
        grid_name=f"{cfg.name}'s quick grid" if quick else cfg.name,
    )
    if environment.gpu_info().get("gpu") is None:
        raise UnsupportedError(
            "bench-decode times GPU kernels and needs a CUDA GPU; none is visible "
            "(check-pagetable runs the decode checks on CPU)"
        )
    budget = cfg.quick.budget_s if quick else cfg.timing.budget_s
    run = RunDir.create("bench-decode", opts.output.results_dir)
    out.console.print("measuring device ceilings (copy bandwidth, bf16 matmul)...")
    ceil = measure_ceilings()
    # The SM clock is sampled before each case (the GPU still busy from the ceilings or the
    # case before) and after the last; the summary says how far it moved.
    with clock_sampler() as clocks, out.progress_bar("bench-decode", total=len(cases)) as advance:

        def step(label: str) -> None:
            clocks.sample(f"before {label}")
            advance(label)

        rows = run_grid(cfg, model, cases, impls, ceil, budget, progress=step)
        clocks.sample("end")
    where = provenance(run)
    rows = [{**r, **where, "repro": repro_command(opts, r)} for r in rows]
    df = pd.DataFrame(rows)
    if base is not None:
        df = acceptance.mark_regressions(df, base, opts.noise_floor)
    crit = acceptance.criteria(df, cfg.criteria)
    answer = acceptance.nope_answer(df)
    write_csv(run.file("results.csv"), df.to_dict("records"))
    write_csv(run.file("nope_vs_shim.csv"), answer.to_dict("records"))
    write_csv(run.file("criteria.csv"), [c.as_row() for c in crit])
    write_csv(
        run.file("criteria_cells.csv"),
        [row for c in crit for row in c.cell_rows()],
        acceptance.CELL_ROW_COLUMNS,
    )
    summary = {
        "config": cfg.model_dump(),
        "quick": quick,
        "impls": impls,
        "filters": {
            "heads": list(opts.heads),
            "tokens": list(opts.tokens),
            "width": list(opts.widths),
            "mode": list(opts.modes),
        },
        "cases": len(cases),
        "ceilings": ceil.as_row(),
        "criteria": [c.as_row() for c in crit],
        "all_checks_passed": bool(crit[-1].passed),
        "regressions": int(df["regression"].sum()) if "regression" in df else None,
        "baseline": None if base is None else str(opts.baseline),
        "noise_floor": None if base is None else opts.noise_floor,
        "sm_clock": clocks.summary(),
    }
    write_json(run.file("results.json"), {"summary": summary, "rows": df.to_dict("records")})
    plots = decode_plots(df, run.path)
    failed = not crit[-1].passed or bool(summary["regressions"])
    run.finish("failed" if failed else "passed", {**summary, "plots": [p.name for p in plots]})
    print_tables(df, crit, answer, ceil.as_row())
    if warning := clock_warning(summary["sm_clock"]):
        out.err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    out.console.print(f"results: {run.path}")
    if opts.output.json_out:
        out.print_json(df.to_dict("records"))
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def _ms(value: float | None) -> str:
    return (
        "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
    )


def _text(value: object) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def peers_rows(df: pd.DataFrame) -> list[list[str]]:
    """One row per implementation: the serving backend it stands for ('none' where no engine
    runs it), whether a server can deploy it, the accuracy class it was held to, its library."""
    cols = ["impl", "serving_backend", "deployable", "accuracy_class", "library", "library_version"]
    first = df.drop_duplicates("impl").reindex(columns=cols)
    rows = []
    for r in first.itertuples():
        backend = _text(r.serving_backend)
        rows.append(
            [
                r.impl,
                "none" if backend == "-" else backend,
                _text(r.deployable),
                _text(r.accuracy_class),
                f"{_text(r.library)} {_text(r.library_version)}",
            ]
        )
    return rows


ANSWER_NOTE = (
    "vs X = X's time / this NoPE time (> 1: NoPE is faster). best shim: over every "
    "implementation that ran; best deployable: over the implementations a serving engine runs "
    "on the fp8 cache, in any mode (bounds such as fa3 over a bf16 copy excluded)."
)


def print_tables(
    df: pd.DataFrame, crit: list[acceptance.Criterion], answer: pd.DataFrame, ceil: dict
) -> None:
    out.console.print(
        f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s, "
        f"bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s"
    )
    out.console.print(
        out.table(
            "implementations",
            ["impl", "serving backend", "deployable", "accuracy class", "library"],
            peers_rows(df),
        )
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
    if not answer.empty:
        out.console.print(
            out.table(
                "NoPE against the shim, median ms",
                acceptance.ANSWER_COLUMNS,
                acceptance.answer_rows(answer, _ms, _text),
            )
        )
        out.console.print(f"[dim]{ANSWER_NOTE}[/]", highlight=False)
    out.console.print(
        out.table(
            "acceptance criteria (the bench config's)",
            ["criterion", "cell", "measured", "spread", "target", "result"],
            [
                [
                    c.name,
                    c.where(),
                    c.measured,
                    acceptance.spread_band(c),
                    c.target,
                    out.verdict(c.passed)
                    + (" [yellow](within spread)[/]" if c.within_spread else "")
                    + (f" [dim]({c.cells_note()})[/]" if c.cells_note() else ""),
                ]
                for c in crit
            ],
        )
    )
    if "regression" in df and df.regression.any():
        reg = df[df.regression]
        out.console.print(
            out.table(
                "regressions vs baseline (slower beyond the larger spread and the "
                f"{acceptance.noise_floor_pct(reg.noise_floor.iloc[0])} noise floor)",
                ["case", "impl", "ms", "baseline ms", "ratio"],
                [
                    [r.case, r.impl, _ms(r.median_ms), _ms(r.baseline_ms), f"{r.vs_baseline:.3f}"]
                    for r in reg.itertuples()
                ],
            )
        )
