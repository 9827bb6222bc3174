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


def tune_csv(
    ms: float,
    reference_ms: float,
    passed: bool = True,
    kernel: str = "register",
    heads: int = 16,
    reference: str = "hopper_ws",
) -> bytes:
    rows = [
        {
            "heads": heads,
            "tokens": 512,
            "width": 2176,
            "mode": "nope",
            "kernel": k,
            "median_ms": ms,
            "passed": passed,
            **ENV,
        }
        for k, ms in ((kernel, ms), (reference, reference_ms))
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
    out = ab_summary.summarise(ab_summary.load(tarball), ["register"], "hopper_ws")
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
        ab_summary.summarise(ab_summary.load(failed), ["register"], "hopper_ws")
    one_form = pack(tmp_path, {"new-2176-r1": tune_csv(0.3, 0.2)})
    with pytest.raises(SystemExit, match="new-\\* and before-\\*"):
        ab_summary.summarise(ab_summary.load(one_form), ["register"], "hopper_ws")


def test_each_shape_takes_whichever_named_kernel_ran_there(tmp_path):
    def both(wide_ms: float, ws_ms: float) -> bytes:  # 32 heads ran one kernel, 64 another
        ws = tune_csv(ws_ms, 0.2, kernel="hopper_ws", heads=32, reference="register")
        wide = tune_csv(wide_ms, 0.2, kernel="hopper_wide", heads=64, reference="register")
        return ws + wide.split(b"\n", 1)[1]

    tarball = pack(tmp_path, {"new-2176-r1": both(0.40, 0.30), "before-2176-r1": both(0.50, 0.20)})
    out = ab_summary.summarise(ab_summary.load(tarball), ["hopper_wide", "hopper_ws"], "register")
    ratios = dict(zip(out.heads, out.new_over_before, strict=True))
    assert ratios == {32: pytest.approx(1.5), 64: pytest.approx(0.8)}
