"""GSM8K configs: the bundled one reproduces the upstream set-up, bad YAML is one line naming
the key, and the command line overrides the file."""

from __future__ import annotations

import json
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
    cmd = cfg.launch_command()
    assert cmd[:3] == ["vllm", "serve", cfg.model]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert cmd[cmd.index("--max-model-len") + 1] == "65536"
    assert "--language-model-only" in cmd
    graphs = json.loads(cmd[cmd.index("--compilation-config") + 1])
    assert graphs == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert "--enforce-eager" not in cmd  # CUDA graphs on, as upstream measured
    assert cfg.attention_backend == "FLASHINFER_MLA_SPARSE_SM120"
    assert cmd[-2:] == ["--attention-backend", "FLASHINFER_MLA_SPARSE_SM120"]
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
    launch = {"command": ["vllm", "serve", "m"]}
    path = _write(
        tmp_path, data={"bundled": True}, server={"base_url": "http://h:8000", "launch": launch}
    )
    cfg = load_gsm8k_config(path, base_url="http://10.0.0.5:9000/", limit=7, data=tmp_path)
    assert (
        cfg.server.base_url == "http://10.0.0.5:9000" and cfg.server.launch is None
    )  # a running server
    assert cfg.limit == 7
    assert cfg.data.dir == str(tmp_path.resolve()) and cfg.data.hub_path == "openai/gsm8k"
    assert not cfg.data.bundled and cfg.data.local_dir() == str(tmp_path.resolve())


@pytest.mark.parametrize(
    "url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"]
)
def test_base_url_is_the_root_or_the_openai_base(tmp_path, url):
    in_yaml = load_gsm8k_config(_write(tmp_path, server={"base_url": url}))
    assert in_yaml.server.base_url == "http://h:8000"
    cfg = load_gsm8k_config(_write(tmp_path), base_url=url)
    assert cfg.server.base_url == "http://h:8000"
    assert cfg.endpoint() == "http://h:8000/v1/completions"


def test_base_url_keeps_the_configs_server_log(tmp_path):
    log = tmp_path / "vllm.log"
    path = _write(
        tmp_path,
        attention_backend="TRITON_MLA",
        server={"base_url": "http://h:8000", "log_file": str(log)},
    )
    cfg = load_gsm8k_config(path, base_url="http://other:9000/v1")
    assert (cfg.server.base_url, cfg.server.log_file) == ("http://other:9000", str(log))


def test_attention_backend_is_passed_once(tmp_path):
    launch = {"command": ["vllm", "serve", "m", "--attention-backend", "TRITON_MLA"]}
    path = _write(tmp_path, attention_backend="TRITON_MLA", server={"launch": launch})
    cfg = load_gsm8k_config(path)
    assert cfg.launch_command() == launch["command"]  # already there: not added again
    plain_launch = {"command": ["vllm", "serve", "m"]}
    plain = load_gsm8k_config(_write(tmp_path, server={"launch": plain_launch}))
    assert plain.launch_command() == ["vllm", "serve", "m"] and plain.attention_backend is None
    assert cfg.request_fingerprint()["attention_backend"] == "TRITON_MLA"


def test_bundled_data_is_the_published_gsm8k():
    from nopebench.gsm8k.config import BUNDLED_DATA
    from nopebench.gsm8k.data import check_local_data

    local = check_local_data(BUNDLED_DATA)
    assert local.counts == {"train": 7473, "test": 1319}
    assert "MIT License" in (BUNDLED_DATA / "LICENSE").read_text()


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
        (
            {"server": {"base_url": "http://h:8000/v1/completions"}},
            r"or its OpenAI base \(http://host:port/v1\), no other path",
        ),
        ({"server": {"base_url": "http://h:8000/api"}}, r"no other path"),
        (
            {"attention_backend": "flashinfer"},
            r"attention_backend = 'flashinfer': String should match pattern",
        ),
        ({"attention_backend": "TRITON_MLA"}, r"set server\.log_file to that server's log"),
        (
            {
                "attention_backend": "TRITON_MLA",
                "server": {
                    "launch": {"command": ["vllm", "serve", "m", "--attention-backend", "FLASHMLA"]}
                },
            },
            r"launch\.command says --attention-backend FLASHMLA "
            r"but attention_backend is TRITON_MLA",
        ),
        (
            {"server": {"log_file": "x.log", "launch": {"command": ["vllm"]}}},
            r"log_file is for a server the harness does not launch",
        ),
        (
            {"data": {"bundled": True, "dir": "x"}},
            r"give data\.dir or data\.bundled: true, not both",
        ),
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
