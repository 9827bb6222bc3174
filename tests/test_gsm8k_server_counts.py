"""The server's own count of what it answered: vLLM's `vllm:request_success_total`, read from
/metrics before the first question and after the last, recorded in run.json beside the
harness's own count. A server without the counter records nothing rather than a made-up 0."""

from __future__ import annotations

import pytest
from fake_openai_server import FakeOpenAIServer, write_dataset
from gsm8k_helpers import isolate_hf_cache, only_run, read_json, write_config

from nopebench.commands import gsm8k
from nopebench.commands.options import Gsm8kOptions
from nopebench.errors import EXIT_OK
from nopebench.gsm8k.server import answered_between, parse_request_counts

# Trimmed from a real vLLM 0.32 /metrics page (CPU build), with a second model's series added.
PAGE = """\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 5.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 1.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="tiny"} 0.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="tiny"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="other"} 40.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="tiny"} 1.796e+09
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


def test_counts_are_summed_over_engines_per_reason_for_the_model():
    assert parse_request_counts(PAGE, "tiny") == {"stop": 2, "length": 8, "abort": 1, "error": 0}
    assert parse_request_counts(PAGE)["length"] == 48  # every model when none is named
    assert parse_request_counts("vllm:num_requests_running 0.0\n") is None


def test_answered_leaves_out_aborted_and_failed_requests():
    before = {"stop": 2, "length": 8, "abort": 1, "error": 0}
    after = {"stop": 3, "length": 12, "abort": 3, "error": 1}
    counted = answered_between(before, after)
    assert counted["answered"] == 5 and counted["not_answered"] == {"abort": 2, "error": 1}
    assert answered_between(None, after) is None


@pytest.mark.parametrize("metrics", [True, False], ids=["with-metrics", "without"])
def test_run_records_the_servers_count(tmp_path, metrics):
    problems = write_dataset(tmp_path / "data", n_test=4)
    with FakeOpenAIServer(problems, metrics=metrics) as server:
        server.answered["warm-up"] = 2  # answers before the run must not be counted as the run's
        cfg = write_config(tmp_path / "cfg.yaml", server.base_url)
        code = gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
        )
    assert code == EXIT_OK
    counted = read_json(only_run(tmp_path / "results") / "run.json")["summary"]["server_requests"]
    if metrics:
        assert counted["answered"] == 4 and counted["metric"] == "vllm:request_success_total"
    else:
        assert counted is None
