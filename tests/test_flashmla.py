"""The flashmla adapter without a GPU: its refusal lines, the widening of compact rows, and the
query and head padding, against a fake FlashMLA at the kernel boundary that computes the
reference over exactly what it is handed (656-byte rows, 576-wide queries, 64 or 128 heads)."""

from __future__ import annotations

import dataclasses
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from nopebench import compare, environment, rowformat
from nopebench import geometry as g
from nopebench.checks.pagetable import build_problem, model_case
from nopebench.config import load_model_config
from nopebench.errors import UnsupportedError
from nopebench.impls import flashmla
from nopebench.impls import registry as impl_registry
from nopebench.impls.reference import sparse_decode_reference

H200 = {"gpu": "NVIDIA H200", "sm": 90}
WIDEN, PAD = flashmla.widen_rows, flashmla.padded_query  # the real ones, before any patching


@pytest.fixture
def gpu_is(monkeypatch):
    def set_gpu(info):
        monkeypatch.setattr(environment, "gpu_info", lambda: info)

    return set_gpu


@pytest.fixture
def no_flashmla(monkeypatch):
    """Neither source imports: `import flash_mla` and `import vllm` raise ImportError."""
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    monkeypatch.setitem(sys.modules, "vllm", None)
    flashmla._load.cache_clear()
    yield
    flashmla._load.cache_clear()


class FakeFlashMLA:
    """FlashMLA's interface as the adapter calls it. It checks what the real kernel requires and
    computes the reference over the 656-byte rows and 576-wide queries it is given; rows with
    no valid entry get NaN outputs (undefined, as vLLM treats them) and lse +inf (FlashMLA's
    convention), and lse is laid out [1, heads, T] as the interface documents."""

    def __init__(self):
        self.calls = 0
        self.metas: list[SimpleNamespace] = []

    def get_mla_metadata(self, *args, **kwargs):
        meta = SimpleNamespace(have_initialized=False)
        self.metas.append(meta)
        return meta, None

    def flash_mla_with_kvcache(
        self,
        q,
        k_cache,
        block_table,
        cache_seqlens,
        head_dim_v,
        tile_scheduler_metadata,
        num_splits=None,
        softmax_scale=None,
        causal=False,
        is_fp8_kvcache=False,
        indices=None,
        out=None,
    ):
        batch, tokens, heads, dim = q.shape
        if heads not in (64, 128):
            raise RuntimeError(f"Unsupported h_q: {heads}")
        assert batch == 1 and dim == 576 and q.dtype == torch.bfloat16, q.shape
        assert k_cache.dtype == torch.float8_e4m3fn and k_cache.dim() == 4
        assert k_cache.shape[2] == 1 and k_cache.shape[3] == g.FULL_ROW_BYTES
        assert indices.shape == (1, tokens, indices.shape[-1]) and indices.dtype == torch.int32
        assert indices.shape[-1] % 64 == 0, "FlashMLA asserts topk % TOPK_BLOCK_SIZE == 0"
        assert is_fp8_kvcache and not causal and head_dim_v == 512 and num_splits is None
        assert block_table is None and cache_seqlens is None
        assert out.shape == (1, tokens, heads, 512) and out.is_contiguous()
        tile_scheduler_metadata.have_initialized = True
        self.calls += 1
        rows = k_cache.view(torch.uint8).squeeze(-2)
        o, lse = sparse_decode_reference(q[0], rows, indices[0], softmax_scale, g.ROPE_DIM)
        empty = (indices[0] < 0).all(dim=1)
        o[empty] = math.nan
        lse[empty] = math.inf
        out[0].copy_(o)
        return out, lse.transpose(0, 1).unsqueeze(0).contiguous()


@pytest.fixture
def fake(monkeypatch):
    kernel = FakeFlashMLA()
    lib = flashmla.FlashMLA("fake", "0", kernel.get_mla_metadata, kernel.flash_mla_with_kvcache)
    monkeypatch.setattr(flashmla, "_load", lambda: (lib, None))
    return kernel


