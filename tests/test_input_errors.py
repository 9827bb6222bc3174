"""Bad input is one line and exit 2, found before any work: results directories that cannot be
written, path components no file system takes, duplicate YAML keys, a bad config given to
`run`. And an installed package (not the checkout) finds its configs from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from nopebench.cli import app
from nopebench.commands import check_pagetable, verify_layout
from nopebench.config import CONFIG_ROOT, REPO_ROOT

runner = CliRunner()
LONG = "a" * 300


def one_error_line(result) -> str:
    assert result.stdout == "", result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith("nopebench: error: ")
    return line


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a check starts: every refusal here must come before any work."""

    def started(*args, **kwargs):
        raise AssertionError("the work started before the input was refused")

    monkeypatch.setattr(verify_layout, "verify_layout", started)
    monkeypatch.setattr(check_pagetable.pagetable, "run_checks", started)


@pytest.mark.parametrize("command", ["verify-layout", "check-pagetable"])
def test_results_dir_that_is_a_file_is_refused_before_any_work(tmp_path, no_work, command):
    target = tmp_path / "README.md"
    target.write_text("x")
    line = one_error_line(runner.invoke(app, [command, "--results-dir", str(target)]))
    assert f"--results-dir {target}: a file is in the way" in line
    nested = target / "sub"
    line = one_error_line(runner.invoke(app, [command, "--results-dir", str(nested)]))
    assert f"({target} is one)" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_read_only_results_dir_is_refused(tmp_path, no_work):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        result = runner.invoke(app, ["verify-layout", "--results-dir", str(ro / "results")])
        assert result.exit_code == 2
        assert "cannot write there" in one_error_line(result)
    finally:
        ro.chmod(0o755)


def test_immutable_results_dir_is_refused(tmp_path, no_work):
    """chattr +i stops even root (the case a read-only mode bit cannot show when tests run
    as root)."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(frozen)]).returncode != 0:
        pytest.skip("cannot set the immutable attribute here")
    try:
        result = runner.invoke(app, ["verify-layout", "--results-dir", str(frozen)])
        assert result.exit_code == 2
        line = one_error_line(result)
        assert f"--results-dir {frozen}: cannot write there" in line
        assert "Operation not permitted" in line
    finally:
        subprocess.run([chattr, "-i", str(frozen)], check=True)


def test_report_output_that_is_a_file_is_refused(tmp_path):
    root = tmp_path / "results"
    assert (
        runner.invoke(
            app, ["verify-layout", "--tokens", "16", "--results-dir", str(root)]
        ).exit_code
        == 0
    )
    readme = tmp_path / "README.md"
    readme.write_text("keep me")
    result = runner.invoke(app, ["report", "--results-dir", str(root), "--output", str(readme)])
    assert result.exit_code == 2
    assert f"--output {readme}: a file is in the way" in one_error_line(result)
    assert readme.read_text() == "keep me"


def test_a_results_dir_in_the_real_process_is_one_line(tmp_path):
    """The reported case exactly: `verify-layout --results-dir README.md`, a real process."""
    target = tmp_path / "README.md"
    target.write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "nopebench", "verify-layout", "--results-dir", str(target)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "a file is in the way" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["verify-layout", "--model", f"{LONG}.yaml"],
        ["check-pagetable", "--model", f"{LONG}.yaml"],
        ["bench-decode", "--config", f"/tmp/{LONG}/x.yaml"],
        ["verify-layout", "--results-dir", f"/tmp/{LONG}"],
        ["report", "--output", f"/tmp/{LONG}"],
    ],
    ids=["model", "pagetable-model", "bench-config", "results-dir", "report-output"],
)
def test_a_path_component_over_255_bytes_is_one_line(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "a path component is " in line and "file systems allow 255" in line
    assert len(line) < 300  # the 300-character name is shortened in the message


def test_duplicate_yaml_keys_are_refused_naming_the_key(tmp_path):
    text = (CONFIG_ROOT / "models" / "glm53-flash.yaml").read_text()
    assert text.count("\nnum_heads:") == 1
    bad = tmp_path / "dup.yaml"
    bad.write_text(text + "num_heads: 32\n")
    result = runner.invoke(app, ["verify-layout", "--model", str(bad)])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "duplicate key 'num_heads'" in line and str(bad) in line
    first = 1 + text.split("\n").index(
        next(x for x in text.split("\n") if x.startswith("num_heads:"))
    )
    assert f"first given at line {first}" in line


def test_duplicate_keys_nested_and_in_gsm8k_configs(tmp_path):
    from nopebench.errors import UsageError
    from nopebench.gsm8k.config import load_gsm8k_config

    bad = tmp_path / "g.yaml"
    bad.write_text(
        "version: 1\nname: x\nmodel: m\nthreshold: 0.5\n"
        "server:\n  base_url: http://127.0.0.1:1\n  base_url: http://127.0.0.1:2\n"
    )
    with pytest.raises(UsageError, match=r"duplicate key 'base_url' \(first given at line 6\)"):
        load_gsm8k_config(bad)
    # the same key in two different mappings is not a duplicate
    ok = tmp_path / "ok.yaml"
    ok.write_text("a: {x: 1}\nb: {x: 2}\n")
    from nopebench.config import read_yaml_mapping

    assert read_yaml_mapping(ok) == {"a": {"x": 1}, "b": {"x": 2}}


def test_run_refuses_a_bad_gsm8k_config_before_any_step(tmp_path, monkeypatch):
    def started(opts):
        raise AssertionError("a step ran before the configs were checked")

    monkeypatch.setattr(verify_layout, "execute", started)
    result = runner.invoke(
        app, ["run", "--gsm8k", "/nonexistent.yaml", "--results-dir", str(tmp_path / "res")]
    )
    assert result.exit_code == 2
    assert one_error_line(result) == "nopebench: error: /nonexistent.yaml: config file not found"
    assert not (tmp_path / "res").exists()


def test_run_refuses_an_unwritable_results_dir_before_any_step(tmp_path, monkeypatch):
    monkeypatch.setattr(verify_layout, "execute", lambda opts: 1 / 0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = runner.invoke(app, ["run", "--results-dir", str(blocker)])
    assert result.exit_code == 2 and "a file is in the way" in one_error_line(result)
