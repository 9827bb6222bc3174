"""From lm-eval's results to the run's records and the table printed at the end.

lm-eval logs one sample per (problem, filter); the per-sample file here has one row per
problem with both filters side by side, so a wrong answer can be read in one place. The
headline metric is strict-match (the answer after '#### '), the figure upstream reports;
flexible-extract (the last number in the text) is printed beside it, and the gap between them
is mostly the invalid-answer rate (no '#### N' at all).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nopebench import console as out
from nopebench.gsm8k.config import Gsm8kConfig
from nopebench.gsm8k.data import TASK_NAME

FILTERS = ("strict-match", "flexible-extract")
INVALID = "[invalid]"  # lm-eval's regex filter fallback when nothing matches


def _key(filter_name: str) -> str:
    return filter_name.replace("-", "_")


def sample_rows(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per problem: question, target, response, each filter's extraction and score."""
    rows: dict[int, dict[str, Any]] = {}
    for s in samples:
        row = rows.setdefault(
            int(s["doc_id"]),
            {
                "doc_id": int(s["doc_id"]),
                "question": s["doc"]["question"],
                "target": s["target"],
                "response": s["resps"][0][0],
                "prompt_hash": s.get("prompt_hash"),
            },
        )
        key = _key(s["filter"])
        row[f"{key}_answer"] = s["filtered_resps"][0]
        row[f"{key}_correct"] = float(s["exact_match"])
    return [rows[i] for i in sorted(rows)]


def to_jsonable(results: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's results without the samples, made plain JSON with lm-eval's own converter."""
    from lm_eval.utils import handle_non_serializable

    trimmed = {k: v for k, v in results.items() if k != "samples"}
    return json.loads(json.dumps(trimmed, default=handle_non_serializable))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def summarize(
    cfg: Gsm8kConfig,
    results: dict[str, Any],
    rows: list[dict[str, Any]],
    wall_s: float,
    asked: int,
    from_cache: int,
    retries: int,
    full: int | None = None,
) -> dict[str, Any]:
    """The numbers of one run, at full precision: what run.json and the table show.

    `full` is the number of problems in the whole set. A run of fewer (--limit) is a sample:
    its strict-match is reported with its standard error, and `passed` is None, because the
    threshold is set for the full run: a model that scores 0.93 on all 1319 problems scores
    9 of 10 or less (0.9, below a threshold of 0.91) on about half of all 10-problem samples.
    """
    metrics = results["results"][TASK_NAME]
    n = len(rows)
    invalid = sum(row["strict_match_answer"] == INVALID for row in rows)
    summary: dict[str, Any] = {"config": cfg.name, "model": cfg.model, "api": cfg.api, "n": n}
    for name in FILTERS:
        summary[_key(name)] = float(metrics[f"exact_match,{name}"])
        stderr = metrics.get(f"exact_match_stderr,{name}")
        summary[f"{_key(name)}_stderr"] = (
            float(stderr) if isinstance(stderr, (int, float)) else None
        )
    summary.update(
        invalid_answers=invalid,
        invalid_rate=invalid / n if n else 0.0,
        asked=asked,
        from_cache=from_cache,
        retries=retries,
        wall_s=wall_s,
        questions_per_s=asked / wall_s if wall_s > 0 else None,
        threshold=cfg.threshold,
        of=full if full is not None else n,
        judged=full is None or n >= full,
        passed=summary["strict_match"] >= cfg.threshold if full is None or n >= full else None,
        reference=[
            {"label": r.label, "strict_match": r.strict_match, "range": r.range}
            for r in cfg.reference
        ],
    )
    return summary


def _pm(value: float, stderr: float | None) -> str:
    return f"{value:.4f} ± {stderr:.4f}" if stderr is not None else f"{value:.4f}"


def _server_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """What the server itself reported: its count of answered requests, its attention backend."""
    rows = []
    counted = s.get("server_requests")
    if counted is not None:
        text = f"{counted['answered']} ({counted['metric']})"
        rows.append(("answered, counted by the server", text))
    backend = s.get("attention_backend")
    if backend is not None:
        text = f"{backend['selected']} ({backend['lines']} lines)"
        rows.append(("attention backend (server log)", text))
    return rows


def print_summary(cfg: Gsm8kConfig, summary: dict[str, Any], run_path: Path) -> None:
    s = summary
    rate = f"{s['questions_per_s']:.2f}" if s["questions_per_s"] is not None else "-"
    rows: list[tuple[str, str]] = [
        ("strict-match", _pm(s["strict_match"], s["strict_match_stderr"])),
        ("flexible-extract", _pm(s["flexible_extract"], s["flexible_extract_stderr"])),
        ("problems (n)", str(s["n"])),
        ("invalid answers (no '#### N')", f"{s['invalid_rate']:.4f} ({s['invalid_answers']})"),
        ("asked this run / from cache", f"{s['asked']} / {s['from_cache']}"),
        *_server_rows(s),
        ("retries", str(s["retries"])),
        ("wall time", f"{s['wall_s']:.1f} s"),
        ("questions/s (asked this run)", rate),
    ]
    rows += [(f"reference: {r.label}", r.text()) for r in cfg.reference]
    if s.get("judged", True):
        rows.append((f"threshold (strict-match >= {cfg.threshold:.4f})", out.verdict(s["passed"])))
    else:
        rows.append(
            (
                f"threshold (strict-match >= {cfg.threshold:.4f})",
                f"not judged: {s['n']} of {s['of']} problems, a sample (--limit); "
                "the threshold is for the full run",
            )
        )
    title = (
        f"GSM8K {cfg.name}: {cfg.model} "
        f"via /v1/{'chat/completions' if cfg.api == 'chat' else 'completions'}"
    )
    out.console.print(out.table(title, ["", "value"], rows))
    out.console.print(f"results: {run_path}")
