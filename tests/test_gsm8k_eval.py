"""GSM8K end to end through the real lm-eval and real HTTP: a loopback server with scripted
answers, exact metric values, retries, the records written, and the threshold verdict."""

from __future__ import annotations

import json
import math

import pytest
from fake_openai_server import FakeOpenAIServer, write_dataset
from gsm8k_helpers import cache_rows, isolate_hf_cache, only_run, read_json, write_config

from nopebench.commands import gsm8k
from nopebench.commands.options import Gsm8kOptions
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK

# Ten problems, one script each: 8 strict-match right, 9 flexible-extract right, 1 invalid.
SCRIPTS = {
    4: ["wrong"],
    5: ["no_marker"],
    6: ["http500", "correct"],
    7: ["drop", "correct"],
    8: ["hang", "correct"],
}


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


def _stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / (n - 1))  # lm-eval's mean_stderr (sample standard deviation)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_scripted_answers_give_exact_metrics(tmp_path, api):
    problems = write_dataset(tmp_path / "data", n_test=10)
    scripts = {problems[i].question: s for i, s in SCRIPTS.items()}
    with FakeOpenAIServer(problems, scripts) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url, api=api, threshold=0.8)
        code = gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
        )
        received, answered = server.snapshot()
        payloads = list(server.payloads)

    assert code == EXIT_OK  # 0.8 >= threshold 0.8: the threshold is inclusive
    run = only_run(tmp_path / "results")
    summary = read_json(run / "run.json")["summary"]
    assert read_json(run / "run.json")["status"] == "passed"
    assert summary["strict_match"] == 8 / 10
    assert summary["flexible_extract"] == 9 / 10
    assert summary["strict_match_stderr"] == pytest.approx(_stderr(0.8, 10), rel=1e-12)
    assert summary["flexible_extract_stderr"] == pytest.approx(_stderr(0.9, 10), rel=1e-12)
    assert (summary["n"], summary["invalid_answers"], summary["invalid_rate"]) == (10, 1, 0.1)
    assert (summary["asked"], summary["from_cache"]) == (10, 0)

    # Every failure mode was retried exactly once and then answered; nothing else was re-asked.
    retried = {problems[i].question for i in (6, 7, 8)}
    assert all(received[p.question] == (2 if p.question in retried else 1) for p in problems)
    assert all(answered[p.question] == 1 for p in problems)
    assert summary["retries"] == 3

    # What lm-eval sent: the config's model, greedy, 2048 tokens, 5 shots, lm-eval's stop strings.
    for payload in payloads:
        assert payload["model"] == "fake-model"
        assert payload["max_tokens"] == 2048
        assert payload["temperature"] == 0
        assert payload["seed"] == 1234
        assert "Question:" in payload["stop"]
    if api == "chat":
        assert all(
            len(p["messages"]) == 11 for p in payloads
        )  # 5 shots as turns, then the question
    else:
        assert all(p["prompt"].count("Question: ") == 6 for p in payloads)

    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == list(range(10))
    assert [r["strict_match_correct"] for r in rows] == [1, 1, 1, 1, 0, 0, 1, 1, 1, 1]
    assert [r["flexible_extract_correct"] for r in rows] == [1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
    assert rows[5]["strict_match_answer"] == "[invalid]"
    assert rows[4]["strict_match_answer"] == problems[4].answer + "1"
    results = read_json(run / "results.json")
    assert results["lm_eval"]["results"]["nopebench_gsm8k"]["exact_match,strict-match"] == 0.8
    assert (run / "requests_rank0.db").is_file()
    assert "Retry attempt" in (run / "lm_eval.log").read_text()


def test_below_threshold_exits_1(tmp_path):
    problems = write_dataset(tmp_path / "data", n_test=4)
    scripts = {problems[0].question: ["wrong"]}
    with FakeOpenAIServer(problems, scripts) as server:
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url, threshold=0.76)
        code = gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
        )
    assert code == EXIT_CHECK_FAILED
    run = only_run(tmp_path / "results")
    assert read_json(run / "run.json")["status"] == "failed"
    assert read_json(run / "run.json")["summary"]["strict_match"] == 0.75


def test_limit_and_base_url_override_one_request_at_a_time(tmp_path):
    """Also lm-eval's sequential path (num_concurrent 1), which caches per request too."""
    problems = write_dataset(tmp_path / "data", n_test=12)
    with FakeOpenAIServer(problems) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            "http://127.0.0.1:9",
            threshold=1.0,  # URL overridden below
            num_concurrent=1,
        )
        code = gsm8k.execute(
            Gsm8kOptions(
                str(cfg), server.base_url, 5, tmp_path / "data", None, tmp_path / "results"
            )
        )
        received, _ = server.snapshot()
    assert code == EXIT_OK
    assert sum(received.values()) == 5
    assert set(received) == {p.question for p in problems[:5]}
    run = only_run(tmp_path / "results")
    assert read_json(run / "run.json")["summary"]["n"] == 5
    assert cache_rows(run / "requests_rank0.db") == 5