def problem(heads=16, row_bytes=528, rope_dim=0, real_rope=False, tokens=6, seed=0, device="cpu"):
    cfg = load_model_config("glm53-flash")
    case = dataclasses.replace(
        model_case(cfg, tokens, seed, rope_dim=rope_dim),
        heads=heads,
        row_bytes=row_bytes,
        real_rope=real_rope,
        topk_width=256,
        active=200,
    )
    return build_problem(case, torch.device(device))


def check_against_reference(p, fake_kernel):
    run = flashmla.flashmla_prepare(p)
    assert fake_kernel.calls == 1 and fake_kernel.metas[-1].have_initialized  # before any capture
    got = run()
    ref_out, ref_lse = sparse_decode_reference(p.q, p.cache, p.indices, p.softmax_scale, p.rope_dim)
    return got, ref_out, ref_lse


# --- refusals ------------------------------------------------------------------------------------


def test_refused_without_a_gpu(gpu_is):
    gpu_is({"gpu": None, "sm": None})
    assert flashmla.flashmla_unsupported(problem()) == (
        "flashmla needs a CUDA GPU (an SM90 (Hopper) or SM100 GPU); none is visible"
    )


def test_refused_on_the_wrong_sm(gpu_is):
    gpu_is({"gpu": "NVIDIA RTX PRO 6000", "sm": 120})
    assert flashmla.flashmla_unsupported(problem()) == (
        "flashmla needs an SM90 (Hopper) or SM100 GPU (this is NVIDIA RTX PRO 6000, SM120)"
    )


def test_refused_in_one_line_when_no_flashmla_imports(gpu_is, monkeypatch, no_flashmla):
    gpu_is(H200)
    monkeypatch.setattr(flashmla, "device_refusal", lambda impl, p: None)
    reason = flashmla.flashmla_unsupported(problem())
    assert reason.startswith(
        "flashmla needs FlashMLA: install flash-mla or vLLM (vllm._flashmla_C); "
    )
    assert "flash_mla: " in reason and "vllm._flashmla_C: " in reason and "\n" not in reason
    with pytest.raises(UnsupportedError, match="flashmla needs FlashMLA"):
        impl_registry.prepare(problem(), "flashmla")
    assert flashmla.flashmla_library() == ("flash-mla or vllm", None)


def test_an_interface_without_sched_meta_is_refused(gpu_is, monkeypatch):
    """An installed flash_mla with the older interface (no FlashMLASchedMeta) is not called."""
    gpu_is(H200)
    monkeypatch.setattr(flashmla, "device_refusal", lambda impl, p: None)
    old = SimpleNamespace(get_mla_metadata=None, flash_mla_with_kvcache=None)
    monkeypatch.setitem(sys.modules, "flash_mla", old)
    monkeypatch.setitem(sys.modules, "vllm", None)
    flashmla._load.cache_clear()
    try:
        reason = flashmla.flashmla_unsupported(problem())
    finally:
        flashmla._load.cache_clear()
    assert "flash_mla lacks FlashMLASchedMeta" in reason


def test_more_than_128_heads_is_refused(gpu_is, monkeypatch, fake):
    gpu_is(H200)
    monkeypatch.setattr(flashmla, "device_refusal", lambda impl, p: None)
    wide = SimpleNamespace(heads=160)
    assert flashmla.flashmla_unsupported(wide) == "flashmla: at most 128 heads, got 160"


def test_registry_entry_names_its_serving_backend():
    spec = impl_registry.implementations()["flashmla"]
    assert spec.serving_backend == "vLLM FLASHMLA_SPARSE" and spec.is_deployable
    assert spec.tolerance is flashmla.FLASHMLA_TOLERANCE and spec.tolerance.name == "flashmla"


# --- widening and padding ------------------------------------------------------------------------


def test_widening_copies_528_bytes_zeroes_the_tail_and_keeps_the_poison():
    p = problem()
    compact = p.cache
    wide = flashmla.widen_rows(compact)
    assert wide.shape == (*compact.shape[:2], 656) and wide.dtype == torch.uint8
    assert torch.equal(wide[..., :528], compact)
    poisoned = (compact == 0xFF).all(dim=-1)  # the last block: never written
    assert poisoned.any() and not poisoned.all()
    assert bool((wide[..., 528:][poisoned] == 0xFF).all())
    assert bool((wide[..., 528:][~poisoned] == 0).all())
    with pytest.raises(ValueError, match="compact rows"):
        flashmla.widen_rows(wide)


