"""Which attention backend served the run: vLLM's own selection line, read from the server's log.

A config with `attention_backend: NAME` says which backend the run must exercise (the one a
fix is for). A passing score proves nothing about that backend if another one served the
model, so before a question is sent the server's log must show vLLM choosing NAME, in one of
the two forms its platform code logs:

    Using NAME attention backend out of potential backends: ['NAME', ...].   (by priority)
    Using NAME backend.                                        (forced: --attention-backend)

(the forced form may print the enum as `AttentionBackendEnum.NAME`; ROCm words both slightly
differently, and is read too). Every selection line in
the log must name NAME: one process per GPU logs its own, and a line naming another backend
means some part of the model ran elsewhere. A log with no selection line at all fails too:
vLLM's CPU platform, for one, picks its backend without logging it, so nothing there shows
which code served the run. Either failure is one line and exit 1, with nothing asked.

Point an attach-mode `server.log_file` at the log of the server now running: the whole file is
read, so an older start's lines in the same file would count too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_NAME = r"(?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]*)"
# CUDA's wording; ROCm's drops "attention" and says "(selected via --attention-backend)".
SELECTED = re.compile(rf"\bUsing {_NAME} (?:attention )?backend out of potential backends:")
FORCED = re.compile(rf"\bUsing {_NAME} backend(?: \(selected via --attention-backend\))?\.\s*$")
_REFUSED = r"\bCannot use (?:AttentionBackendEnum\.)?{name} backend[^\n]*"
LINE_CHARS = 300  # a quoted log line is cut here: the message stays one readable line


@dataclass(frozen=True)
class Selection:
    backend: str
    forced: bool
    line: str


class BackendCheckFailed(Exception):
    """The log does not show the required backend; `record` goes to run.json."""

    def __init__(self, message: str, record: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.record = record


def selections(text: str) -> list[Selection]:
    """vLLM's attention-backend selection lines in a log, in order."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        match = SELECTED.search(line)
        forced = match is None
        if forced:
            match = FORCED.search(line)
        if match is not None:
            found.append(Selection(match.group(1), forced, line))
    return found


def _quote(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "..."


def check_backend(required: str, log_path: Path) -> dict[str, Any]:
    """The run.json record of the selection when every line in the log names `required`;
    otherwise `BackendCheckFailed` with one line saying what the log shows instead."""
    record: dict[str, Any] = {"required": required, "log": str(log_path)}
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        record["selected"] = None
        raise BackendCheckFailed(
            f"attention backend check: cannot read the server log {log_path} "
            f"({reason}); the run requires {required}",
            record,
        ) from None
    found = selections(text)
    names = sorted({s.backend for s in found})
    record.update(
        selected=names[0] if len(names) == 1 else names or None,
        lines=len(found),
        forced=any(s.forced for s in found),
        first_line=_quote(found[0].line) if found else None,
    )
    if not found:
        refused = re.search(_REFUSED.format(name=re.escape(required)), text)
        said = f"; the log says: {_quote(refused.group(0).strip())}" if refused else ""
        raise BackendCheckFailed(
            f"attention backend check failed: the server log {log_path} names no attention "
            f"backend (no vLLM line 'Using <NAME> attention backend out of potential backends' "
            f"or 'Using <NAME> backend.'), so nothing shows that {required} served the run"
            f"{said}; no question was sent",
            record,
        )
    others = [s for s in found if s.backend != required]
    if others:
        raise BackendCheckFailed(
            f"attention backend check failed: the server log {log_path} shows vLLM using "
            f"{', '.join(n for n in names if n != required)}, not {required} "
            f"({len(others)} of {len(found)} selection lines, e.g. {_quote(others[0].line)!r}); "
            f"no question was sent",
            record,
        )
    return record
