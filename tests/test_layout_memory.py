"""verify-layout sizes its work to the machine: the documented maximum (2**20 tokens) runs in
bounded memory because inputs, the reference writer and gatherer and the checks all work in
chunks, with exactly the results of one pass; and a case that would not fit is refused before
anything is allocated, in one line saying what fits."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from nopebench import geometry as g
from nopebench import memory, rowformat
from nopebench.checks import layout
from nopebench.cli import app
from nopebench.config import REPO_ROOT, load_model_config

GLM53 = load_model_config("glm53-flash")
LIMITS = REPO_ROOT / "results" / "reference" / "cpu-limits" / "verify-layout.json"


def stale_tail_writer(cache, kv_c, k_pe, slot_mapping, scale_format):
    tail = cache[..., g.ROPE_OFFSET :].clone()
    rowformat.write_cache(cache, kv_c, k_pe, slot_mapping, scale_format)
    cache[..., g.ROPE_OFFSET :] = tail


def reciprocal_writer(cache, kv_c, k_pe, slot_mapping, scale_format):
    """Multiplies by 1 / scale: wrong in a few bytes of a few rows, spread over the case."""
    scales = rowformat.tile_scales(kv_c, scale_format)
    x = kv_c.float().reshape(-1, g.N_TILES, g.TILE) * (1.0 / scales).unsqueeze(-1)
    latent = x.clamp(-g.FP8_MAX, g.FP8_MAX).to(torch.float8_e4m3fn).view(-1, g.LATENT_DIM)
    rowformat.write_cache(cache, kv_c, k_pe, slot_mapping, scale_format)
    keep = slot_mapping >= 0
    flat = cache.view(-1, cache.shape[-1])
    flat[slot_mapping[keep].long(), : g.SCALE_OFFSET] = latent.view(torch.uint8)[keep]


def scramble_gatherer(cache, *args):
    out = rowformat.gather_upconvert(cache, *args)
    out[::97, 3] = out[::97, 3] + 1  # a wrong lane in every 97th gathered row
    return out


@pytest.mark.parametrize(
    "writer, gatherer, rope",
    [
        (rowformat.write_cache, rowformat.gather_upconvert, 0),
        (rowformat.write_cache, rowformat.gather_upconvert, 64),
        (stale_tail_writer, rowformat.gather_upconvert, 0),
        (reciprocal_writer, rowformat.gather_upconvert, 0),
        (rowformat.write_cache, scramble_gatherer, 64),
    ],
    ids=["reference-nope", "reference-rope", "stale-tail", "reciprocal", "bad-gather"],
)
def test_chunked_checks_give_exactly_the_one_pass_results(monkeypatch, writer, gatherer, rope):
    """Chunks of 37 checked tokens and 50 packed rows against one pass over all 700: the same
    verdicts, row counts, worst values and first-failure details, failing checks included."""
    case = layout.LayoutCase(
        tokens=700,
        block_size=16,
        row_bytes=656,
        rope_dim=rope,
        scale_format="arbitrary_fp32",
        base_seed=5,
    )
    one_pass = layout.run_case(case, writer, gatherer)
    monkeypatch.setattr(layout, "CHECK_CHUNK", 37)
    monkeypatch.setattr(rowformat, "CPU_CHUNK_ROWS", 50)
    chunked = layout.run_case(case, writer, gatherer)
    assert chunked == one_pass
    if writer is not rowformat.write_cache or gatherer is not rowformat.gather_upconvert:
        assert not all(r.passed for r in chunked)  # the broken ones really fail


def test_chunked_generation_draws_what_one_call_does_up_to_a_chunk():
    """Every case of up to GEN_CHUNK tokens (the sweep's and the default) keeps its values."""
    for tokens in (1, 300, layout.GEN_CHUNK):
        out = torch.empty(tokens, g.LATENT_DIM, dtype=torch.bfloat16)
        layout.adversarial_latent_into(out, torch.Generator().manual_seed(9))
        whole = layout.adversarial_latent(tokens, torch.Generator().manual_seed(9))
        assert torch.equal(out.view(torch.int16), whole.view(torch.int16))


def test_reference_writer_and_gatherer_are_the_same_in_chunks(monkeypatch):
    case = layout.LayoutCase(
        tokens=500, block_size=16, row_bytes=656, rope_dim=64, scale_format="pow2_fp32"
    )
    inputs = layout.make_inputs(case)

    def write_and_gather():
        _, cache = layout.guarded_cache(inputs.num_blocks, 16, 656, "cpu")
        rowformat.write_cache(cache, inputs.kv_c, inputs.k_pe, inputs.slot_mapping, "pow2_fp32")
        out = rowformat.gather_upconvert(
            cache, inputs.block_table, inputs.workspace_starts, inputs.total_rows, 64,
            inputs.seq_starts,
        )  # fmt: skip
        return cache.clone(), out

    cache_one, out_one = write_and_gather()
    monkeypatch.setattr(rowformat, "CPU_CHUNK_ROWS", 33)
    cache_chunked, out_chunked = write_and_gather()
    assert torch.equal(cache_one, cache_chunked)
    assert torch.equal(out_one.view(torch.int16), out_chunked.view(torch.int16))


def test_the_documented_maximum_is_the_command_line_maximum():
    result = CliRunner().invoke(app, ["verify-layout", "--tokens", str(layout.MAX_TOKENS + 1)])
    assert result.exit_code == 2 and f"less than or equal to {layout.MAX_TOKENS}" in result.stderr
    assert "--tokens 1048576" in (REPO_ROOT / "README.md").read_text()


def test_the_estimate_covers_the_measured_peak_of_the_documented_maximum():
    """The committed measurement (peak RSS of `verify-layout --tokens 1048576`, /usr/bin/time -v)
    stays under what the bound assumes, and under the cases measured beside it."""
    record = json.loads(LIMITS.read_text())
    assert record["tokens"] == layout.MAX_TOKENS and record["exit_code"] == 0
    for point in record["peaks"]:
        case = layout.model_case(GLM53, point["tokens"])
        assert point["peak_rss_bytes"] < layout.memory_bytes(case), point


def test_a_case_that_does_not_fit_is_refused_before_allocation(monkeypatch, tmp_path):
    have = 2 << 30  # a 2 GiB machine

    def allocated(*args, **kwargs):
        raise AssertionError("the inputs were allocated before the memory check")

    monkeypatch.setattr(memory, "available_bytes", lambda: have)
    monkeypatch.setattr(layout, "make_inputs", allocated)
    result = CliRunner().invoke(
        app, ["verify-layout", "--tokens", "1048576", "--results-dir", str(tmp_path)]
    )
    assert result.exit_code == 3  # this machine cannot run that
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    fits = layout.tokens_that_fit(layout.model_case(GLM53, 1), have)
    assert line == (
        "nopebench: error: verify-layout --tokens 1048576 needs about 4.8 GiB of memory and "
        f"2.0 GiB is available; at most --tokens {fits} fits"
    )
    assert 0 < fits < 1048576
    assert layout.memory_bytes(layout.model_case(GLM53, fits)) <= have
    assert layout.memory_bytes(layout.model_case(GLM53, fits + 1)) > have
    assert not (tmp_path / "verify-layout").exists()


def test_the_sweep_is_bounded_too(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 30)
    monkeypatch.setattr(layout, "make_inputs", lambda *a, **k: pytest.fail("allocated"))
    result = CliRunner().invoke(app, ["verify-layout", "--sweep"])
    assert result.exit_code == 3
    assert "verify-layout --sweep needs about" in result.stderr
    assert "its largest case has 65536 tokens" in result.stderr


def test_available_memory_reads_this_machine():
    have = memory.available_bytes()
    assert have is None or have > 0
