"""`nopebench compare RUN_A RUN_B`: two runs of one kind side by side per cell (run_compare.py)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape

from nopebench import console as out
from nopebench.bench.acceptance import noise_floor_pct
from nopebench.bench.run_compare import (
    compare_runs,
    load_run,
    summary_line,
    table_columns,
    table_rows,
)
from nopebench.commands.options import CompareOptions
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from nopebench.records import _jsonable

SUFFIXES = (".csv", ".json")


def _check_output(path: Path | None) -> None:
    if path is None:
        return
    if path.suffix not in SUFFIXES:
        raise UsageError(f"--output {path}: give a .csv (the cells) or .json (everything) path")
    if path.exists():
        raise UsageError(f"--output {path}: already exists; compare never replaces a file")
    if not path.parent.is_dir():
        raise UsageError(f"--output {path}: no directory {path.parent}")


def _write_new(path: Path, comparison) -> None:
    """Create `path` (exclusive: a file that appeared meanwhile is left alone)."""
    try:
        with path.open("x", encoding="utf-8", newline="") as f:
            if path.suffix == ".csv":
                comparison.cells.to_csv(f, index=False, float_format="%.17g")
            else:
                f.write(json.dumps(_jsonable(comparison.as_dict()), indent=2) + "\n")
    except FileExistsError:
        raise UsageError(
            f"--output {path}: already exists; compare never replaces a file"
        ) from None


def _styled(cell: object) -> object:
    return {"REGRESSION": "[bold red]REGRESSION[/]", "faster": "[green]faster[/]"}.get(cell, cell)


def execute(opts: CompareOptions) -> int:
    _check_output(opts.output)
    comparison = compare_runs(
        load_run(opts.run_a, "RUN_A"), load_run(opts.run_b, "RUN_B"), opts.noise_floor
    )
    # with --json, stdout carries only the data
    con = out.err_console if opts.json_out else out.console
    a, b = comparison.a.describe(), comparison.b.describe()
    con.print(
        out.table(
            f"{comparison.kind}: A is the baseline, B / A > 1 is B slower",
            ["run", "run id", "git", "GPU", "when (UTC)", "status"],
            [
                [
                    name,
                    d["run_id"],
                    f"{(d['git_sha'] or '-')[:12]}{' (dirty)' if d['git_dirty'] else ''}",
                    d["gpu"],
                    d["timestamp"],
                    d["status"],
                ]
                for name, d in (("A", a), ("B", b))
            ],
        )
    )
    con.print(
        out.table(
            "per cell: median ms and spread ((p90 - p10) / median); marked beyond the "
            f"larger spread and the {noise_floor_pct(comparison.noise_floor)} noise floor",
            table_columns(comparison),
            [[_styled(cell) for cell in row] for row in table_rows(comparison)],
        )
    )
    for difference in comparison.differences():
        con.print(
            f"[yellow]runs differ in {escape(difference)}[/]", highlight=False, soft_wrap=True
        )
    con.print(summary_line(comparison), highlight=False, soft_wrap=True)
    if opts.output is not None:
        _write_new(opts.output, comparison)
        con.print(f"comparison: {opts.output}")
    if opts.json_out:
        out.print_json(comparison.as_dict())
    return EXIT_CHECK_FAILED if comparison.summary()["regressions"] else EXIT_OK
