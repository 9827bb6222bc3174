"""Shared pieces of the GSM8K tests: configs written for a loopback server, run lookup, polling.

Kept out of conftest.py (which the whole suite shares) because only the GSM8K tests use them.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import yaml

from nopebench.config import REPO_ROOT

FAKE_SERVER = Path(__file__).resolve().parent / "fake_openai_server.py"


def write_config(path: Path, base_url: str, **fields: Any) -> Path:
    """A GSM8K config for a loopback server: small concurrency and a short timeout."""
    cfg: dict[str, Any] = {
        "version": 1,
        "name": "loopback",
        "model": "fake-model",
        "num_concurrent": 8,
        "timeout_s": 2,
        "max_retries": 3,
        "threshold": 0.5,
        "server": {"base_url": base_url},
    }
    cfg.update(fields)
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dirs(results: Path) -> list[Path]:
    base = results / "gsm8k"
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def only_run(results: Path) -> Path:
    runs = run_dirs(results)
    assert len(runs) == 1, runs
    return runs[0]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def cache_rows(db: Path) -> int:
    """Rows in lm-eval's request cache, read as another process would (0 if not there yet)."""
    if not db.is_file():
        return 0
    try:
        with closing(sqlite3.connect(db, timeout=5)) as conn:
            return conn.execute('SELECT COUNT(*) FROM "unnamed"').fetchone()[0]
    except sqlite3.OperationalError:  # table not created yet
        return 0


def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05
) -> None:
    """Poll until `condition()` holds; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def nopebench_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """The real command line in a child process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "nopebench", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def gsm8k_cli(
    config: Path,
    data: Path | None,
    results: Path | None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """`nopebench gsm8k --config CONFIG [--data DATA] [--results-dir RESULTS]` in a child
    process (nopebench_cli); None leaves that option out."""
    args = ["gsm8k", "--config", str(config)]
    if data is not None:
        args += ["--data", str(data)]
    if results is not None:
        args += ["--results-dir", str(results)]
    return nopebench_cli(*args, env=env, timeout=timeout)


def process_gone(pid: int) -> bool:
    """True once `pid` no longer runs (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def isolate_hf_cache(monkeypatch, directory: Path) -> None:
    """Keep `datasets`' converted copies of the test data out of the user's cache, in this
    process (module attribute, read at load time) and in child processes (environment)."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", directory / "datasets")
    monkeypatch.setenv("HF_HOME", str(directory))
