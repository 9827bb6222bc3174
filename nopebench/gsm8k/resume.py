"""Resuming a GSM8K run that failed, was interrupted or was killed.

A run directory holds the effective config (`config.json`) and lm-eval's request cache, which
has every finished answer (each committed as it arrived, see `evaluate`). `--resume RUN_DIR`
starts a fresh run directory, as every command does, seeded with a copy of that cache, so only
the missing answers are requested and the old directory stays exactly as it was left.

The cache is keyed by prompt and generation settings only, not by model or server, so a resume
is refused when the old run asked something different (another model, API, shot count, token
budget, seed or data): reusing its answers would mix two evaluations. A run whose run.json
still says `running` is resumed only when its process is gone (`died`: killed, or its machine
went down); one still running here, or recorded on another host, is refused in one line.
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
    _check_not_running(resume_dir)
    current = json.loads(json.dumps(cfg.request_fingerprint()))
    for key in current:
        if saved.get(key) != current[key]:
            raise UsageError(
                f"--resume {resume_dir}: that run used {key} = {saved.get(key)!r}, this one "
                f"{current[key]!r}; its answers would not be answers to these requests"
            )
    cache = resume_dir / CACHE_FILE
    return cache if cache.is_file() else None


def _check_not_running(resume_dir: Path) -> None:
    """Refuse a run that may still be writing its cache (a copy of it would miss answers)."""
    from nopebench.records import RUN_FILE, read_run, run_status

    if not (resume_dir / RUN_FILE).is_file():
        return
    try:
        header = read_run(resume_dir)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--resume {resume_dir}: cannot read {RUN_FILE} ({exc})") from None
    status = run_status(header)
    if status != "running":
        return
    if header.get("pid") is None:
        raise UsageError(
            f"--resume {resume_dir}: its {RUN_FILE} says running and names no process "
            "to check; resume it once it has ended"
        )
    where = f"process {header['pid']} on {header.get('host')}"
    raise UsageError(
        f"--resume {resume_dir}: that run is still running ({where}); stop it first, "
        "or resume it there once it has ended"
    )


def resumed_status(resume_dir: Path) -> str | None:
    """How the run being resumed ended: run.json's status, or `died` for a dead `running` one."""
    from nopebench.records import RUN_FILE, read_run, run_status

    try:
        return run_status(read_run(resume_dir)) if (resume_dir / RUN_FILE).is_file() else None
    except (OSError, ValueError):
        return None


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
