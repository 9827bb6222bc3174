"""The GSM8K run config: a typed model of a GSM8K YAML (bundled ones in nopebench/configs/gsm8k/).

Every field that changes what the server is asked (model, API, shots, token budget, seed, data)
lives here, so a run is reproduced from its YAML alone and a resumed run can be checked against
the one it continues. Loaded with the project's one precedence rule: defaults < YAML < command
line (`--base-url`, `--limit`, `--data`).

`attention_backend` names the vLLM attention backend the run must exercise: a launched server
is started with `--attention-backend NAME`, and the server's log must show vLLM selecting it
before a question is sent (see `backend`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from nopebench.config import StrictModel, load_config, resolve_config_path

Api = Literal["completions", "chat"]

# lm-eval model names and server paths per API; the config says `completions` or `chat`.
LM_EVAL_MODEL: dict[str, str] = {
    "completions": "local-completions",
    "chat": "local-chat-completions",
}
API_PATH: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
OPENAI_BASE = "/v1"  # the OpenAI-style base users also type; the server root is what we keep
# GSM8K as published (openai/grade-school-math, MIT licence), shipped in the package: see its
# README.md. The same files the model hub's openai/gsm8k (main) was built from.
BUNDLED_DATA = Path(__file__).resolve().parent / "dataset"
BACKEND_FLAG = "--attention-backend"


class DataConfig(StrictModel):
    """Where the problems come from: the model hub's dataset, or a local directory.

    `dir` holds `train.jsonl` (few-shot examples) and `test.jsonl` (the problems), GSM8K's own
    format. A relative `dir` is taken from the working directory; `--data DIR` overrides it.
    """

    hub_path: str = "openai/gsm8k"
    hub_name: str = "main"
    dir: str | None = None
    bundled: bool = Field(default=False, description="the copy of GSM8K shipped in the package")

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if self.bundled and self.dir is not None:
            raise ValueError("give data.dir or data.bundled: true, not both")
        return self

    def local_dir(self) -> str | None:
        """The directory to read, or None for the model hub."""
        return str(BUNDLED_DATA) if self.bundled else self.dir


class LaunchConfig(StrictModel):
    """A server the harness starts itself, waits for and always stops."""

    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=3600.0, gt=0)
    stop_timeout_s: float = Field(default=60.0, gt=0)


def server_root(url: str) -> str:
    """`url` without a trailing slash or the OpenAI-style `/v1`: http://host:port/v1 and
    http://host:port/ both mean the server at http://host:port. Other paths are left for the
    check to refuse."""
    url = url.rstrip("/")
    return url[: -len(OPENAI_BASE)] if urlsplit(url).path == OPENAI_BASE else url


class ServerConfig(StrictModel):
    """`base_url` is the server root (http://host:port) or its OpenAI base (http://host:port/v1),
    kept as the root; with `launch` the harness starts the server there.

    `log_file` (attach mode only) is the given server's log, read for the attention backend
    it selected; a launched server's log is the one in the run directory."""

    base_url: str = "http://127.0.0.1:8000"
    launch: LaunchConfig | None = None
    log_file: str | None = None

    @field_validator("base_url")
    @classmethod
    def _root(cls, value: str) -> str:
        return server_root(value)

    @model_validator(mode="after")
    def _consistent(self) -> ServerConfig:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url {self.base_url!r} is not an http(s)://host:port URL")
        if parts.path:
            raise ValueError(
                f"base_url {self.base_url!r}: give the server root (http://host:port) "
                f"or its OpenAI base (http://host:port/v1), no other path"
            )
        if self.launch is not None and self.log_file is not None:
            raise ValueError(
                "log_file is for a server the harness does not launch; "
                "a launched server's log is the run directory's server.log"
            )
        if self.launch is not None and "--port" in self.launch.command:
            i = self.launch.command.index("--port")
            port = self.launch.command[i + 1] if i + 1 < len(self.launch.command) else None
            if port != str(parts.port):
                raise ValueError(
                    f"launch.command says --port {port} but base_url {self.base_url!r} "
                    f"has port {parts.port}"
                )
        return self


class ReferenceScore(StrictModel):
    """A published strict-match figure to print beside the result: one value or a range."""

    label: str
    strict_match: float | None = Field(default=None, ge=0, le=1)
    range: list[float] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ReferenceScore:
        if (self.strict_match is None) == (self.range is None):
            raise ValueError(f"reference {self.label!r}: give exactly one of strict_match or range")
        if self.range is not None and (
            len(self.range) != 2 or not 0 <= self.range[0] <= self.range[1] <= 1
        ):
            raise ValueError(
                f"reference {self.label!r}: range must be [low, high] with 0 <= low <= high <= 1"
            )
        return self

    def text(self) -> str:
        if self.strict_match is not None:
            return f"{self.strict_match:.4f}"
        low, high = self.range
        return f"{low:.3f}-{high:.3f}"


class Gsm8kConfig(StrictModel):
    version: Literal[1] = 1
    name: str
    model: str = Field(min_length=1, description="the model name the server serves")
    api: Api = "completions"
    num_fewshot: int = Field(default=5, ge=0)
    num_concurrent: int = Field(default=32, ge=1)
    max_gen_toks: int = Field(default=2048, ge=1)
    timeout_s: int = Field(
        default=600, ge=1, description="per request, lm-eval takes whole seconds"
    )
    max_retries: int = Field(
        default=3, ge=1, description="attempts per request, the first included"
    )
    stall_timeout_s: float = Field(
        default=900.0, gt=0, description="stop when no answer completes for this long"
    )
    max_consecutive_failures: int = Field(
        default=32, ge=1, description="stop after this many failed attempts in a row"
    )
    seed: int = 1234
    limit: int | None = Field(default=None, ge=1)
    data: DataConfig = Field(default_factory=DataConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    threshold: float = Field(ge=0, le=1, description="minimum strict-match to pass")
    reference: list[ReferenceScore] = Field(default_factory=list)
    attention_backend: str | None = Field(
        default=None,
        pattern=r"^[A-Z][A-Z0-9_]*$",
        description="the vLLM attention backend the server must select, "
        "e.g. FLASHINFER_MLA_SPARSE_SM120",
    )

    @model_validator(mode="after")
    def _backend_consistent(self) -> Gsm8kConfig:
        launch = self.server.launch
        unseen = launch is None and self.server.log_file is None
        if self.attention_backend is not None and unseen:
            raise ValueError(
                f"attention_backend {self.attention_backend} is checked in the "
                "server's log: for a server the harness does not launch "
                "(--base-url, or no server.launch), set server.log_file to that "
                "server's log"
            )
        if self.attention_backend is None or launch is None or BACKEND_FLAG not in launch.command:
            return self
        i = launch.command.index(BACKEND_FLAG)
        given = launch.command[i + 1] if i + 1 < len(launch.command) else None
        if given != self.attention_backend:
            raise ValueError(
                f"launch.command says {BACKEND_FLAG} {given} but attention_backend is "
                f"{self.attention_backend}; give it once, as attention_backend"
            )
        return self

    def launch_command(self) -> list[str]:
        """The command that starts the server: `launch.command`, plus `--attention-backend NAME`
        when the config names a backend and the command does not already pass it."""
        command = list(self.server.launch.command)
        if self.attention_backend is not None and BACKEND_FLAG not in command:
            command += [BACKEND_FLAG, self.attention_backend]
        return command

    @property
    def lm_eval_model(self) -> str:
        return LM_EVAL_MODEL[self.api]

    def endpoint(self) -> str:
        return self.server.base_url.rstrip("/") + API_PATH[self.api]

    def request_fingerprint(self) -> dict[str, Any]:
        """What a cached answer depends on beyond its cache key, which hashes only the prompt
        and generation kwargs: above all the model and the request seed. A resumed run must
        match these. (The data need not: other problems make other prompts, other keys.)"""
        return {
            "model": self.model,
            "api": self.api,
            "num_fewshot": self.num_fewshot,
            "max_gen_toks": self.max_gen_toks,
            "seed": self.seed,
            "attention_backend": self.attention_backend,
        }


def load_gsm8k_config(
    value: str | Path,
    base_url: str | None = None,
    limit: int | None = None,
    data: Path | None = None,
) -> Gsm8kConfig:
    """Config from a path or a bundled name, with the command line's overrides on top.

    `--base-url` means "use this running server": it replaces `server` (keeping only its
    `log_file`), so a config's `launch` is not run. `--data` replaces `data.dir` (and
    `data.bundled`), stored as an absolute path so the run record says exactly which files were
    read.
    """
    path = resolve_config_path(value, "gsm8k")
    overrides: dict[str, Any] = {"limit": limit}
    if base_url is not None or data is not None:
        from nopebench.config import read_yaml_mapping

        raw = read_yaml_mapping(path)
        if base_url is not None:
            server = raw.get("server") if isinstance(raw.get("server"), dict) else {}
            kept = {"log_file": server["log_file"]} if "log_file" in server else {}
            overrides["server"] = {"base_url": base_url, **kept}
        if data is not None:
            base = raw.get("data") if isinstance(raw.get("data"), dict) else {}
            base = {k: v for k, v in base.items() if k != "bundled"}
            overrides["data"] = {**base, "dir": str(Path(data).resolve())}
    cfg = load_config(path, Gsm8kConfig, overrides)
    if cfg.data.dir is not None and not Path(cfg.data.dir).is_absolute():
        cfg = cfg.model_copy(
            update={"data": cfg.data.model_copy(update={"dir": str(Path(cfg.data.dir).resolve())})}
        )
    log_file = cfg.server.log_file
    if log_file is not None and not Path(log_file).is_absolute():
        server = cfg.server.model_copy(update={"log_file": str(Path(log_file).resolve())})
        cfg = cfg.model_copy(update={"server": server})
    return cfg
