"""Resuming a GSM8K run that failed, was interrupted or was killed.

A run directory holds the effective config (`config.json`) and lm-eval's request cache, which
has every finished answer (each committed as it arrived, see `evaluate`). `--resume RUN_DIR`
starts a fresh run directory, as every command does, seeded with a copy of that cache, so only
the missing answers are requested and the old directory stays exactly as it was left.

The cache is keyed by prompt and generation settings only, not by model or server, so a resume
is refused when the old run asked something different (another model, API, shot count, token
budget, seed or data): reusing its answers would mix two evaluations.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from nopebench.errors import UsageError
from nopebench.gsm8k.config import Gsm8kConfig
from nopebench.gsm8k.evaluate import CACHE_FILE

CONFIG_FILE = "config.json"
JOURNAL_SUFFIX = "-journal"  # sqlite's rollback journal, present if a commit was cut short


def previous_cache(resume_dir: Path, cfg: Gsm8kConfig) -> Path | None:
    """The cache file of `resume_dir` after checking it was the same evaluation; None if empty."""
    resume_dir = Path(resume_dir)
    saved_path = resume_dir / CONFIG_FILE
    if not saved_path.is_file():
        raise UsageError(f"--resume {resume_dir}: not a gsm8k run directory (no {CONFIG_FILE})")
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))["fingerprint"]
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--resume {resume_dir}: cannot read {CONFIG_FILE} ({exc})") from None
    current = json.loads(json.dumps(cfg.request_fingerprint()))
    for key in current:
        if saved.get(key) != current[key]:
            raise UsageError(
                f"--resume {resume_dir}: that run used {key} = {saved.get(key)!r}, this one "
                f"{current[key]!r}; its answers would not be answers to these requests"
            )
    cache = resume_dir / CACHE_FILE
    return cache if cache.is_file() else None


def copy_cache(source: Path, run_dir: Path) -> Path:
    """Copy the cache (and a leftover journal, which sqlite rolls back on open) into `run_dir`."""
    target = run_dir / CACHE_FILE
    shutil.copyfile(source, target)
    journal = source.with_name(source.name + JOURNAL_SUFFIX)
    if journal.is_file():
        shutil.copyfile(journal, target.with_name(target.name + JOURNAL_SUFFIX))
    return target


def cached_answers(cache: Path) -> int:
    """Finished generations in a cache file (0 when there is none)."""
    if not cache.is_file():
        return 0
    try:
        with closing(sqlite3.connect(cache, timeout=10)) as conn:
            return int(
                conn.execute('SELECT COUNT(*) FROM "unnamed"').fetchone()[0]
            )  # SqliteDict's table
    except sqlite3.Error:
        return 0


def save_config(run_dir: Path, cfg: Gsm8kConfig, source: str, resumed_from: Path | None) -> None:
    from nopebench.records import write_json

    write_json(
        run_dir / CONFIG_FILE,
        {
            "source": source,
            "resumed_from": str(resumed_from) if resumed_from else None,
            "fingerprint": cfg.request_fingerprint(),
            "config": cfg.model_dump(),
        },
    )


def resume_command(
    config: str,
    base_url: str | None,
    limit: int | None,
    data: Path | None,
    results_dir: Path | None,
    run_dir: Path,
) -> str:
    """The command line that continues `run_dir`: the same arguments plus --resume."""
    args: list[Any] = ["nopebench", "gsm8k", "--config", config]
    paths = [Path(p).resolve() if p is not None else None for p in (data, results_dir)]
    for flag, value in (
        ("--base-url", base_url),
        ("--limit", limit),
        ("--data", paths[0]),
        ("--results-dir", paths[1]),
    ):
        if value is not None:
            args += [flag, value]
    args += ["--resume", run_dir]
    return shlex.join(str(a) for a in args)
