"""What the command line promises every command: one line for every error with a distinct
exit code, `-h` and `--version`, stdout that pipes under --json, and output that reads well
in a log (wide tables, no wrapped paths)."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys

import pandas as pd
import pytest
import tomllib
import torch
from typer.testing import CliRunner

import nopebench
from nopebench import errors, report
from nopebench.cli import app
from nopebench.commands import verify_layout
from nopebench.config import REPO_ROOT

runner = CliRunner()


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nopebench", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------- exit codes


def test_exit_codes_are_distinct_and_the_readme_lists_each():
    codes = {
        "EXIT_OK": 0,
        "EXIT_CHECK_FAILED": 1,
        "EXIT_USAGE": 2,
        "EXIT_UNSUPPORTED": 3,
        "EXIT_SYSTEM_FAILED": 4,
        "EXIT_INTERRUPTED": 130,
    }
    assert {name: getattr(errors, name) for name in codes} == codes
    assert errors.UsageError.exit_code == 2
    assert errors.UnsupportedError.exit_code == 3 and not issubclass(
        errors.UnsupportedError, errors.UsageError
    )
    assert errors.SystemFailedError.exit_code == 4
    readme = (REPO_ROOT / "README.md").read_text()
    table = dict(re.findall(r"^\| `?(\d+)`? \| ([^|]+) \|", readme, flags=re.M))
    assert set(map(int, table)) >= set(codes.values()), table
    assert "bad input" in table["2"] and "cannot run" in table["3"] and "failed" in table["4"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["verify-layout", "--tokens", "0"], "Invalid value for '--tokens'"),
        (["verify-layout", "--tokens", "many"], "Invalid value for '--tokens'"),
        (["verify-layout", "--bogus"], "No such option: --bogus"),
        (["bogus"], "No such command 'bogus'"),
        (["gsm8k"], "Missing option '--config'"),
    ],
    ids=["tokens-0", "tokens-text", "unknown-flag", "unknown-command", "missing-option"],
)
def test_usage_errors_are_one_line_with_exit_2(args, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("nopebench: error: ") and needle in line
    assert "-h`)" in line  # where to look next
    assert "╭" not in result.stderr and "Usage:" not in result.stderr


def test_usage_error_in_a_real_process_is_one_line():
    proc = cli("verify-layout", "--tokens", "0", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "nopebench: error: Invalid value for '--tokens': Input should be greater than or equal "
        "to 1 (see `nopebench verify-layout -h`)"
    ]


@pytest.mark.parametrize("args", [["-h"], ["verify-layout", "-h"], ["gsm8k", "--help"]])
def test_short_and_long_help(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    assert "Usage: " in result.stdout and "--help" in result.stdout and "-h" in result.stdout
    proc = cli(*args, timeout=60)
    assert proc.returncode == 0 and f"Usage: nopebench {' '.join(args[:-1])}".strip() in proc.stdout


def test_version_is_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert nopebench.__version__ == pyproject["project"]["version"]
    assert result.stdout == f"nopebench {nopebench.__version__}\n"


def test_one_description_for_the_package_the_help_and_the_report(tmp_path):
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["description"] == nopebench.SUMMARY
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0 and nopebench.SUMMARY in result.stdout
    # and the report opens with it: one built from a minimal run record
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text('{"kind": "other", "status": "passed"}')
    text = report.build_report([run], tmp_path / "rep").read_text()
    assert text.splitlines()[2].startswith(nopebench.SUMMARY)


def test_this_machine_cannot_run_that_is_exit_3(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for args in (["bench-decode", "--quick"], ["bench-cache", "--quick"]):
        result = runner.invoke(app, [*args, "--results-dir", str(tmp_path)])
        assert result.exit_code == 3, result.output
        (line,) = result.stderr.splitlines()
        assert "needs a CUDA GPU" in line
    assert not (tmp_path / "bench-decode").exists() and not (tmp_path / "bench-cache").exists()


@pytest.mark.parametrize(
    "exc, code",
    [
        (PermissionError(errno.EACCES, "Permission denied", "/x/y"), 2),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/z"), 2),
        (OSError(errno.ENOSPC, "No space left on device", "/x/big"), 4),
        (OSError(errno.EIO, "Input/output error"), 4),
    ],
    ids=["permission", "missing", "disk-full", "io"],
)
def test_an_os_error_is_one_line_with_its_code(monkeypatch, tmp_path, exc, code):
    def failing(opts):
        raise exc

    monkeypatch.setattr(verify_layout, "execute", failing)
    result = runner.invoke(app, ["verify-layout", "--results-dir", str(tmp_path)])
    assert result.exit_code == code
    (line,) = result.stderr.splitlines()
    assert line == f"nopebench: error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror}"


# ---------------------------------------------------------------- --json pipes


def test_verify_layout_json_pipes_into_a_json_reader(tmp_path):
    """The reported pipeline: `nopebench verify-layout --json | python -c 'json.load(...)'`."""
    proc = subprocess.run(
        f"{sys.executable} -m nopebench verify-layout --tokens 64 --json --results-dir {tmp_path}"
        f" | {sys.executable} -c 'import json,sys; rows = json.load(sys.stdin); print(len(rows))'",
        shell=True,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == 7  # one record per check
    assert "verify-layout: glm53-flash" in proc.stderr and "results: " in proc.stderr


@pytest.mark.slow
def test_check_pagetable_json_is_stdout_alone(tmp_path):
    proc = cli("check-pagetable", "--json", "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows and all({"check", "impl", "result"} <= set(r) for r in rows)
    assert "check-pagetable: glm53-flash" in proc.stderr


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine that says it has a GPU, for the commands' record and print paths only."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        "nopebench.environment.gpu_info",
        lambda: {"gpu": "fake", "sm": 90, "driver": None, "cuda_runtime": None},
    )


def test_bench_cache_json_is_stdout_alone(tmp_path, monkeypatch, fake_gpu):
    from nopebench.bench import cache as cb

    rows = [
        {
            "op": "write",
            "variant": "nope528",
            "tokens": 4096,
            "impl": impl,
            "median_ms": 0.01,
            "gbps": 1000.0,
            "pct_copy": 50.0,
            "speedup": 20.0 if impl == "cuda" else None,
            "check_passed": True,
            "error": None,
        }
        for impl in ("cuda", "torch")
    ]
    monkeypatch.setattr("nopebench.cache_kernels.library.load_library", lambda device: None)
    monkeypatch.setattr(
        cb,
        "run_bench",
        lambda sizes, budget, progress: (rows, cb.summarize(rows, {"copy_gbps": 2000.0})),
    )
    result = runner.invoke(
        app, ["bench-cache", "--tokens", "4096", "--json", "--results-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["impl"] for r in data] == ["cuda", "torch"]
    assert "bench-cache: copy" in result.stderr and "results: " in result.stderr


def test_bench_decode_json_is_stdout_alone(tmp_path, monkeypatch, fake_gpu):
    from nopebench.bench.timing import Ceilings
    from nopebench.commands import bench_decode

    def fake_grid(cfg, model, cases, impls, ceil, budget, progress=None):
        return [
            {
                "case": c.case_id,
                "impl": impl,
                "mode": c.mode,
                "heads": c.heads,
                "query_tokens": c.query_tokens,
                "width": c.width,
                "active": c.active,
                "median_ms": 0.1,
                "p10_ms": 0.09,
                "p90_ms": 0.11,
                "spread": 0.2,
                "pct_roofline": 10.0,
                "passed": True,
                "error": None,
                "skipped": None,
            }
            for c in cases
            for impl in impls
        ]

    monkeypatch.setattr(bench_decode, "measure_ceilings", lambda: Ceilings(3000.0, 500.0))
    monkeypatch.setattr(bench_decode, "run_grid", fake_grid)
    result = runner.invoke(
        app,
        [
            "bench-decode",
            "--quick",
            "--impl",
            "reference",
            "--json",
            "--results-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code in (0, 1), result.output  # the fake grid meets no speed criteria
    data = json.loads(result.stdout)
    assert data and {r["impl"] for r in data} == {"reference"}
    assert "decode latency" in result.stderr and "results: " in result.stderr


# ---------------------------------------------------------------- logs


def test_tables_in_a_log_are_wide_and_paths_unbroken(tmp_path):
    """stdout to a file: the table is laid out 240 columns wide, not 80, and the results path
    stays on one line however long it is."""
    deep = tmp_path / ("d" * 120) / ("e" * 120)
    log = tmp_path / "log"
    with log.open("w") as fh:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "nopebench",
                "verify-layout",
                "--tokens",
                "16",
                "--results-dir",
                str(deep),
            ],
            cwd=REPO_ROOT,
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            env={k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"},
        )
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    (results,) = [x for x in lines if x.startswith("results: ")]
    assert results.startswith(f"results: {deep}/verify-layout/")  # one line, not wrapped
    widths = {len(x) for x in lines if x.startswith(("┏", "┃", "│", "└"))}
    assert max(widths) > 80  # laid out wider than rich's 80-column default
    rows = [x for x in lines if x.startswith("│ reference")]
    assert len(rows) == 7  # one line per check: no cell wrapped
    assert all(len(x) <= 240 for x in lines if not x.startswith("results: "))
    run_dir = next((deep / "verify-layout").iterdir())
    assert pd.read_csv(run_dir / "checks.csv")["passed"].all()
