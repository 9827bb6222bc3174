"""tools/ncu_partitions.py --shared: shared-memory wavefronts by SASS opcode."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import ncu_partitions  # noqa: E402

COLUMNS = [
    "Address",
    "Source",
    "Warp Stall Sampling (All Samples)",
    "Instructions Executed",
    "L1 Wavefronts Shared",
    "L1 Wavefronts Shared Excessive",
    "L1 Wavefronts Shared Ideal",
    "stall_long_sb",
]
ROWS = [
    ["0x10", "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64], P0 ;", 5, 10, 100, 60, 40, 1],
    ["0x20", "@!P2 LDGSTS.E.BYPASS.128 [R1+0x200], desc[UR4][R4.64], P1 ;", 3, 10, 80, 40, 40, 0],
    ["0x30", "STS.128 [R5], R8 ;", 1, 4, 16, 0, 16, 0],
    ["0x40", "FADD R1, R2, R3 ;", 9, 50, 0, 0, 0, 2],
]


def write_profile(path: Path, columns=COLUMNS, rows=ROWS) -> Path:
    frame = pd.DataFrame(rows, columns=columns)
    path.write_text('"Kernel Name","k",\n' + frame.to_csv(index=False))
    return path


def test_shared_traffic_sums_each_opcode_with_or_without_a_predicate(tmp_path):
    df = ncu_partitions.load(str(write_profile(tmp_path / "src.csv")))
    t = ncu_partitions.shared_traffic(df, blocks=4)
    assert list(t.index) == ["LDGSTS.E.BYPASS.128", "STS.128"]  # most first; no FADD
    ldgsts = t.loc["LDGSTS.E.BYPASS.128"]
    assert (ldgsts.wavefronts, ldgsts.excessive, ldgsts.ideal) == (180, 100, 80)
    assert ldgsts.per_instruction == pytest.approx(9.0)
    assert ldgsts.ideal_per_instruction == pytest.approx(4.0)
    assert ldgsts.per_block == pytest.approx(45.0)
    assert t.share.sum() == pytest.approx(1.0)


def test_shared_mode_needs_the_wavefront_columns(tmp_path, monkeypatch):
    kept = [c for c in COLUMNS if "Wavefronts" not in c]
    rows = [[r[i] for i, c in enumerate(COLUMNS) if "Wavefronts" not in c] for r in ROWS]
    path = write_profile(tmp_path / "src.csv", kept, rows)
    monkeypatch.setattr(sys, "argv", ["ncu_partitions.py", str(path), "--shared"])
    with pytest.raises(SystemExit, match="no shared-wavefront columns"):
        ncu_partitions.main()
