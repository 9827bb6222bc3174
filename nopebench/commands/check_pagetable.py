"""`nopebench check-pagetable`: run the page-table checks (checks/pagetable.py), record, print."""

from __future__ import annotations

from typing import Any

from nopebench import console as out
from nopebench.checks import flashinfer_validation, pagetable
from nopebench.commands.options import CheckPagetableOptions
from nopebench.config import ModelConfig, load_model_config
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK
from nopebench.records import RunDir, check_results_root, write_csv, write_json


def execute(opts: CheckPagetableOptions) -> int:
    cfg = load_model_config(opts.model)
    check_results_root(opts.output.results_dir)
    report = pagetable.run_checks(cfg, opts.seed)
    rows = report["rows"]
    ok = pagetable.passed(rows)
    run = RunDir.create("check-pagetable", opts.output.results_dir)
    rows = [{"run_id": run.run_id, "model": cfg.name, **r} for r in rows]
    counts = {k: sum(r["result"] == k for r in rows) for k in ("passed", "failed", "skipped")}
    summary = {
        "model": cfg.name,
        "passed": ok,
        **counts,
        "flashinfer": flashinfer_validation.flashinfer_version(),
        "topk_width": cfg.topk_width,
    }
    write_csv(run.file("checks.csv"), rows)
    write_csv(run.file("widths.csv"), [{"run_id": run.run_id, **f} for f in report["width_table"]])
    write_json(
        run.file("checks.json"),
        {
            "summary": summary,
            "checks": rows,
            "width_table": report["width_table"],
            "implementations": report["implementations"],
        },
    )
    run.finish("passed" if ok else "failed", summary)
    print_report(cfg, report, rows)
    out.console.print(f"results: {run.path}")
    if opts.output.json_out:
        out.print_json(rows)
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def print_report(cfg: ModelConfig, report: dict[str, Any], rows: list[dict]) -> None:
    grid = report["width_table"]
    out.console.print(
        out.table(
            "top-k buffer width: round_up(index_topk + kpool - 1, 128)",
            ["index_topk", "kpool", "max active", "width", "pre-fix top_k", "pre-fix fits"],
            [
                (
                    f["index_topk"],
                    f["kpool"],
                    f["max_active"],
                    f["width"],
                    f["pre_fix_sparse_mla_top_k"],
                    f["pre_fix_fits"],
                )
                for f in grid
            ],
        )
    )
    out.console.print(
        out.table(
            "implementations",
            ["impl", "runs here", "why not"],
            [
                (i["impl"], i["refusal"] is None, i["refusal"] or "")
                for i in report["implementations"]
            ],
        )
    )
    verdicts = {"passed": True, "failed": False, "skipped": None}
    out.console.print(
        out.table(
            f"check-pagetable: {cfg.name} (width {cfg.topk_width})",
            ["check", "impl", "case", "result", "detail"],
            [
                (
                    r["check"],
                    r["impl"],
                    pagetable.case_label(r),
                    out.verdict(verdicts[r["result"]]),
                    r["detail"],
                )
                for r in rows
            ],
        )
    )
