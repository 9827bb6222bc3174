"""Model configs: the shipped ones load with the right derived values; every bad one is one
line on stderr naming the file (and the key and value where there is one), exit code 2, no
table, no traceback and no run directory, through the real command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nopebench.cli import app
from nopebench.config import CONFIG_ROOT, REPO_ROOT, ModelConfig, load_config, load_model_config
from nopebench.errors import UsageError

GLM53 = (CONFIG_ROOT / "models" / "glm53-flash.yaml").read_text(encoding="utf-8")


def edited(pattern: str, replacement: str) -> str:
    """The shipped GLM-5.3-Flash config with one line changed (the pattern must match once)."""
    text, n = re.subn(pattern, replacement, GLM53, flags=re.MULTILINE)
    assert n == 1, pattern
    return text


# name -> (file contents or a special marker, substrings the one error line must contain)
BAD_CONFIGS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "missing file": (None, ("not found",)),
    "a directory": ("<dir>", ("not a file",)),
    "bad YAML syntax": ("name: x\n  bad: [\n", ("invalid YAML", "line 2")),
    "unclosed bracket": ("name: [glm\n", ("invalid YAML",)),
    "tab indentation": ("name: x\n\tnum_heads: 64\n", ("invalid YAML",)),
    "empty file": ("", ("empty",)),
    "comments only": ("# nothing here\n", ("empty",)),
    "list at top level": ("- name: x\n- num_heads: 64\n", ("mapping", "list")),
    "scalar at top level": ("glm53-flash\n", ("mapping", "str")),
    "not UTF-8": ("<latin1>", ("cannot read",)),
    "unknown key": (
        edited(r"^name: .*$", "name: glm53-flash\nnum_head: 64"),
        ("unknown key", "num_head"),
    ),
    "missing key": (edited(r"^num_heads: .*$", ""), ("missing", "num_heads")),
    "string for int": (
        edited(r"^num_heads: .*$", 'num_heads: "64"'),
        ("num_heads", "'64'", "integer"),
    ),
    "float for int": (edited(r"^num_heads: .*$", "num_heads: 64.0"), ("num_heads", "64.0")),
    "bool for int": (edited(r"^num_heads: .*$", "num_heads: true"), ("num_heads", "True")),
    "kv_lora_rank 256": (
        edited(r"^kv_lora_rank: .*$", "kv_lora_rank: 256"),
        ("kv_lora_rank", "256", "512"),
    ),
    "rope 32": (
        edited(r"^qk_rope_head_dim: .*$", "qk_rope_head_dim: 32"),
        ("qk_rope_head_dim", "32", "0 or 64"),
    ),
    "528-byte rows with rope 64": (
        edited(r"^qk_rope_head_dim: .*$", "qk_rope_head_dim: 64").replace(
            "row_bytes: 656", "row_bytes: 528"
        ),
        ("row_bytes", "528", "qk_rope_head_dim"),
    ),
    "row_bytes 600": (
        edited(r"^row_bytes: .*$", "row_bytes: 600"),
        ("row_bytes", "600", "528", "656"),
    ),
    "heads not divisible by TP": (
        edited(r"^tensor_parallel: .*$", "tensor_parallel: 3"),
        ("num_heads", "64", "tensor_parallel", "3"),
    ),
    "heads per GPU > 128": (
        edited(r"^num_heads: .*$", "num_heads: 1024"),
        ("num_heads", "1024", "tensor_parallel", "256", "128"),
    ),
    "negative index_topk": (
        edited(r"^index_topk: .*$", "index_topk: -2048"),
        ("index_topk", "-2048", "greater than 0"),
    ),
    "zero kpool": (edited(r"^index_kpool: .*$", "index_kpool: 0"), ("index_kpool", "0")),
    "block size 48": (edited(r"^block_size: .*$", "block_size: 48"), ("block_size", "48")),
    "bad kv_scale_format": (
        edited(r"^kv_scale_format: .*$", "kv_scale_format: e4m3"),
        ("kv_scale_format", "'e4m3'", "arbitrary_fp32", "pow2_fp32"),
    ),
    "infinite softmax scale": (
        edited(r"^softmax_scale: .*$", "softmax_scale: .inf"),
        ("softmax_scale", "inf"),
    ),
    "negative softmax scale": (
        edited(r"^softmax_scale: .*$", "softmax_scale: -0.0625"),
        ("softmax_scale", "-0.0625"),
    ),
    "sparse layers > layers": (
        edited(r"^sparse_layers: .*$", "sparse_layers: 46"),
        ("sparse_layers", "46", "45"),
    ),
    "version 2": (edited(r"^version: .*$", "version: 2"), ("version", "2")),
    "rich markup in a key": (
        edited(r"^name: .*$", 'name: glm53-flash\n"[/bold]": 1'),
        ("unknown key", "[/bold]"),
    ),
}


def make_bad(tmp_path: Path, name: str) -> Path:
    content, _ = BAD_CONFIGS[name]
    path = tmp_path / "cfg" / f"{re.sub(r'[^a-z0-9]+', '-', name.lower())}.yaml"
    path.parent.mkdir(exist_ok=True)
    if content == "<dir>":
        path.mkdir()
    elif content == "<latin1>":
        path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    return path


def test_at_least_a_dozen_bad_configs():
    assert len(BAD_CONFIGS) >= 12


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_bad_config_is_one_line_and_exit_2(tmp_path, name):
    path = make_bad(tmp_path, name)
    results = tmp_path / "results"
    result = CliRunner().invoke(
        app, ["verify-layout", "--model", str(path), "--results-dir", str(results)]
    )
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""  # no table, no partial output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("nopebench: error: ") and str(path) in line
    for part in BAD_CONFIGS[name][1]:
        assert part in line, (part, line)
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not results.exists()


@pytest.mark.parametrize("name", ["bad YAML syntax", "kv_lora_rank 256"])
def test_bad_config_through_a_real_process(tmp_path, name):
    """`python -m nopebench` exactly as a user runs it: real stderr, real exit status."""
    path = make_bad(tmp_path, name)
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nopebench",
            "verify-layout",
            "--model",
            str(path),
            "--results-dir",
            str(results),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and str(path) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not results.exists()


def test_unknown_bundled_name(tmp_path):
    result = CliRunner().invoke(
        app, ["verify-layout", "--model", "no-such-model", "--results-dir", str(tmp_path / "r")]
    )
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    assert "no-such-model.yaml" in result.stderr and "not found" in result.stderr


def test_markup_in_a_missing_path_is_printed_not_parsed(tmp_path):
    """A path with rich markup in it ('[/x]') used to crash the error printer with a traceback."""
    path = tmp_path / "[/x]" / "[bold]model.yaml"
    result = CliRunner().invoke(
        app, ["verify-layout", "--model", str(path), "--results-dir", str(tmp_path / "r")]
    )
    assert result.exit_code == 2, result.stderr
    assert result.stderr.strip() == f"nopebench: error: {path}: config file not found"


# ---------------------------------------------------------------- the shipped configs


def test_glm53_flash_derived_values():
    cfg = load_model_config("glm53-flash")
    assert cfg.name == "glm53-flash" and cfg.model_type == "glm5_next"
    assert cfg.nope and cfg.qk_rope_head_dim == 0 and cfg.qk_dim == 512
    assert cfg.topk_width == 2176 and cfg.max_active == 2051
    assert cfg.heads_per_gpu == 16 and cfg.num_heads == 64 and cfg.tensor_parallel == 4
    assert (cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim) == (512, 256, 256)
    assert (cfg.block_size, cfg.row_bytes, cfg.kv_scale_format) == (64, 656, "arbitrary_fp32")
    assert cfg.softmax_scale == 1 / 16
    assert (cfg.sparse_layers, cfg.num_layers) == (11, 45)


def test_glm5_derived_values():
    cfg = load_model_config("glm5")
    assert not cfg.nope and cfg.qk_rope_head_dim == 64 and cfg.qk_dim == 576
    assert cfg.topk_width == 2048 and cfg.max_active == 2048 and cfg.heads_per_gpu == 16
    assert (cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_scale_format) == (
        192,
        256,
        "arbitrary_fp32",
    )
    assert cfg.softmax_scale == pytest.approx(256**-0.5)


def test_dsv32_derived_values():
    cfg = load_model_config("dsv32")
    assert not cfg.nope and cfg.qk_dim == 576
    assert cfg.topk_width == 2048 and cfg.heads_per_gpu == 128 and cfg.index_kpool == 1
    assert (cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_scale_format) == (128, 128, "pow2_fp32")
    assert cfg.softmax_scale == pytest.approx(192**-0.5)


def test_name_path_and_yml_forms_agree(tmp_path):
    by_name = load_model_config("glm53-flash")
    assert load_model_config(CONFIG_ROOT / "models" / "glm53-flash.yaml") == by_name
    yml = tmp_path / "m.yml"
    yml.write_text(GLM53, encoding="utf-8")
    assert load_model_config(str(yml)) == by_name


def test_overrides_beat_the_file_and_none_is_ignored():
    path = CONFIG_ROOT / "models" / "glm53-flash.yaml"
    cfg = load_config(path, ModelConfig, {"tensor_parallel": 8, "block_size": None})
    assert cfg.heads_per_gpu == 8 and cfg.block_size == 64
    with pytest.raises(UsageError, match="tensor_parallel = 3"):
        load_config(path, ModelConfig, {"tensor_parallel": 3})


def test_defaults_fill_optional_keys(tmp_path):
    path = tmp_path / "minimal.yaml"
    path.write_text(
        "name: m\nmodel_type: x\nnum_heads: 16\nqk_nope_head_dim: 128\nqk_rope_head_dim: 0\n"
        "v_head_dim: 128\nindex_topk: 512\nsoftmax_scale: 0.1\n",
        encoding="utf-8",
    )
    cfg = load_model_config(path)
    assert (cfg.version, cfg.tensor_parallel, cfg.kv_lora_rank, cfg.index_kpool) == (1, 1, 512, 1)
    assert (cfg.block_size, cfg.kv_scale_format, cfg.row_bytes) == (64, "arbitrary_fp32", 656)
    assert cfg.topk_width == 512


def test_configs_are_frozen():
    cfg = load_model_config("glm53-flash")
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        cfg.num_heads = 8  # type: ignore[misc]