def test_widening_happens_once_per_cache(monkeypatch, fake):
    widened = []
    monkeypatch.setattr(flashmla, "widen_rows", lambda c: widened.append(1) or WIDEN(c))
    p = problem()
    flashmla.flashmla_prepare(p)
    flashmla.flashmla_prepare(dataclasses.replace(p, q=p.q.flip(0)))  # another set, same cache
    assert len(widened) == 1
    flashmla.flashmla_prepare(problem(seed=1))  # another cache
    assert len(widened) == 2


@pytest.mark.parametrize("heads, padded", [(16, 64), (64, 64), (100, 128), (128, 128)])
def test_padded_heads(heads, padded):
    assert flashmla.padded_heads(heads) == padded


def test_kernel_line_names_padded_heads_and_rows():
    """Result rows say what FlashMLA ran for the cell: its padded head count and the rows."""
    spec = flashmla.flashmla_spec()
    assert spec.kernel(problem(heads=16)) == (
        "sparse fp8 decode at 64 heads (48 of them zero queries), 576-wide queries, "
        "528-byte rows widened to 656"
    )
    assert spec.kernel(problem(heads=128, row_bytes=656, rope_dim=64)) == (
        "sparse fp8 decode at 128 heads, 576-wide queries, 656-byte rows"
    )


@pytest.mark.parametrize(
    "heads, row_bytes, rope_dim, real_rope",
    [
        (16, 528, 0, False),  # NoPE, compact rows: widened, q padded to 576 and to 64 heads
        (100, 528, 0, False),  # heads padded to 128
        (64, 656, 0, True),  # NoPE over 656-byte rows with real RoPE tails: q's lanes must be 0
        (16, 656, 64, False),  # the zero-padded shim as is
        (16, 656, 64, True),  # a RoPE model: FlashMLA's own layout
    ],
)
def test_fake_kernel_matches_the_reference(fake, heads, row_bytes, rope_dim, real_rope):
    p = problem(heads, row_bytes, rope_dim, real_rope)
    got, ref_out, ref_lse = check_against_reference(p, fake)
    assert got.out.shape == (p.tokens, heads, 512)
    cmp = compare.close(got.out, ref_out)
    assert cmp.passed, cmp.detail
    empty = (p.indices < 0).all(dim=1)
    assert empty.any() and float(got.out[empty].abs().max()) == 0.0  # NaN from the kernel fixed
    assert bool(torch.isneginf(got.lse[empty]).all())  # +inf from the kernel, -inf as reference
    assert torch.allclose(got.lse[~empty], ref_lse[~empty], atol=1e-5, rtol=1e-6)
    again = fake.calls
    run_twice = flashmla.flashmla_prepare(p)
    run_twice().out.fill_(math.nan)
    assert bool(torch.isfinite(run_twice().out).all()) and fake.calls == again + 3


def _misaligned(cache):  # the scales copied one byte late: every dequantized value is wrong
    wide = WIDEN(cache)
    wide[..., 513:529] = cache[..., 512:528]
    return wide


def _poisoned_tails(cache):  # tails left as 0xFF: NaN RoPE lanes, which even zero q lanes meet
    wide = WIDEN(cache)
    wide[..., 528:] = 0xFF
    return wide


@pytest.mark.parametrize("broken", [_misaligned, _poisoned_tails])
def test_a_wrong_widening_is_caught(monkeypatch, fake, broken):
    monkeypatch.setattr(flashmla, "widen_rows", broken)
    got, ref_out, _ = check_against_reference(problem(), fake)
    assert not compare.close(got.out, ref_out).passed


def _half_lanes(q, padded):  # the 64 lanes past a NoPE query left at 0.5, not zero
    full = PAD(q, padded)
    full[..., q.shape[-1] :] = 0.5
    return full


def _heads_at_the_end(q, padded):  # the real heads placed last instead of first
    full = torch.zeros(1, q.shape[0], padded, 576, dtype=torch.bfloat16)
    full[0, :, padded - q.shape[1] :, : q.shape[-1]] = q
    return full


