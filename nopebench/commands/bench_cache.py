"""`nopebench bench-cache`: check, then time, the CUDA cache kernels; record and print."""

from __future__ import annotations

import torch

from nopebench import console as out
from nopebench.bench import cache
from nopebench.commands.options import BenchCacheOptions
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UnsupportedError
from nopebench.records import RunDir, check_results_root, write_csv, write_json


def execute(opts: BenchCacheOptions) -> int:
    sizes = opts.token_counts()
    check_results_root(opts.output.results_dir)
    if not torch.cuda.is_available():
        raise UnsupportedError(
            "bench-cache times CUDA kernels and needs a CUDA GPU; none is visible"
        )
    from nopebench.cache_kernels.library import load_library

    load_library(torch.device("cuda"))  # build (or load) before anything is timed
    run = RunDir.create("bench-cache", opts.output.results_dir)
    budget = cache.QUICK_BUDGET_S if opts.quick else cache.BUDGET_S
    with out.progress_bar("bench-cache", total=len(sizes) * len(cache.VARIANTS)) as advance:
        rows, summary = cache.run_bench(sizes, budget, advance)
    rows = [{"run_id": run.run_id, **r} for r in rows]
    write_csv(run.file("results.csv"), rows)
    write_json(run.file("results.json"), {"summary": summary, "rows": rows})
    passed = summary["checks_passed"] and not summary["errors"]
    run.finish("passed" if passed else "failed", summary)
    print_table(rows, summary)
    out.console.print(f"results: {run.path}")
    if opts.output.json_out:
        out.print_json(rows)
    return EXIT_OK if passed else EXIT_CHECK_FAILED


def print_table(rows: list[dict], summary: dict) -> None:
    torch_rows = {(r["op"], r["variant"], r["tokens"]): r for r in rows if r["impl"] == "torch"}
    table_rows = []
    for r in (r for r in rows if r["impl"] == "cuda"):
        ref = torch_rows.get((r["op"], r["variant"], r["tokens"]), {})
        check = out.verdict(bool(r.get("check_passed")) and not r.get("error"))
        table_rows.append(
            (
                r["op"],
                r["variant"],
                r["tokens"],
                r.get("median_ms"),
                r.get("gbps"),
                r.get("pct_copy"),
                ref.get("gbps"),
                r.get("speedup"),
                check,
                ref.get("check_passed"),
                r.get("error") or "",
            )
        )
    columns = [
        "op",
        "rows",
        "T",
        "cuda ms",
        "cuda GB/s",
        "% copy",
        "torch GB/s",
        "speed-up",
        "cuda = ref",
        "torch gpu = ref",
        "error",
    ]
    title = f"bench-cache: copy {summary['copy_gbps']:.0f} GB/s (read + write)"
    out.console.print(out.table(title, columns, table_rows))
    met = summary["targets_met"]
    if met:
        missed = [k for k, ok in met.items() if not ok]
        line = "all met" if not missed else f"missed: {', '.join(missed)}"
        out.console.print(
            f"targets at T >= {cache.TARGET_MIN_TOKENS} "
            f"(>= {cache.TARGET_PCT_COPY:.0f}% of copy, >= {cache.TARGET_SPEEDUP:.0f}x torch): "
            f"{line}"
        )
