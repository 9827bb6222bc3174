"""GSM8K data: local files are checked line by line, the task is lm-eval's own gsm8k pointed at
them, and a hub that cannot be reached is one line saying to pass --data."""

from __future__ import annotations

import json

import pytest
import yaml
from fake_openai_server import write_dataset
from gsm8k_helpers import isolate_hf_cache

from nopebench.errors import UsageError
from nopebench.gsm8k.config import DataConfig
from nopebench.gsm8k.data import (
    TASK_NAME,
    check_local_data,
    lm_eval_gsm8k_yaml,
    load_task,
    problem_count,
    write_task_dir,
)


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


def test_local_data_loads_through_lm_evals_own_task(tmp_path):
    write_dataset(tmp_path / "data", n_test=7, n_train=9)
    local = check_local_data(tmp_path / "data")
    assert local.counts == {"train": 9, "test": 7}
    task_dir = write_task_dir(tmp_path / "task", DataConfig(dir=str(local.dir)), local)
    spec = yaml.safe_load((task_dir / f"{TASK_NAME}.yaml").read_text())
    assert spec["include"] == str(lm_eval_gsm8k_yaml()) and spec["dataset_path"] == "json"
    _, task = load_task(task_dir, DataConfig(dir=str(local.dir)), local)
    assert problem_count(task) == 7
    # Everything that decides the score comes from lm-eval's gsm8k.yaml, unchanged.
    assert task.config.doc_to_text == "Question: {{question}}\nAnswer:"
    assert [f["name"] for f in task.config.filter_list] == ["strict-match", "flexible-extract"]
    assert task.config.generation_kwargs["until"][0] == "Question:"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not json\n", r"test\.jsonl line 1: not JSON"),
        (
            json.dumps({"question": "q"}) + "\n",
            r"test\.jsonl line 1: needs string fields 'question' and 'answer'",
        ),
        (
            json.dumps({"question": "q", "answer": "42"}) + "\n",
            r"test\.jsonl line 1: the answer does not end in '#### N'",
        ),
        ("\n", r"test\.jsonl holds no problems"),
    ],
)
def test_malformed_local_file_is_one_line(tmp_path, content, expected):
    write_dataset(tmp_path / "data", n_test=2)
    (tmp_path / "data" / "test.jsonl").write_text(content)
    with pytest.raises(UsageError, match=expected):
        check_local_data(tmp_path / "data")


def test_missing_local_files(tmp_path):
    with pytest.raises(UsageError, match="is not a directory"):
        check_local_data(tmp_path / "nowhere")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "test.jsonl").write_text("")
    with pytest.raises(UsageError, match="has no train.jsonl"):
        check_local_data(tmp_path / "d")


def test_unreachable_hub_without_cache_is_one_line(tmp_path, monkeypatch):
    """Offline mode stands in for a hub that cannot be reached: same error path, no network."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    data = DataConfig()
    task_dir = write_task_dir(tmp_path / "task", data, None)
    with pytest.raises(UsageError) as err:
        load_task(task_dir, data, None)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "GSM8K data: cannot load openai/gsm8k (main) from the model hub or its cache"
    )
    assert message.endswith("pass --data DIR with train.jsonl and test.jsonl to run offline")
