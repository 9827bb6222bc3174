"""tools/ab_summary.py: the A/B table of two kernel forms from tune_native runs."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import ab_summary  # noqa: E402

ENV = {"gpu": "G", "driver": "1", "torch": "2", "triton": "3", "git_sha": "abc", "timestamp": "t"}


def tune_csv(register_ms: float, reference_ms: float, passed: bool = True) -> bytes:
    rows = [
        {
            "heads": 16,
            "tokens": 512,
            "width": 2176,
            "mode": "nope",
            "kernel": k,
            "median_ms": ms,
            "passed": passed,
            **ENV,
        }
        for k, ms in (("register", register_ms), ("hopper_ws", reference_ms))
    ]
    return pd.DataFrame(rows).to_csv(index=False).encode()


def pack(tmp_path: Path, runs: dict[str, bytes]) -> Path:
    path = tmp_path / "tune.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for run, data in runs.items():
            info = tarfile.TarInfo(f"./{run}/tune.csv")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_ratio_is_the_median_of_each_forms_runs(tmp_path):
    tarball = pack(
        tmp_path,
        {
            "new-2176-r1": tune_csv(0.30, 0.20),
            "new-2176-r2": tune_csv(0.32, 0.21),
            "before-2176-r1": tune_csv(0.20, 0.20),
            "before-2176-r2": tune_csv(0.22, 0.22),
        },
    )
    out = ab_summary.summarise(ab_summary.load(tarball), "register", "hopper_ws")
    row = out.iloc[0]
    assert row.new_over_before == pytest.approx(0.31 / 0.21)
    assert row.hopper_ws_spread == pytest.approx(0.22 / 0.20)
    assert row["new-2176-r2"] == pytest.approx(0.32) and row.git_sha == "abc"


def test_a_failed_check_or_a_missing_form_is_an_error(tmp_path):
    failed = pack(
        tmp_path,
        {"new-2176-r1": tune_csv(0.3, 0.2, passed=False), "before-2176-r1": tune_csv(0.2, 0.2)},
    )
    with pytest.raises(SystemExit, match="failed its check"):
        ab_summary.summarise(ab_summary.load(failed), "register", "hopper_ws")
    one_form = pack(tmp_path, {"new-2176-r1": tune_csv(0.3, 0.2)})
    with pytest.raises(SystemExit, match="new-\\* and before-\\*"):
        ab_summary.summarise(ab_summary.load(one_form), "register", "hopper_ws")
