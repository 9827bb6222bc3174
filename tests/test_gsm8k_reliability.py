"""GSM8K never hangs or storms a failing server: a stall stops the run, a run of failed requests
stops it early, a broken server is told apart from an absent one, progress reaches a log at a
steady pace, and a --limit sample is reported, not judged. Loopback servers on 127.0.0.1 only,
every run bounded in time and in requests."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fake_openai_server import FakeOpenAIServer, write_dataset
from gsm8k_helpers import (
    gsm8k_cli,
    isolate_hf_cache,
    only_run,
    read_json,
    run_dirs,
    write_config,
)

from nopebench.commands import gsm8k
from nopebench.commands.options import Gsm8kOptions
from nopebench.errors import EXIT_OK, EXIT_SYSTEM_FAILED, SystemFailedError, UsageError
from nopebench.gsm8k.config import Gsm8kConfig
from nopebench.gsm8k.evaluate import Guard


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


@pytest.fixture
def env(tmp_path):
    return {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "NOPEBENCH_PROGRESS_S": "0.5",
    }


def run_gsm8k(tmp_path, cfg, limit=None, resume=None):
    return gsm8k.execute(
        Gsm8kOptions(str(cfg), None, limit, tmp_path / "data", resume, tmp_path / "results")
    )


def test_the_defaults_bound_a_stall_and_a_run_of_failures():
    cfg = Gsm8kConfig(name="x", model="m", threshold=0.5)
    assert cfg.stall_timeout_s == 900 and cfg.max_consecutive_failures == 32


def test_a_server_that_never_answers_stops_at_the_stall_bound(tmp_path):
    """Health checks pass, no completion ever comes: with timeout_s 600 and 3 attempts lm-eval
    alone would wait (40 / 4) x 600 s per attempt; the stall bound stops it in seconds."""
    problems = write_dataset(tmp_path / "data", n_test=40)
    with FakeOpenAIServer(problems, hang_after=0) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            server.base_url,
            num_concurrent=4,
            timeout_s=600,
            stall_timeout_s=1.5,
        )
        started = time.monotonic()
        with pytest.raises(SystemFailedError) as err:
            run_gsm8k(tmp_path, cfg)
        elapsed = time.monotonic() - started
        received, _ = server.snapshot()
    message = str(err.value)
    assert "\n" not in message
    assert "GSM8K stopped with 0 of 40 answers kept" in message
    assert "no answer completed for 1.5 s (stall_timeout_s)" in message
    assert "resume with: nopebench gsm8k" in message
    assert elapsed < 60  # task loading included; the stall itself is 1.5 s
    assert sum(received.values()) == 4  # the first requests in flight, nothing retried
    record = read_json(only_run(tmp_path / "results") / "run.json")
    assert record["status"] == "error" and record["summary"]["answers_kept"] == 0


def test_a_stall_after_some_answers_keeps_them_and_the_resume_finishes(tmp_path):
    problems = write_dataset(tmp_path / "data", n_test=12)
    with FakeOpenAIServer(problems, hang_after=5) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            server.base_url,
            num_concurrent=2,
            timeout_s=600,
            stall_timeout_s=1,
        )
        with pytest.raises(SystemFailedError, match="with 5 of 12 answers kept"):
            run_gsm8k(tmp_path, cfg)
        stalled = only_run(tmp_path / "results")
        server.set_hang_after(None)
        assert run_gsm8k(tmp_path, cfg, resume=stalled) == EXIT_OK
        _, answered = server.snapshot()
    assert all(answered[p.question] == 1 for p in problems)  # no answer asked twice
    resumed = [r for r in run_dirs(tmp_path / "results") if r != stalled][0]
    assert read_json(resumed / "run.json")["summary"]["from_cache"] == 5


@pytest.mark.parametrize("limit", [8, None], ids=["configured", "default"])
def test_a_server_answering_every_request_with_500_is_not_stormed(tmp_path, limit):
    """Without the bound lm-eval sends nearly two attempts per problem (about 2 x 120 here)
    before the first request's last attempt fails."""
    problems = write_dataset(tmp_path / "data", n_test=120)
    scripts = {p.question: ["http500"] for p in problems}
    fields = {"max_consecutive_failures": limit} if limit else {}
    with FakeOpenAIServer(problems, scripts) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml", server.base_url, num_concurrent=8, max_retries=3, **fields
        )
        with pytest.raises(SystemFailedError) as err:
            run_gsm8k(tmp_path, cfg)
        received, _ = server.snapshot()
    bound = limit or 32
    assert sum(received.values()) <= bound + 8  # the bound, plus what was already in flight
    message = str(err.value)
    assert f"requests failed in a row (max_consecutive_failures = {bound})" in message
    assert "HTTP 500" in message and "0 of 120 answers kept" in message


def test_a_run_of_failures_is_reset_by_an_answer():
    """Failures spread among answers never add up to a stop: only a run of them does."""
    guard = Guard(stall_timeout_s=60, max_failures=3)
    for _ in range(10):
        guard.failed(OSError("boom"))
        guard.failed(OSError("boom"))
        guard.answered()
    assert guard.reason is None
    for _ in range(3):
        guard.failed(TimeoutError())
    assert guard.reason == (
        "3 requests failed in a row (max_consecutive_failures = 3), the last with "
        "no answer within timeout_s"
    )