@pytest.mark.parametrize("broken", [_half_lanes, _heads_at_the_end])
def test_a_wrong_query_padding_is_caught(monkeypatch, fake, broken):
    """With real RoPE tails in the rows, lanes that were not zero would add q_pe . k_pe to every
    score; heads out of place would be sliced back from the padding."""
    monkeypatch.setattr(flashmla, "padded_query", broken)
    got, ref_out, _ = check_against_reference(problem(16, 656, 0, True), fake)
    assert not compare.close(got.out, ref_out).passed


def test_unpadded_heads_are_refused_by_the_kernel(monkeypatch, fake):
    monkeypatch.setattr(flashmla, "padded_heads", lambda heads: heads)
    with pytest.raises(RuntimeError, match="Unsupported h_q: 16"):
        flashmla.flashmla_prepare(problem())


def test_lse_in_either_layout_or_none():
    lse = torch.arange(1 * 64 * 5, dtype=torch.float32).view(1, 64, 5)
    heads_major = flashmla._lse_per_token(lse, 5, 64, 16)
    assert heads_major.shape == (5, 16) and heads_major[2, 3] == lse[0, 3, 2]
    tokens_major = flashmla._lse_per_token(lse.view(1, 5, 64), 5, 64, 16)
    assert tokens_major.shape == (5, 16) and tokens_major[2, 3] == lse.view(1, 5, 64)[0, 2, 3]
    assert flashmla._lse_per_token(lse.view(64, 5), 5, 64, 16) is None
    assert flashmla._lse_per_token(None, 5, 64, 16) is None


# --- the accuracy class: FlashMLA's arithmetic, modelled on the CPU ---------------------------


def bf16_scale_rows(rows):
    """FlashMLA's dequantization: each fp8 value times its tile scale rounded to bf16 (the
    reference multiplies by the fp32 scale), the product rounded to bf16."""
    latent, scales, rope = rowformat.split_rows(rows)
    tiles = latent.float().to(torch.bfloat16).view(-1, g.N_TILES, g.TILE)
    values = tiles * scales.to(torch.bfloat16).unsqueeze(-1)
    return values.view(-1, g.LATENT_DIM), rope


