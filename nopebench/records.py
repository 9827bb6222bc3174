"""Run directories and result files.

Every run writes into a fresh directory `results/<kind>/<UTC time>-<short id>/` (`results/`
under the working directory unless --results-dir says otherwise) and never touches an
existing one. Files are written to a temporary name and renamed, and `run.json` (environment
header, status, summary) is written last, so a directory without a final `run.json` status is
visibly incomplete rather than a partial result passed off as whole.

`run.json`'s status is one of:
- `running`: the command has not ended (the header names its host and process id);
- `passed` / `failed`: it ended, and every file the summary names exists;
- `done`: it ended without a verdict (a GSM8K sample run with --limit);
- `error`: it stopped on an error, which the summary gives in one line;
- `interrupted`: Ctrl-C or SIGTERM stopped it.
A run whose status says `running` while its process is gone (killed with SIGKILL, or its
machine went down) is shown as `died` (`run_status`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from nopebench.config import check_path_length
from nopebench.environment import environment_header
from nopebench.errors import UsageError

DEFAULT_RESULTS = Path("results")  # relative: under the working directory
RUN_FILE = "run.json"


def _jsonable(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so files stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy / torch scalars and arrays
        return _jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: Path, data: Any) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str] | None = None) -> Path:
    """Long-format CSV at full precision (repr of floats round-trips); `columns`, when given,
    fixes them, so a file with no rows still has its header."""
    tmp = path.with_name(path.name + ".tmp")
    pd.DataFrame(rows, columns=columns).to_csv(tmp, index=False, float_format="%.17g")
    os.replace(tmp, path)
    return path


def read_csv(path: Path) -> pd.DataFrame:
    """A results CSV, every float read back exactly as written (pandas 3 does so by default;
    earlier pandas needs its round-trip parser, an option pandas 3 deprecates)."""
    if int(pd.__version__.split(".")[0]) >= 3:
        return pd.read_csv(path)
    return pd.read_csv(path, float_precision="round_trip")


def process_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (Linux); None if unknown.

    With the pid it identifies a process: a pid reused by a later process has another start.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def process_alive(pid: int, start: int | None) -> bool:
    """Whether the process that wrote a run.json (pid, start) still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    now = process_start(pid)
    return start is None or now is None or now == start


def run_status(header: dict[str, Any]) -> str:
    """run.json's status, except that a `running` run whose process is gone is `died`.

    Only a run recorded on this host can be checked; one from another host keeps `running`.
    """
    status = str(header.get("status"))
    pid = header.get("pid")
    if status != "running" or not isinstance(pid, int) or header.get("host") != platform.node():
        return status
    return status if process_alive(pid, header.get("pid_start")) else "died"


def check_writable_dir(path: Path, what: str = "--results-dir") -> Path:
    """Fail before any work, in one line, when `path` cannot become a directory written into:
    a file is in the way, a parent is not a directory, or it (or the nearest existing parent,
    when it does not exist yet) refuses a new entry (permissions, read-only, immutable).
    Writes nothing: the probe directory is removed again."""
    path = Path(path)
    check_path_length(path, what)
    existing = path
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        is_dir = existing.is_dir()
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror}") from None
    if not is_dir:
        where = "" if existing == path else f" ({existing} is one)"
        raise UsageError(f"{what} {path}: a file is in the way{where}; give a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".nopebench-probe-", dir=existing))
    except OSError as exc:
        place = "" if existing == path else f" (in {existing})"
        raise UsageError(
            f"{what} {path}: cannot write there{place}: {exc.strerror or exc}"
        ) from None
    return path


def check_results_root(root: Path | None) -> Path:
    """The results root a command will write under, checked writable before any work."""
    return check_writable_dir(Path(root) if root is not None else DEFAULT_RESULTS)


# Run directories this process opened and has not finished, so that an error or Ctrl-C that
# ends the command can still give each its final status (`close_open_runs`).
_OPEN: dict[Path, RunDir] = {}


@dataclass
class RunDir:
    """A fresh results directory for one command run."""

    kind: str
    path: Path
    run_id: str
    header: dict[str, Any] = field(default_factory=dict)
    partial: dict[str, Any] = field(default_factory=dict)  # the summary so far (`note`)

    @classmethod
    def create(
        cls, kind: str, root: Path | None = None, command: list[str] | None = None
    ) -> RunDir:
        root = Path(root) if root is not None else DEFAULT_RESULTS
        # Microseconds, so that ids of runs started within one second still sort by time.
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        run_id = f"{stamp}-{secrets.token_hex(3)}"
        path = root / kind / run_id
        pid = os.getpid()
        header = {
            "run_id": run_id,
            "kind": kind,
            **environment_header(command),
            "pid": pid,
            "pid_start": process_start(pid),
        }
        path.mkdir(parents=True, exist_ok=False)
        run = cls(kind=kind, path=path, run_id=run_id, header=header)
        write_json(path / RUN_FILE, {**header, "status": "running"})
        _OPEN[path] = run
        return run

    def file(self, name: str) -> Path:
        return self.path / name

    def note(self, summary: dict[str, Any]) -> None:
        """The summary so far: what run.json will hold if the command is stopped early."""
        self.partial = dict(summary)

    def checkpoint(self, status: str, summary: dict[str, Any]) -> Path:
        """Write run.json with `status` now, but keep the run open: if the command is stopped
        before `finish`, `close_open_runs` still gives it its last status. Like `finish`, only
        with a summary whose named files all exist."""
        self.partial = dict(summary)
        return write_json(
            self.path / RUN_FILE, {**self.header, "status": status, "summary": summary}
        )

    def finish(self, status: str, summary: dict[str, Any] | None = None) -> Path:
        """Write run.json last, with its final status (see the module docstring). Call it only
        once every file the summary names exists."""
        _OPEN.pop(self.path, None)
        return write_json(
            self.path / RUN_FILE, {**self.header, "status": status, "summary": summary or {}}
        )


def close_open_runs(status: str, error: str, inside: Path | None = None) -> None:
    """Finish every run directory this process left `running`, newest first, with `status`
    (`error` or `interrupted`), its summary so far and the one-line `error`. With `inside`,
    only the runs nested in that directory (the steps of a main job), not it."""
    for run in reversed(list(_OPEN.values())):
        if inside is not None and (run.path == inside or inside not in run.path.parents):
            continue
        try:
            run.finish(status, {**run.partial, "error": error})
        except OSError:
            _OPEN.pop(run.path, None)  # the directory itself is gone or unwritable


def read_run(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / RUN_FILE).read_text(encoding="utf-8"))


def latest_run(kind: str, root: Path | None = None) -> Path | None:
    """Newest finished run directory of a kind (run ids sort by time)."""
    base = (Path(root) if root is not None else DEFAULT_RESULTS) / kind
    if not base.is_dir():
        return None
    runs = sorted(p for p in base.iterdir() if (p / RUN_FILE).is_file())
    finished = [p for p in runs if run_status(read_run(p)) not in ("running", "died")]
    return finished[-1] if finished else None
