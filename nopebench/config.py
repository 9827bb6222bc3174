"""Typed, validated configs loaded from YAML.

One precedence rule for every config: field defaults < YAML file < command-line overrides.
Every failure becomes a one-line `UsageError` naming the file, the key, the bad value and what
is allowed; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nopebench import geometry
from nopebench.errors import UsageError
from nopebench.geometry import ScaleFormat

# The source checkout (for git and the developer tools); an installed package has none.
REPO_ROOT = Path(__file__).resolve().parent.parent
# The bundled configs ship inside the package, so a name such as `glm53-flash` resolves the
# same from a checkout, an editable install or a wheel installed anywhere.
CONFIG_ROOT = Path(str(resources.files("nopebench") / "configs"))
DEFAULT_MODEL = "glm53-flash"
NAME_MAX = 255  # bytes in one path component


class StrictModel(BaseModel):
    """Base for every config: unknown keys and type coercion are errors, instances frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelConfig(StrictModel):
    """Geometry of one sparse MLA model as the cache and decode kernels see it."""

    version: Literal[1] = 1
    name: str
    model_type: str
    num_heads: int = Field(gt=0)
    tensor_parallel: int = Field(default=1, gt=0)
    kv_lora_rank: Literal[512] = 512
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: Literal[0, 64]
    v_head_dim: int = Field(gt=0)
    index_topk: int = Field(gt=0, le=65536)
    index_kpool: int = Field(default=1, ge=1, le=1024)
    block_size: Literal[16, 32, 64] = 64
    softmax_scale: float = Field(gt=0, allow_inf_nan=False)
    kv_scale_format: ScaleFormat = "arbitrary_fp32"
    row_bytes: Literal[528, 656] = 656
    sparse_layers: int | None = Field(default=None, ge=0)
    num_layers: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.row_bytes == geometry.NOPE_ROW_BYTES and self.qk_rope_head_dim:
            raise ValueError(
                "row_bytes = 528 (compact NoPE row) needs qk_rope_head_dim = 0; "
                "rows with RoPE are 656 bytes"
            )
        if self.num_heads % self.tensor_parallel:
            raise ValueError(
                f"num_heads = {self.num_heads} is not divisible by "
                f"tensor_parallel = {self.tensor_parallel}"
            )
        if self.heads_per_gpu > 128:
            raise ValueError(
                f"num_heads = {self.num_heads} / tensor_parallel = {self.tensor_parallel} gives "
                f"{self.heads_per_gpu} heads per GPU; sparse MLA kernels take at most 128"
            )
        if (
            None not in (self.sparse_layers, self.num_layers)
            and self.sparse_layers > self.num_layers
        ):
            raise ValueError(
                f"sparse_layers = {self.sparse_layers} exceeds num_layers = {self.num_layers}"
            )
        return self

    @property
    def nope(self) -> bool:
        return self.qk_rope_head_dim == 0

    @property
    def heads_per_gpu(self) -> int:
        return self.num_heads // self.tensor_parallel

    @property
    def qk_dim(self) -> int:
        return geometry.qk_dim(self.qk_rope_head_dim)

    @property
    def topk_width(self) -> int:
        return geometry.topk_buffer_width(self.index_topk, self.index_kpool)

    @property
    def max_active(self) -> int:
        return geometry.max_active_topk(self.index_topk, self.index_kpool)


Cfg = TypeVar("Cfg", bound=BaseModel)


def check_path_length(path: str | Path, what: str = "") -> None:
    """A path that no file system takes (a component over 255 bytes) is one line, naming the
    option it came from (`what`), instead of an OSError from the first stat."""
    for part in Path(path).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            shown = str(path) if len(str(path)) <= 80 else str(path)[:77] + "..."
            raise UsageError(
                f"{what + ' ' if what else ''}{shown}: a path component is {size} bytes long; "
                f"file systems allow {NAME_MAX}"
            )


def resolve_config_path(value: str | Path, kind: str) -> Path:
    """A path as given, or a bundled config name such as `glm53-flash` (shipped in the
    package's configs/<kind>/)."""
    path = Path(value)
    check_path_length(path)
    if path.suffix in (".yaml", ".yml") or path.exists() or len(path.parts) > 1:
        return path
    return CONFIG_ROOT / kind / f"{value}.yaml"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: the
    plain loader keeps the last one silently, so a config could say two things at once."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first given at line {first.line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; every failure is one-line `UsageError`."""
    check_path_length(path)
    try:
        if not path.exists():
            raise UsageError(f"{path}: config file not found")
        if not path.is_file():
            raise UsageError(f"{path}: not a file")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        raise UsageError(f"{path}: file is empty")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def describe_validation_error(source: str, exc: ValidationError) -> str:
    """One line for the first pydantic error: file, key path, bad value, what is allowed."""
    err = exc.errors(include_url=False)[0]
    key = ".".join(str(part) for part in err["loc"]) or "(top level)"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"{source}: missing required key '{key}'"
    if err["type"] == "extra_forbidden":
        return f"{source}: unknown key '{key}'"
    if err["loc"]:
        return f"{source}: {key} = {err['input']!r}: {message}"
    return f"{source}: {message}"


def load_config(path: str | Path, cls: type[Cfg], overrides: dict[str, Any] | None = None) -> Cfg:
    """Load `cls` from YAML with command-line `overrides` applied on top (None values ignored)."""
    path = Path(path)
    data = read_yaml_mapping(path)
    merged = {**data, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        raise UsageError(describe_validation_error(str(path), exc)) from None


def load_model_config(value: str | Path) -> ModelConfig:
    """A model config from a path or a bundled name (nopebench/configs/models/<name>.yaml)."""
    return load_config(resolve_config_path(value, "models"), ModelConfig)
