"""GSM8K configs: the bundled one reproduces the upstream set-up, bad YAML is one line naming
the key, and the command line overrides the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nopebench.config import CONFIG_ROOT
from nopebench.errors import UsageError
from nopebench.gsm8k.config import load_gsm8k_config
from nopebench.gsm8k.evaluate import model_args


def _write(tmp_path: Path, **fields) -> Path:
    cfg = {"version": 1, "name": "t", "model": "m", "threshold": 0.5, **fields}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_bundled_config_is_the_upstream_setup():
    cfg = load_gsm8k_config("glm53-flash-nvfp4-tp4")
    assert (cfg.api, cfg.num_fewshot, cfg.num_concurrent, cfg.max_gen_toks) == (
        "completions",
        5,
        32,
        2048,
    )
    assert cfg.limit is None and cfg.data.dir is None and cfg.data.hub_path == "openai/gsm8k"
    cmd = cfg.server.launch.command
    assert cmd[:3] == ["vllm", "serve", cfg.model]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert cmd[cmd.index("--max-model-len") + 1] == "65536"
    assert "--enforce-eager" not in cmd  # CUDA graphs on, as upstream measured
    assert {r.strict_match for r in cfg.reference} >= {0.9325, 0.973}
    assert [0.91, 0.93] in [r.range for r in cfg.reference] and [0.969, 0.972] in [
        r.range for r in cfg.reference
    ]
    assert cfg.endpoint() == "http://127.0.0.1:8000/v1/completions"


@pytest.mark.parametrize(
    "path", sorted((CONFIG_ROOT / "gsm8k").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_bundled_config_loads(path):
    cfg = load_gsm8k_config(path)
    assert cfg.name == path.stem


def test_model_args_need_no_tokenizer_and_set_the_token_budget():
    args = model_args(load_gsm8k_config("glm53-flash-nvfp4-tp4"))
    assert args["tokenizer_backend"] is None and args["tokenized_requests"] is False
    assert args["max_gen_toks"] == 2048 and args["num_concurrent"] == 32


def test_command_line_overrides(tmp_path):
    cfg = load_gsm8k_config(
        "glm53-flash-nvfp4-tp4", base_url="http://10.0.0.5:9000/", limit=7, data=tmp_path
    )
    assert (
        cfg.server.base_url == "http://10.0.0.5:9000" and cfg.server.launch is None
    )  # a running server
    assert cfg.limit == 7
    assert cfg.data.dir == str(tmp_path.resolve()) and cfg.data.hub_path == "openai/gsm8k"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"api": "responses"},
            r"c\.yaml: api = 'responses': Input should be 'completions' or 'chat'",
        ),
        ({"num_concurrent": 0}, r"num_concurrent = 0: Input should be greater than or equal to 1"),
        ({"threshold": 1.5}, r"threshold = 1\.5"),
        ({"timeout": 5}, r"unknown key 'timeout'"),
        ({"version": 2}, r"version = 2"),
        ({"server": {"base_url": "127.0.0.1:8000"}}, r"is not an http\(s\)://host:port URL"),
        ({"server": {"base_url": "http://h:8000/v1"}}, r"without a path such as /v1"),
        (
            {
                "server": {
                    "base_url": "http://h:8000",
                    "launch": {"command": ["vllm", "serve", "m", "--port", "9000"]},
                }
            },
            r"--port 9000 but base_url 'http://h:8000' has port 8000",
        ),
        ({"server": {"launch": {"command": []}}}, r"server\.launch\.command"),
        ({"reference": [{"label": "x"}]}, r"give exactly one of strict_match or range"),
        ({"reference": [{"label": "x", "range": [0.9, 0.8]}]}, r"range must be \[low, high\]"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path, fields, expected):
    with pytest.raises(UsageError, match=expected) as err:
        load_gsm8k_config(_write(tmp_path, **fields))
    assert "\n" not in str(err.value)


def test_missing_required_and_missing_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "t", "model": "m"}))
    with pytest.raises(UsageError, match="missing required key 'threshold'"):
        load_gsm8k_config(path)
    with pytest.raises(UsageError, match="config file not found"):
        load_gsm8k_config("no-such-gsm8k-config")
