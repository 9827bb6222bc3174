"""`nopebench run` passes its flags to every step that takes them, as the same typed options
the single commands get."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nopebench.cli import app
from nopebench.commands import (
    bench_cache,
    bench_decode,
    build,
    check_pagetable,
    gsm8k,
    verify_layout,
)
from nopebench.commands import run as run_command
from nopebench.commands.options import (
    BenchCacheOptions,
    BenchDecodeOptions,
    BuildOptions,
    CheckPagetableOptions,
    Gsm8kOptions,
    VerifyLayoutOptions,
)

STEPS = {
    build: BuildOptions,
    verify_layout: VerifyLayoutOptions,
    check_pagetable: CheckPagetableOptions,
    bench_decode: BenchDecodeOptions,
    bench_cache: BenchCacheOptions,
    gsm8k: Gsm8kOptions,
}


@pytest.fixture
def recorded(monkeypatch):
    """Every step 'runs' (no GPU needed) and records the options it was given."""
    seen: dict[type, object] = {}
    for module, kind in STEPS.items():

        def execute(opts, kind=kind):
            assert isinstance(opts, kind)
            seen[kind] = opts
            return 0

        monkeypatch.setattr(module, "execute", execute)
    monkeypatch.setattr(run_command, "_no_gpu", lambda: None)
    monkeypatch.setattr(run_command, "_no_gpu_or_nvcc", lambda: None)
    monkeypatch.setattr(run_command, "_report", lambda path: None)
    return seen


def test_run_passes_model_and_gsm8k_config_to_every_step(recorded, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--model",
            "dsv32",
            "--gsm8k",
            "glm53-flash-nvfp4-tp4",
            "--results-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert set(recorded) == set(STEPS.values())  # every step ran
    for kind in (VerifyLayoutOptions, CheckPagetableOptions, BenchDecodeOptions):
        assert recorded[kind].model == "dsv32"
    assert recorded[Gsm8kOptions].config == "glm53-flash-nvfp4-tp4"
    run_dir = next((tmp_path / "run").iterdir())
    steps = {s["step"]: s for s in json.loads((run_dir / "steps.json").read_text())}
    assert steps["verify-layout"]["options"]["model"] == "dsv32"  # the record says so too
    assert steps["gsm8k"]["options"]["config"] == "glm53-flash-nvfp4-tp4"
    for opts in recorded.values():  # each step writes inside this run's directory
        output = getattr(opts, "output", None)
        root = output.results_dir if output is not None else getattr(opts, "results_dir", run_dir)
        assert root in (None, run_dir) if isinstance(opts, BuildOptions) else root == run_dir


def test_run_steps_are_the_quick_forms_with_defaults_from_one_place(recorded, tmp_path):
    assert CliRunner().invoke(app, ["run", "--results-dir", str(tmp_path)]).exit_code == 0
    assert recorded[VerifyLayoutOptions].model == VerifyLayoutOptions.model
    assert recorded[VerifyLayoutOptions].impl == "all"
    assert recorded[BenchDecodeOptions].quick and recorded[BenchCacheOptions].quick
    assert recorded[BenchDecodeOptions].config == BenchDecodeOptions.config
    assert Gsm8kOptions not in recorded  # no --gsm8k: that step is skipped, not run
