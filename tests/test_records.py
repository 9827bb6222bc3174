"""Run directories and result files: fresh directories, run.json last, strict JSON, exact CSV."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nopebench.records import RunDir, latest_run, read_csv, read_run, write_csv, write_json


def strict_load(path: Path):
    """json.loads that refuses NaN / Infinity literals, as other JSON readers do."""

    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_run_dir_is_fresh_and_run_json_is_written_last(tmp_path):
    run = RunDir.create("verify-layout", tmp_path, command=["nopebench", "verify-layout"])
    assert run.path.parent == tmp_path / "verify-layout" and run.path.is_dir()
    header = read_run(run.path)
    assert header["status"] == "running" and header["run_id"] == run.run_id == run.path.name
    assert header["kind"] == "verify-layout" and header["command"] == "nopebench verify-layout"
    for key in ("git_sha", "git_dirty", "timestamp", "python", "gpu", "versions"):
        assert key in header
    assert header["versions"]["torch"] == torch.__version__

    write_json(run.file("checks.json"), {"x": 1})
    run.finish("passed", {"cases": 1})
    done = read_run(run.path)
    assert done["status"] == "passed" and done["summary"] == {"cases": 1}
    assert sorted(p.name for p in run.path.iterdir()) == ["checks.json", "run.json"]  # no .tmp left


def test_two_runs_get_two_directories(tmp_path):
    a = RunDir.create("k", tmp_path)
    b = RunDir.create("k", tmp_path)
    assert a.path != b.path and a.run_id != b.run_id
    assert len(list((tmp_path / "k").iterdir())) == 2


def test_latest_run_is_the_newest_finished_one(tmp_path):
    assert latest_run("k", tmp_path) is None
    runs = []
    for _ in range(4):  # all within a second or so: the ids must still sort by time
        run = RunDir.create("k", tmp_path)
        run.finish("passed")
        runs.append(run.path)
    assert latest_run("k", tmp_path) == runs[-1]
    unfinished = RunDir.create("k", tmp_path)
    assert latest_run("k", tmp_path) == runs[-1]
    unfinished.finish("failed")
    assert latest_run("k", tmp_path) == unfinished.path
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == [
        p.name for p in [*runs, unfinished.path]
    ]


def test_json_has_no_nan_literals(tmp_path):
    data = {
        "nan": math.nan,
        "inf": math.inf,
        "ninf": -math.inf,
        "ok": 0.1,
        "np": np.float32("nan"),
        "np64": np.float64(2.5),
        "npint": np.int64(7),
        "npbool": np.bool_(True),
        "nested": [1.0, (math.nan, {"deep": math.inf})],
        "path": Path("/a/b"),
        3: "int key",
        "array": np.array([1.0, np.nan]),
        "tensor": torch.tensor([0.5, float("inf")]),
        "scalar_tensor": torch.tensor(2.0),
    }
    path = write_json(tmp_path / "x.json", data)
    loaded = strict_load(path)
    assert (
        loaded["nan"] == "nan"
        and loaded["inf"] == "inf"
        and loaded["ninf"] == "-inf"
        and loaded["ok"] == 0.1
    )
    assert (
        loaded["np"] == "nan"
        and loaded["np64"] == 2.5
        and loaded["npint"] == 7
        and loaded["npbool"] is True
    )
    assert (
        loaded["nested"] == [1.0, ["nan", {"deep": "inf"}]]
        and loaded["path"] == "/a/b"
        and loaded["3"] == "int key"
    )
    assert (
        loaded["array"] == [1.0, "nan"]
        and loaded["tensor"] == [0.5, "inf"]
        and loaded["scalar_tensor"] == 2.0
    )


def test_csv_is_full_precision(tmp_path):
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)
    values = [0.1, 1 / 3, 1e-300, 5e-324, 2.0**-133, 123456789.123456789, -0.0, math.pi]
    values += spread.tolist()
    rows = [{"run": "r", "i": i, "value": v, "passed": i % 2 == 0} for i, v in enumerate(values)]
    path = write_csv(tmp_path / "x.csv", rows)
    back = read_csv(path)  # what report and compare read records with
    assert back["value"].tolist() == values
    assert back["passed"].tolist() == [r["passed"] for r in rows]


def test_csv_missing_values(tmp_path):
    back = pd.read_csv(
        write_csv(tmp_path / "x.csv", [{"worst": None}, {"worst": math.nan}, {"worst": 1.0}])
    )
    assert back["worst"].isna().tolist() == [True, True, False]


def test_launcher_named_commit_overrides_the_checkout(monkeypatch):
    """A GPU machine's copy of the tree may carry a stale .git: the launcher's sha wins."""
    from nopebench.environment import git_state

    monkeypatch.delenv("NOPEBENCH_GIT_SHA", raising=False)
    own = git_state()
    monkeypatch.setenv("NOPEBENCH_GIT_SHA", "0123abc")
    monkeypatch.setenv("NOPEBENCH_GIT_DIRTY", "0")
    assert git_state() == {"git_sha": "0123abc", "git_dirty": False}
    monkeypatch.setenv("NOPEBENCH_GIT_DIRTY", "1")
    assert git_state()["git_dirty"] is True
    assert own["git_sha"] != "0123abc"