def bf16_scale_reference(p):
    """The reference over the cache as FlashMLA dequantizes it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rowformat, "dequantize_rows", bf16_scale_rows)
        return sparse_decode_reference(p.q, p.cache, p.indices, p.softmax_scale, p.rope_dim)


# the GPU tests' shapes (heads, tokens), and the one with the largest LSE error measured there
MODEL_SHAPES = [(16, 16), (64, 16), (100, 128), (64, 200)]


@pytest.mark.parametrize("heads, tokens", MODEL_SHAPES)
@pytest.mark.parametrize("row_bytes, rope_dim, real_rope", [(528, 0, False), (656, 64, True)])
def test_bf16_scales_need_flashmlas_class_and_stay_inside_it(
    heads, tokens, row_bytes, rope_dim, real_rope
):
    """Rounding the tile scales to bf16 is enough to leave the strict class (cosine), and the
    accuracy class FlashMLA is given holds that arithmetic on the GPU tests' problems, LSE
    included."""
    p = problem(heads, row_bytes, rope_dim, real_rope, tokens=tokens)
    model_out, model_lse = bf16_scale_reference(p)
    ref_out, ref_lse = sparse_decode_reference(p.q, p.cache, p.indices, p.softmax_scale, p.rope_dim)
    tol = flashmla.FLASHMLA_TOLERANCE
    assert not compare.close(model_out, ref_out).passed
    cmp = compare.close(model_out, ref_out, **tol.kwargs())
    assert cmp.passed, cmp.detail
    valid = ~(p.indices < 0).all(dim=1)
    lse_err = float((model_lse[valid] - ref_lse[valid]).abs().max())
    assert 1e-3 < lse_err <= tol.lse_abs_tol, lse_err


def test_power_of_two_scales_are_exact_in_bf16():
    """Where the scales are powers of two, FlashMLA's dequantization is the reference's."""
    cfg = load_model_config("glm53-flash")
    case = dataclasses.replace(
        model_case(cfg, 6, 0, rope_dim=0),
        heads=16,
        topk_width=256,
        active=200,
        kv_scale_format=g.POW2_FP32,
    )
    p = build_problem(case, torch.device("cpu"))
    model_out, model_lse = bf16_scale_reference(p)
    ref_out, ref_lse = sparse_decode_reference(p.q, p.cache, p.indices, p.softmax_scale, p.rope_dim)
    assert torch.equal(model_out, ref_out) and torch.equal(model_lse, ref_lse)


# --- GPU: the real FlashMLA against the reference ---------------------------------------------

LAYOUTS = [(528, 0, False), (656, 0, False), (656, 64, False), (656, 64, True)]


def _gpu_problem(heads, row_bytes, rope_dim, real_rope, tokens=16):
    p = problem(heads, row_bytes, rope_dim, real_rope, tokens=tokens, device="cuda")
    reason = impl_registry.implementations()["flashmla"].unsupported(p)
    if reason is not None:
        pytest.skip(reason)
    return p


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads, tokens",
    # tokens equal to the padded head count (64, 128) make lse's two layouts the same shape
    [(16, 16), (64, 16), (128, 16), (16, 64), (100, 128)],
)
@pytest.mark.parametrize("row_bytes, rope_dim, real_rope", LAYOUTS)
def test_gpu_flashmla_matches_the_reference(heads, tokens, row_bytes, rope_dim, real_rope):
    p = _gpu_problem(heads, row_bytes, rope_dim, real_rope, tokens)
    got = impl_registry.decode(p, "flashmla")
    torch.cuda.synchronize()
    ref_out, ref_lse = sparse_decode_reference(p.q, p.cache, p.indices, p.softmax_scale, p.rope_dim)
    cmp = compare.close(got.out, ref_out, **flashmla.FLASHMLA_TOLERANCE.kwargs())
    assert cmp.passed, cmp.detail
    empty = (p.indices < 0).all(dim=1)
    assert empty.any() and float(got.out[empty].abs().max()) == 0.0
    assert got.lse is not None, "FlashMLA's lse was not in a documented layout"
    assert bool(torch.isneginf(got.lse[empty]).all())
    tol = flashmla.FLASHMLA_TOLERANCE.lse_abs_tol
    assert torch.allclose(got.lse[~empty], ref_lse[~empty], atol=tol, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("heads, tokens", MODEL_SHAPES)
@pytest.mark.parametrize("row_bytes, rope_dim, real_rope", [(528, 0, False), (656, 64, True)])
def test_gpu_flashmla_is_the_reference_over_bf16_scales(
    heads, tokens, row_bytes, rope_dim, real_rope
):
    """The measured accuracy class has one cause: against the reference over bf16-rounded tile
    scales FlashMLA meets the strict rule's cosine, all but at most one element in a million its
    element rule (one bf16 step apart near 1: its bf16 probabilities), and its LSE agrees to
    1e-4."""
    p = _gpu_problem(heads, row_bytes, rope_dim, real_rope, tokens)
    got = impl_registry.decode(p, "flashmla")
    torch.cuda.synchronize()
    model_out, model_lse = bf16_scale_reference(p)
    cmp = compare.close(got.out, model_out, max_mismatch=1e-6)
    valid = ~(p.indices < 0).all(dim=1)
    lse_err = float((got.lse[valid] - model_lse[valid]).abs().max())
    assert cmp.passed and lse_err <= 1e-4, (cmp.detail, lse_err)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_gpu_flashmla_replays_in_a_cuda_graph(heads):
    from nopebench.checks.pagetable import capture_replay

    p = _gpu_problem(heads, 528, 0, False, tokens=64)
    registry = impl_registry.implementations()
    ref_out, _ = sparse_decode_reference(p.q, p.cache, p.indices, p.softmax_scale, p.rope_dim)
    result = capture_replay(registry["flashmla"], p, registry, ref_out)
    assert result["result"] == "passed", result["detail"]


def test_index_rows_are_padded_to_flashmlas_block(fake):
    """check-pagetable's compact problems have index rows as wide as their valid entries (2051
    for the model): FlashMLA refuses a top-k width that is not a multiple of its block (the fake
    asserts it too), so the adapter pads with -1 and the answer stays the reference's."""
    p = problem(heads=16)
    p = dataclasses.replace(p, indices=p.indices[:, :201].contiguous())
    got, ref_out, ref_lse = check_against_reference(p, fake)
    assert compare.close(got.out, ref_out).passed
