"""Known-failure signatures: the upstream texts are recognised and explained in one line."""

from __future__ import annotations

import pytest

from nopebench import signatures

SM120_TEXT = (
    "SM120 sparse MLA v32/GLM expects sparse block_tables shape (512, 1, 2048), got (512, 1, 2176)"
)
TRTLLM_TEXT = "Expected page_table.shape == (512, 1, 2048), got torch.Size([512, 1, 2176])"
PE_DIM_TEXT = "pe_dim must be 64 for fp8_ds_mla"


def test_sm120_width_error_names_the_missing_fix_and_widths():
    line = signatures.explain(SM120_TEXT)
    assert "page-table capacity fix" in line and "expected width 2048, buffer is 2176" in line
    assert "\n" not in line


def test_trtllm_gen_width_error_is_the_same_missing_fix():
    assert signatures.match(TRTLLM_TEXT).name == "trtllm-gen-page-table-width"
    assert "expected width 2048, buffer is 2176" in signatures.explain(TRTLLM_TEXT)


def test_cache_write_error_names_the_cache_write_fix():
    assert signatures.match(PE_DIM_TEXT).name == "cache-write-pe-dim"
    assert "NoPE cache-write fix" in signatures.explain(PE_DIM_TEXT)


def test_found_inside_a_server_log_line():
    log = (
        f"(EngineCore pid=812) ERROR 11-30 12:01:02 [core.py:710] ValueError: {SM120_TEXT}\n  more"
    )
    assert signatures.match(log).name == "sparse-block-tables-width"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "device must be a cuda device",
        "Expected head dim 576 for query and kv_cache, got 512 and 576",
    ],
)
def test_unrelated_text_is_not_explained(text):
    assert signatures.match(text) is None and signatures.explain(text) is None


def test_raise_if_known_wraps_and_chains():
    original = ValueError(SM120_TEXT)
    with pytest.raises(signatures.KnownFailure) as info:
        signatures.raise_if_known(original, "flashinfer-sm120")
    err = info.value
    assert err.__cause__ is original and err.signature == "sparse-block-tables-width"
    assert str(err).startswith(f"flashinfer-sm120: {SM120_TEXT} [sparse-block-tables-width: ")


def test_raise_if_known_leaves_other_errors_alone():
    signatures.raise_if_known(RuntimeError("CUDA error: out of memory"), "x")  # returns, no raise
    already = signatures.KnownFailure("x", SM120_TEXT, "sparse-block-tables-width", "why")
    signatures.raise_if_known(already, "y")  # not wrapped twice
