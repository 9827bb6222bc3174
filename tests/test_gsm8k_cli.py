"""`nopebench gsm8k` as a user runs it: bad input fails in one line with exit 2, and a good run
prints the summary table and exits by the threshold."""

from __future__ import annotations

import os
import shlex

import pytest
from fake_openai_server import FakeOpenAIServer, write_dataset
from gsm8k_helpers import free_port, gsm8k_cli, nopebench_cli, write_config

from nopebench.errors import EXIT_SYSTEM_FAILED, EXIT_USAGE


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


def _one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("nopebench: error: ")
    return lines[0]


def test_server_down_is_one_line_exit_2(tmp_path, env):
    write_dataset(tmp_path / "data", n_test=2)
    port = free_port()  # nothing listens there
    cfg = write_config(tmp_path / "cfg.yaml", f"http://127.0.0.1:{port}")
    proc = gsm8k_cli(cfg, tmp_path / "data", tmp_path / "results", env=env)
    assert proc.returncode == EXIT_USAGE
    line = _one_error_line(proc)
    assert (
        f"server http://127.0.0.1:{port} is not reachable" in line and "Connection refused" in line
    )
    assert not (tmp_path / "results").exists()  # nothing written


def test_data_missing_is_one_line_exit_2(tmp_path, env):
    with FakeOpenAIServer([]) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url)
        missing = gsm8k_cli(cfg, tmp_path / "nowhere", tmp_path / "results", env=env)
        no_hub = gsm8k_cli(cfg, None, tmp_path / "results", env=env)
    assert missing.returncode == EXIT_USAGE
    assert (
        "GSM8K data: " in _one_error_line(missing)
        and "nowhere is not a directory" in missing.stderr
    )
    assert no_hub.returncode == EXIT_USAGE
    assert "pass --data DIR" in _one_error_line(no_hub)
    assert not (tmp_path / "results").exists()


def test_wrong_model_name_is_one_line_exit_2(tmp_path, env):
    write_dataset(tmp_path / "data", n_test=2)
    with FakeOpenAIServer([], model="served-name") as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url, model="other-name")
        proc = gsm8k_cli(cfg, tmp_path / "data", None, env=env)
    assert proc.returncode == EXIT_USAGE
    assert "does not serve model 'other-name' (it serves: served-name)" in _one_error_line(proc)


@pytest.mark.slow
def test_a_good_run_prints_the_table(tmp_path, env):
    problems = write_dataset(tmp_path / "data", n_test=4)
    with FakeOpenAIServer(problems, {problems[0].question: ["wrong"]}) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            server.base_url,
            threshold=0.7,
            reference=[{"label": "upstream 4x SM120", "strict_match": 0.9325}],
        )
        proc = gsm8k_cli(cfg, tmp_path / "data", tmp_path / "results", env=env)
    assert proc.returncode == 0, proc.stderr
    for text in (
        "strict-match",
        "0.7500 ± 0.2500",
        "flexible-extract",
        "problems (n)",
        "invalid answers",
        "wall time",
        "questions/s",
        "reference: upstream 4x SM120",
        "0.9325",
        "pass",
    ):
        assert text in proc.stdout, text
    assert (
        proc.stderr.strip() == ""
    )  # no stray progress bars or library logs in a non-interactive run


@pytest.mark.slow
def test_a_failed_run_says_how_to_resume_and_that_command_works(tmp_path, env):
    problems = write_dataset(tmp_path / "data", n_test=5)
    failing = problems[3].question
    with FakeOpenAIServer(problems, {failing: ["http500_last"]}) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url, max_retries=2)
        failed = gsm8k_cli(cfg, tmp_path / "data", tmp_path / "results", env=env)
        assert failed.returncode == EXIT_SYSTEM_FAILED
        line = _one_error_line(failed)
        assert "GSM8K stopped with 4 of 5 answers kept" in line
        hint = shlex.split(line.split("resume with: ", 1)[1])
        assert hint[:2] == ["nopebench", "gsm8k"] and "--resume" in hint

        server.scripts[failing] = ["correct"]
        resumed = nopebench_cli(*hint[1:], env=env)
        received, answered = server.snapshot()
    assert resumed.returncode == 0, resumed.stderr
    assert "asked this run / from cache" in resumed.stdout and "1 / 4" in resumed.stdout
    assert all(answered[p.question] == 1 for p in problems)
    assert (
        sum(received.values()) == 5 + 2
    )  # the failing question: two failed attempts, then once more
