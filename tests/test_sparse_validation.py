"""FlashInfer's own SM120 argument validation of both sizings, on CPU tensors."""

from __future__ import annotations

import pytest

from nopebench.checks import flashinfer_validation as fv
from nopebench.config import load_model_config
from nopebench.impls import metadata as md

UPSTREAM = (
    "SM120 sparse MLA v32/GLM expects sparse block_tables shape (512, 1, 2048), got (512, 1, 2176)"
)
GLM53 = load_model_config("glm53-flash")
NOPE = fv.Layout("GLM53_NOPE", 0, "arbitrary_fp32")
PREFIX = md.prefix_sizing(GLM53.index_topk, GLM53.topk_width)
FIXED = md.sizing_from_buffer(GLM53.topk_width)


def test_expected_rejection_text_is_the_upstream_one():
    assert fv.expected_sm120_rejection(PREFIX) == UPSTREAM
    assert fv.expected_sm120_rejection(FIXED) is None


@pytest.mark.parametrize("call", [fv.call_public, fv.call_private])
def test_pre_fix_sizing_is_rejected_with_the_exact_message(call):
    outcome = call(NOPE, 16, PREFIX)
    assert (outcome.status, outcome.message) == ("rejected", UPSTREAM)


@pytest.mark.parametrize("layout", fv.layouts_for(GLM53), ids=lambda layout: layout.name)
@pytest.mark.parametrize("call", [fv.call_public, fv.call_private])
def test_fixed_sizing_passes_every_argument_check(call, layout):
    outcome = call(layout, 16, FIXED)
    assert outcome.status == "accepted", outcome.message
    assert fv.DEVICE_STOP_MESSAGE in outcome.message


def test_trtllm_gen_shape_check_agrees():
    assert fv.call_trtllm_gen_shape(NOPE, 16, FIXED).status == "accepted"
    rejected = fv.call_trtllm_gen_shape(NOPE, 16, PREFIX)
    assert rejected.status == "rejected" and "(512, 1, 2048)" in rejected.message


@pytest.mark.parametrize("sizing", [PREFIX, FIXED], ids=lambda s: s.rule)
def test_verdicts_pass_for_glm53(sizing):
    verdict = fv.validate_sizing(NOPE, 16, sizing, expect_accept=sizing is FIXED)
    assert verdict.passed, verdict.detail
    if sizing is PREFIX:
        assert "page-table capacity fix" in verdict.detail


def test_dsv32_both_sizings_are_the_same_and_accepted():
    cfg = load_model_config("dsv32")
    (layout,) = fv.layouts_for(cfg)
    assert layout.name == "DSV3_2"
    for sizing in (
        md.prefix_sizing(cfg.index_topk, cfg.topk_width),
        md.sizing_from_buffer(cfg.topk_width),
    ):
        verdict = fv.validate_sizing(layout, cfg.heads_per_gpu, sizing, expect_accept=True)
        assert verdict.passed and verdict.expected == "accepted", verdict.detail


def test_device_error_elsewhere_is_not_mistaken_for_acceptance():
    try:
        raise ValueError(fv.DEVICE_STOP_MESSAGE)  # raised here, not inside FlashInfer's runner
    except ValueError as exc:
        assert fv.classify_sm120(exc).status == "rejected"


def test_missing_private_validator_is_skipped_not_a_crash(monkeypatch):
    monkeypatch.setattr(fv, "PRIVATE_VALIDATOR", "_trtllm_batch_decode_sparse_mla_v99_removed")
    outcome = fv.call_private(NOPE, 16, FIXED)
    assert (
        outcome.status == "skipped"
        and outcome.message == f"not available in flashinfer {fv.flashinfer_version()}"
    )
    verdict = fv.validate_sizing(NOPE, 16, PREFIX, expect_accept=False)
    assert verdict.passed and "skipped (not available in flashinfer" in verdict.detail


def test_old_flashinfer_skips_the_private_validator(monkeypatch):
    monkeypatch.setattr(fv, "flashinfer_version", lambda: "0.6.3")
    assert fv.call_private(NOPE, 16, FIXED).message == "not available in flashinfer 0.6.3"


def test_a_flashinfer_that_accepted_the_old_sizing_fails_the_check(monkeypatch):
    monkeypatch.setattr(
        fv, "call_public", lambda layout, heads, sizing: fv.Outcome("public", "accepted", "ran")
    )
    assert fv.validate_sizing(NOPE, 16, PREFIX, expect_accept=False).passed is False


def test_a_backend_still_on_the_old_sizing_fails_the_fixed_check(monkeypatch):
    """If the 'fixed' sizing handed to FlashInfer were index_topk, the check must go red."""
    buggy = md.PageTableSizing("fixed", GLM53.topk_width, GLM53.index_topk, GLM53.index_topk)
    assert fv.validate_sizing(NOPE, 16, buggy, expect_accept=True).passed is False
