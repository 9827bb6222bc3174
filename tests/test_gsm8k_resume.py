"""A GSM8K run that fails or is killed part-way keeps every finished answer, and --resume asks
the server only for the missing ones: counted per question on the loopback server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from fake_openai_server import FakeOpenAIServer, write_dataset
from gsm8k_helpers import (
    cache_rows,
    isolate_hf_cache,
    only_run,
    read_json,
    run_dirs,
    wait_for,
    write_config,
)

from nopebench.commands import gsm8k
from nopebench.commands.options import Gsm8kOptions
from nopebench.config import REPO_ROOT
from nopebench.errors import EXIT_OK, SystemFailedError, UsageError

CACHE = "requests_rank0.db"


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


def test_hard_failure_keeps_answers_and_resume_asks_only_the_rest(tmp_path):
    problems = write_dataset(tmp_path / "data", n_test=6)
    failing = problems[2].question
    results = tmp_path / "results"
    with FakeOpenAIServer(problems, {failing: ["http500_last"]}) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url, max_retries=2)
        with pytest.raises(SystemFailedError) as err:
            gsm8k.execute(Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, results))
        message = str(err.value)
        failed_run = only_run(results)
        assert "\n" not in message
        assert "5 of 6 answers kept" in message
        assert "HTTP 500" in message and "after 2 attempts" in message
        assert f"resume with: nopebench gsm8k --config {cfg} --data {tmp_path / 'data'}" in message
        assert message.endswith(f"--resume {failed_run}")
        record = read_json(failed_run / "run.json")
        assert record["status"] == "error" and record["summary"]["answers_kept"] == 5
        assert cache_rows(failed_run / CACHE) == 5
        assert server.snapshot()[0][failing] == 2  # both attempts reached the server

        server.scripts[failing] = ["correct"]
        code = gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", failed_run, results)
        )
        received, answered = server.snapshot()

    assert code == EXIT_OK
    assert all(answered[p.question] == 1 for p in problems)
    assert all(received[p.question] == (3 if p.question == failing else 1) for p in problems)
    resumed = [r for r in run_dirs(results) if r != failed_run][0]
    summary = read_json(resumed / "run.json")["summary"]
    assert (summary["asked"], summary["from_cache"], summary["strict_match"]) == (1, 5, 1.0)
    assert read_json(resumed / "config.json")["resumed_from"] == str(failed_run)
    assert read_json(failed_run / "run.json")["status"] == "error"  # the old run is left as it was


@pytest.mark.slow
def test_killed_run_resumes_with_each_question_answered_once(tmp_path):
    """Kill -9 the real command after exactly 15 answers, then resume: no answer is asked twice.

    The server answers 15 requests and hangs every later one, so at the kill nothing is in flight
    but hung requests: those few questions were sent and never answered, and are asked again."""
    problems = write_dataset(tmp_path / "data", n_test=40)
    results = tmp_path / "results"
    with FakeOpenAIServer(problems, hang_after=15) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url, num_concurrent=4, timeout_s=600)
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nopebench",
                "gsm8k",
                "--config",
                str(cfg),
                "--data",
                str(tmp_path / "data"),
                "--results-dir",
                str(results),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: run_dirs(results) and cache_rows(run_dirs(results)[0] / CACHE) >= 15,
                120,
                "15 answers committed by the child",
            )
            wait_for(
                lambda: sum(server.snapshot()[0].values()) == 15 + 4,
                30,
                "4 hung requests in flight",
            )
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        killed_run = only_run(results)
        assert cache_rows(killed_run / CACHE) == 15
        assert read_json(killed_run / "run.json")["status"] == "running"  # visibly incomplete
        received_before, answered_before = server.snapshot()
        hung = {q for q in received_before if not answered_before[q]}
        assert len(hung) == 4

        server.set_hang_after(None)
        code = gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", killed_run, results)
        )
        received, answered = server.snapshot()

    assert code == EXIT_OK
    assert all(answered[p.question] == 1 for p in problems)  # each question answered once in total
    assert all(received[p.question] == (2 if p.question in hung else 1) for p in problems)
    resumed = [r for r in run_dirs(results) if r != killed_run][0]
    summary = read_json(resumed / "run.json")["summary"]
    assert (summary["from_cache"], summary["asked"], summary["strict_match"]) == (15, 25, 1.0)


def test_resume_refuses_a_different_evaluation(tmp_path):
    problems = write_dataset(tmp_path / "data", n_test=3)
    results = tmp_path / "results"
    with FakeOpenAIServer(problems) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url)
        assert (
            gsm8k.execute(Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, results))
            == EXIT_OK
        )
        first = only_run(results)
        other = write_config(tmp_path / "other.yaml", server.base_url, num_fewshot=3)
        with pytest.raises(UsageError, match=r"that run used num_fewshot = 5, this one 3"):
            gsm8k.execute(Gsm8kOptions(str(other), None, None, tmp_path / "data", first, results))
        with pytest.raises(UsageError, match=r"not a gsm8k run directory"):
            gsm8k.execute(Gsm8kOptions(str(cfg), None, None, tmp_path / "data", tmp_path, results))
        # The same evaluation resumed after it finished asks nothing at all.
        before = sum(server.snapshot()[0].values())
        assert (
            gsm8k.execute(Gsm8kOptions(str(cfg), None, None, tmp_path / "data", first, results))
            == EXIT_OK
        )
        assert sum(server.snapshot()[0].values()) == before
    assert len(run_dirs(results)) == 2


def test_ctrl_c_records_the_run_as_interrupted_with_the_resume_command(
    tmp_path, monkeypatch, capsys
):
    import nopebench.commands.gsm8k as command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run_lm_eval", interrupted)
    problems = write_dataset(tmp_path / "data", n_test=3)
    with FakeOpenAIServer(problems) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url)
        with pytest.raises(KeyboardInterrupt):
            gsm8k.execute(
                Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
            )
    run = only_run(tmp_path / "results")
    record = read_json(run / "run.json")
    assert record["status"] == "interrupted" and record["summary"]["resume"].endswith(
        f"--resume {run}"
    )
    assert f"resume with: nopebench gsm8k --config {cfg}" in capsys.readouterr().err
