"""`nopebench report`: one Markdown report with plots from run directories (report.py)."""

from __future__ import annotations

from pathlib import Path

from nopebench import console as out
from nopebench.commands.options import ReportOptions
from nopebench.errors import EXIT_OK
from nopebench.records import DEFAULT_RESULTS, RunDir, check_results_root, check_writable_dir
from nopebench.report import build_report, collect_runs


def execute(opts: ReportOptions) -> int:
    root = Path(opts.results_dir) if opts.results_dir else DEFAULT_RESULTS
    output = opts.output
    if output is not None:
        check_writable_dir(Path(output), "--output")
    chosen = collect_runs(list(opts.runs) or None, root)
    if output is None:
        check_results_root(root)
        target = RunDir.create("report", root)
        path = build_report(chosen, target.path)
        target.finish("passed", {"runs": [str(p) for p in chosen], "report": str(path)})
    else:
        path = build_report(chosen, Path(output))
    out.console.print(f"report: {path}")
    return EXIT_OK
