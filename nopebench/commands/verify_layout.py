"""`nopebench verify-layout`: run the layout checks, print the table, record the run."""

from __future__ import annotations

from nopebench import console as out
from nopebench import memory
from nopebench.checks.layout import (
    IMPLEMENTATIONS,
    LayoutReport,
    memory_bytes,
    model_case,
    sweep_cases,
    tokens_that_fit,
    verify_layout,
)
from nopebench.commands.options import VerifyLayoutOptions
from nopebench.config import load_model_config
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UnsupportedError, UsageError
from nopebench.records import RunDir, check_results_root, write_csv, write_json


def parse_impls(impl: str) -> list[str]:
    if impl == "all":
        return list(IMPLEMENTATIONS)
    if impl not in IMPLEMENTATIONS:
        raise UsageError(f"--impl {impl!r}: choose one of {', '.join([*IMPLEMENTATIONS, 'all'])}")
    return [impl]


def execute(opts: VerifyLayoutOptions) -> int:
    cfg = load_model_config(opts.model)
    impl = opts.impl
    impls = parse_impls(impl)
    cases = sweep_cases(cfg, opts.seed) if opts.sweep else [model_case(cfg, opts.tokens, opts.seed)]
    check_memory(cases, opts.sweep)
    check_results_root(opts.output.results_dir)
    with out.progress_bar("verify-layout", total=len(cases) * len(impls)) as advance:
        report = verify_layout(cases, impls, progress=advance)
    if impl != "all" and impl in report.skipped:
        raise UnsupportedError(f"--impl {impl}: {report.skipped[impl]}")
    run = RunDir.create("verify-layout", opts.output.results_dir)
    write_csv(run.file("checks.csv"), report.rows)
    summary = {
        "model": cfg.name,
        "passed": report.passed,
        "cases": len(cases),
        "skipped": report.skipped,
    }
    write_json(run.file("checks.json"), {"summary": summary, "checks": report.rows})
    run.finish("passed" if report.passed else "failed", summary)
    print_report(cfg.name, report)
    out.console.print(f"results: {run.path}")
    if opts.output.json_out:
        out.print_json(report.rows)
    return EXIT_OK if report.passed else EXIT_CHECK_FAILED


def check_memory(cases: list, sweep: bool) -> None:
    """Refuse, before anything is allocated, a case that would not fit in this machine's
    memory (cases run one at a time: the largest decides), saying what would fit."""
    largest = max(cases, key=memory_bytes)
    have = memory.available_bytes()
    if sweep:
        what, fits = "verify-layout --sweep", f"its largest case has {largest.tokens} tokens"
    else:
        what = f"verify-layout --tokens {largest.tokens}"
        n = tokens_that_fit(largest, have) if have is not None else 0
        fits = f"at most --tokens {n} fits" if n else "no case fits"
    memory.require(memory_bytes(largest), what, fits)


def print_report(model_name: str, report: LayoutReport) -> None:
    """One line per (impl, check), aggregated over cases: rows, verdict, worst error."""
    grouped: dict[tuple[str, str], dict] = {}
    for r in report.rows:
        key = (r["impl"], r["check"])
        g = grouped.setdefault(
            key, {"rows": 0, "passed": True, "worst": None, "detail": "", "cases": 0}
        )
        g["rows"] += r["rows"]
        g["cases"] += 1
        g["passed"] &= r["passed"]
        if r["worst"] is not None:
            g["worst"] = max(g["worst"] or 0.0, r["worst"])
        if not r["passed"] and not g["detail"]:
            g["detail"] = f"{r['case']}: {r['detail']}"
    rows = [
        (impl, check, g["cases"], g["rows"], out.verdict(g["passed"]), g["worst"], g["detail"])
        for (impl, check), g in grouped.items()
    ]
    rows += [
        (impl, "(not run)", 0, 0, out.verdict(None), None, why)
        for impl, why in report.skipped.items()
    ]
    out.console.print(
        out.table(
            f"verify-layout: {model_name}",
            ["impl", "check", "cases", "rows", "result", "worst", "detail"],
            rows,
        )
    )
