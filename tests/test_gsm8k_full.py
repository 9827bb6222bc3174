"""The issue's acceptance check: a loopback server that answers a known fraction of the
1319-problem test set correctly gets exactly that strict-match back, at concurrency 32.

Uses the real GSM8K files (../shared/data/gsm8k, see CONTEXT.md section 6) when this checkout
has them, otherwise 1319 generated problems of the same format."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, read_dataset, write_dataset
from gsm8k_helpers import isolate_hf_cache, only_run, read_json, write_config

from nopebench.commands import gsm8k
from nopebench.commands.options import Gsm8kOptions
from nopebench.config import REPO_ROOT
from nopebench.errors import EXIT_OK

REAL_DATA = REPO_ROOT.parent / "shared" / "data" / "gsm8k"
N_TEST = 1319


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


def _data(tmp_path: Path) -> Path:
    if (REAL_DATA / "test.jsonl").is_file() and (REAL_DATA / "train.jsonl").is_file():
        return REAL_DATA
    write_dataset(tmp_path / "data", n_test=N_TEST, n_train=200)
    return tmp_path / "data"


@pytest.mark.slow
def test_known_fraction_of_1319_gives_exactly_that_strict_match(tmp_path):
    data = _data(tmp_path)
    problems = read_dataset(data)
    assert len(problems) == N_TEST
    # Every 7th problem wrong ('#### N' with a digit appended), every 11th of the rest without
    # '#### ' (strict-match invalid, flexible-extract right): both fractions known in advance.
    scripts = {}
    for i, p in enumerate(problems):
        if i % 7 == 0:
            scripts[p.question] = ["wrong"]
        elif i % 11 == 0:
            scripts[p.question] = ["no_marker"]
    wrong = sum(i % 7 == 0 for i in range(N_TEST))
    unmarked = sum(i % 7 != 0 and i % 11 == 0 for i in range(N_TEST))
    with FakeOpenAIServer(problems, scripts, model="nvidia/GLM-5.3-Flash-NVFP4") as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            server.base_url,
            model="nvidia/GLM-5.3-Flash-NVFP4",
            num_concurrent=32,
            timeout_s=600,
            threshold=0.75,
        )
        code = gsm8k.execute(Gsm8kOptions(str(cfg), None, None, data, None, tmp_path / "results"))
        received, answered = server.snapshot()

    summary = read_json(only_run(tmp_path / "results") / "run.json")["summary"]
    assert code == EXIT_OK
    assert summary["n"] == N_TEST
    assert summary["strict_match"] == (N_TEST - wrong - unmarked) / N_TEST
    assert summary["flexible_extract"] == (N_TEST - wrong) / N_TEST
    assert summary["invalid_answers"] == unmarked
    assert sum(received.values()) == N_TEST and set(answered.values()) == {1}
