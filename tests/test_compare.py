"""compare.close: FlashMLA's element rule, the cosine bound, and an accuracy class's allowance."""

from __future__ import annotations

import torch

from nopebench.compare import close


def _ref_and_outlier(n: int, outliers: int):
    ref = torch.randn(n, generator=torch.Generator().manual_seed(0))
    ref[:outliers] = 0.05
    out = ref.clone()
    out[:outliers] = 0.06  # 10x the absolute bound, 20% relative; too few to move the cosine
    return out, ref


def test_strict_rule_fails_on_one_element_in_a_hundred_thousand():
    out, ref = _ref_and_outlier(100_000, 1)
    cmp = close(out, ref)
    assert not cmp.passed and cmp.mismatch_fraction == 1e-5 and cmp.cos_diff < 5e-6
    assert "allowed 0.0000%" in cmp.detail


def test_mismatch_allowance_is_a_ceiling_not_a_waiver():
    out, ref = _ref_and_outlier(100_000, 10)
    assert close(out, ref, max_mismatch=1e-4).passed  # exactly at the allowance
    out, ref = _ref_and_outlier(100_000, 11)
    assert not close(out, ref, max_mismatch=1e-4).passed
    assert not close(ref * 0.9, ref, max_mismatch=1e-4).passed  # every element 10% off