def test_http_500_on_the_readiness_check_is_not_called_unreachable(tmp_path, env):
    write_dataset(tmp_path / "data", n_test=2)
    with FakeOpenAIServer([], models_status=500) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url)
        proc = gsm8k_cli(cfg, tmp_path / "data", tmp_path / "results", env=env)
    assert proc.returncode == EXIT_SYSTEM_FAILED
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"nopebench: error: server {server.base_url} is reachable but failing: "
        "GET /v1/models answered HTTP 500; check its log"
    )
    assert "not reachable" not in line
    assert not (tmp_path / "results").exists()


def test_progress_reaches_a_log_at_a_steady_pace_and_a_stall_exits_4(tmp_path, env):
    """The real command with stderr to a pipe (not a terminal): a progress line every 0.5 s
    (NOPEBENCH_PROGRESS_S), then one error line with the answers kept and the resume command."""
    problems = write_dataset(tmp_path / "data", n_test=10)
    with FakeOpenAIServer(problems, hang_after=3) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            server.base_url,
            num_concurrent=2,
            timeout_s=600,
            stall_timeout_s=3,
        )
        proc = gsm8k_cli(cfg, tmp_path / "data", tmp_path / "results", env=env, timeout=180)
    assert proc.returncode == EXIT_SYSTEM_FAILED, proc.stderr
    lines = proc.stderr.splitlines()
    progress = [x for x in lines if x.startswith("GSM8K answers") and ": 3/10 (" in x]
    assert len(progress) >= 3  # the 3 s stall alone spans six 0.5 s intervals
    assert lines[-1].startswith("nopebench: error: GSM8K stopped with 3 of 10 answers kept")
    assert "no answer completed for 3 s (stall_timeout_s)" in lines[-1]
    assert "resume with: nopebench gsm8k --config" in lines[-1]


def test_a_limit_run_is_reported_with_its_standard_error_and_not_judged(tmp_path):
    problems = write_dataset(tmp_path / "data", n_test=20)
    scripts = {problems[0].question: ["wrong"]}  # 9 of 10: below a threshold of 0.95
    with FakeOpenAIServer(problems, scripts) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url, threshold=0.95)
        code = run_gsm8k(tmp_path, cfg, limit=10)
    assert code == EXIT_OK
    record = read_json(only_run(tmp_path / "results") / "run.json")
    summary = record["summary"]
    assert record["status"] == "done"
    assert summary["passed"] is None and summary["judged"] is False
    assert (summary["n"], summary["of"], summary["strict_match"]) == (10, 20, 0.9)
    assert summary["strict_match_stderr"] == pytest.approx((0.9 * 0.1 / 9) ** 0.5, rel=1e-12)


def test_a_limit_run_says_why_it_is_not_judged(tmp_path, capsys):
    problems = write_dataset(tmp_path / "data", n_test=6)
    with FakeOpenAIServer(problems) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url)
        assert run_gsm8k(tmp_path, cfg, limit=3) == EXIT_OK
        assert run_gsm8k(tmp_path, cfg, limit=6) == EXIT_OK  # the whole set: judged
    out = capsys.readouterr().out
    assert "not judged: 3 of 6 problems, a sample (--limit)" in out
    statuses = sorted(read_json(r / "run.json")["status"] for r in run_dirs(tmp_path / "results"))
    assert statuses == ["done", "passed"]


def _failed_run(tmp_path, server):
    """A finished (failed) run directory, to rewrite as a run that says `running`."""
    cfg = write_config(tmp_path / "cfg.yaml", server.base_url, max_consecutive_failures=1)
    server.scripts = {p: ["http500"] for p in server.answers}
    with pytest.raises(SystemFailedError):
        run_gsm8k(tmp_path, cfg)
    server.scripts = {}
    return cfg, only_run(tmp_path / "results")


def _mark_running(run_dir, pid):
    from nopebench.records import write_json

    header = read_json(run_dir / "run.json")
    write_json(run_dir / "run.json", {**header, "status": "running", "pid": pid, "pid_start": None})


def test_resume_of_a_run_whose_process_is_gone_says_so(tmp_path, capsys):
    problems = write_dataset(tmp_path / "data", n_test=4)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    with FakeOpenAIServer(problems) as server:
        cfg, old = _failed_run(tmp_path, server)
        _mark_running(old, int(gone.stdout))
        assert run_gsm8k(tmp_path, cfg, resume=old) == EXIT_OK
    assert f"resuming {old} (its process is gone: died)" in capsys.readouterr().out


def test_resume_of_a_run_still_running_is_refused(tmp_path):
    problems = write_dataset(tmp_path / "data", n_test=4)
    with FakeOpenAIServer(problems) as server:
        cfg, old = _failed_run(tmp_path, server)
        _mark_running(old, os.getpid())  # this test process: alive on this host
        with pytest.raises(UsageError) as err:
            run_gsm8k(tmp_path, cfg, resume=old)
    assert f"--resume {old}: that run is still running (process {os.getpid()} on " in str(err.value)
    assert len(run_dirs(tmp_path / "results")) == 1  # nothing new written
