"""Installed use: the bundled configs and CUDA sources ship inside the package, and results
go under the working directory, so a wheel installed anywhere works from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nopebench.cli import app
from nopebench.config import CONFIG_ROOT, REPO_ROOT, load_model_config

runner = CliRunner()


def test_default_results_dir_is_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["verify-layout", "--tokens", "16"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "results" / "verify-layout").iterdir()
    assert "results: results/verify-layout/" in result.stdout


def test_bundled_configs_ship_inside_the_package():
    import nopebench

    package = Path(nopebench.__file__).parent
    assert package / "configs" == CONFIG_ROOT
    for kind, name in [
        ("models", "glm53-flash"),
        ("bench", "h200-nope"),
        ("gsm8k", "glm53-flash-nvfp4-tp4"),
    ]:
        assert (CONFIG_ROOT / kind / f"{name}.yaml").is_file()
    assert load_model_config("glm53-flash").name == "glm53-flash"


@pytest.mark.slow
def test_a_wheel_installed_elsewhere_works_from_any_directory(tmp_path):
    """pip install --target X of a copy of the package, run from a directory that is neither
    X nor the checkout: configs are found, results land under the working directory."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    shutil.copytree(
        REPO_ROOT / "nopebench", src / "nopebench", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "X"
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if pip.returncode != 0 and "No module named" in pip.stderr:
        pytest.skip(f"cannot build a wheel here: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr
    assert (target / "nopebench" / "configs" / "models" / "glm53-flash.yaml").is_file()
    assert (target / "nopebench" / "cache_kernels" / "cuda" / "cache_kernels.cu").is_file()
    native = target / "nopebench" / "impls" / "native"
    for name in ("register_decode.cu", "register_decode.cuh", "emulator.cpp"):
        assert (native / "cuda" / name).is_file(), name
    assert (target / "nopebench" / "cuda" / "emulator.h").is_file()  # the emulators' threads
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import nopebench, sys; print(nopebench.__file__); from nopebench.cli import main; "
            "sys.argv = ['nopebench', 'verify-layout', '--tokens', '16']; main()",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == str(target / "nopebench" / "__init__.py")
    (run_dir,) = (work / "results" / "verify-layout").iterdir()
    assert (run_dir / "run.json").is_file()
    report = subprocess.run(
        [sys.executable, "-c",
         "import sys; from nopebench.cli import main; sys.argv = ['nopebench', 'report']; main()"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    (report_dir,) = (work / "results" / "report").iterdir()
    assert (report_dir / "report.md").is_file()
    assert not (target / "results").exists()  # nothing written beside the installed package
