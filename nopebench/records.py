"""Run directories and result files.

Every run writes into a fresh directory `results/<kind>/<UTC time>-<short id>/` (`results/`
under the working directory unless --results-dir says otherwise) and never touches an
existing one. Files are written to a temporary name and renamed, and `run.json`
(environment header, status, summary) is written last, so a directory without a final
`run.json` status is visibly incomplete rather than a partial result passed off as whole.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from nopebench.environment import environment_header

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


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Long-format CSV at full precision (repr of floats round-trips)."""
    tmp = path.with_name(path.name + ".tmp")
    pd.DataFrame(rows).to_csv(tmp, index=False, float_format="%.17g")
    os.replace(tmp, path)
    return path


@dataclass
class RunDir:
    """A fresh results directory for one command run."""

    kind: str
    path: Path
    run_id: str
    header: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(
        cls, kind: str, root: Path | None = None, command: list[str] | None = None
    ) -> RunDir:
        root = Path(root) if root is not None else DEFAULT_RESULTS
        # Microseconds, so that ids of runs started within one second still sort by time.
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        run_id = f"{stamp}-{secrets.token_hex(3)}"
        path = root / kind / run_id
        path.mkdir(parents=True, exist_ok=False)
        header = {"run_id": run_id, "kind": kind, **environment_header(command)}
        run = cls(kind=kind, path=path, run_id=run_id, header=header)
        write_json(path / RUN_FILE, {**header, "status": "running"})
        return run

    def file(self, name: str) -> Path:
        return self.path / name

    def finish(self, status: str, summary: dict[str, Any] | None = None) -> Path:
        """Write run.json last, with status 'passed', 'failed' or 'error'."""
        return write_json(
            self.path / RUN_FILE, {**self.header, "status": status, "summary": summary or {}}
        )


def read_run(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / RUN_FILE).read_text(encoding="utf-8"))


def latest_run(kind: str, root: Path | None = None) -> Path | None:
    """Newest finished run directory of a kind (run ids sort by time)."""
    base = (Path(root) if root is not None else DEFAULT_RESULTS) / kind
    if not base.is_dir():
        return None
    runs = sorted(p for p in base.iterdir() if (p / RUN_FILE).is_file())
    finished = [p for p in runs if read_run(p).get("status") != "running"]
    return finished[-1] if finished else None
