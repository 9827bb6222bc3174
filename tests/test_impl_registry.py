"""The implementation registry and dispatch; the GPU half runs every adapter the GPU can run."""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace

import pytest
import torch

from nopebench import compare, environment, rowformat, signatures
from nopebench import geometry as g
from nopebench.checks.pagetable import build_problem, model_case
from nopebench.config import load_model_config
from nopebench.errors import UnsupportedError, UsageError
from nopebench.impls import flashinfer as flashinfer_adapters
from nopebench.impls import registry as impl_registry
from nopebench.impls.interface import DecodeOutput, ImplSpec
from nopebench.impls.reference import sparse_decode_reference

EXPECTED = [
    "reference",
    "native",
    "flashmla",
    "flashinfer-sm120",
    "flashinfer-trtllm",
    "flashinfer-fa3-bf16",
    "flashinfer-fa3-fp8",
]
H200 = {"gpu": "NVIDIA H200", "sm": 90}


def small_problem(device="cpu", rope_dim=None, tokens=4, model="glm53-flash"):
    cfg = load_model_config(model)
    case = dataclasses.replace(
        model_case(cfg, tokens, 3, rope_dim=rope_dim), topk_width=256, active=200
    )
    return build_problem(case, torch.device(device))


@pytest.fixture
def gpu_is(monkeypatch):
    def set_gpu(info):
        monkeypatch.setattr(environment, "gpu_info", lambda: info)

    return set_gpu


def test_registry_lists_every_implementation_in_order():
    registry = impl_registry.implementations()
    assert list(registry) == EXPECTED == impl_registry.names()
    assert all(isinstance(s, ImplSpec) and s.name == n for n, s in registry.items())


def test_cpu_refusals_say_a_gpu_is_needed(gpu_is):
    gpu_is({"gpu": None, "sm": None})
    problem = small_problem()
    _, refused = impl_registry.runnable(problem)
    for name in EXPECTED[2:]:
        assert refused[name].startswith(f"{name} needs a CUDA GPU")
    assert "reference" not in refused


def test_wrong_gpu_refusal_names_the_gpu_and_the_need(gpu_is):
    gpu_is(H200)
    problem = small_problem()
    registry = impl_registry.implementations()
    assert registry["flashinfer-sm120"].unsupported(problem) == (
        "flashinfer-sm120 needs an SM120/SM121 GPU (this is NVIDIA H200, SM90)"
    )
    assert registry["flashinfer-trtllm"].unsupported(problem) == (
        "flashinfer-trtllm needs an SM100/SM103 GPU (this is NVIDIA H200, SM90)"
    )
    # the right GPU, but CPU tensors: refused for that reason, in one line
    assert registry["flashinfer-fa3-bf16"].unsupported(problem) == (
        "flashinfer-fa3-bf16 runs on CUDA tensors; this problem is on cpu"
    )


def test_fa3_fp8_refuses_real_rope_lanes(monkeypatch, gpu_is):
    gpu_is(H200)
    monkeypatch.setattr(flashinfer_adapters, "device_refusal", lambda impl, problem: None)
    rope_model = small_problem(model="glm5")
    assert "non-zero RoPE lanes" in flashinfer_adapters.fa3_fp8_unsupported(rope_model)
    assert flashinfer_adapters.fa3_bf16_unsupported(rope_model) is None
    shim = small_problem(rope_dim=64)  # NoPE cache, zero-padded query
    assert flashinfer_adapters.fa3_fp8_unsupported(shim) is None


def test_sm120_refuses_nope_without_arbitrary_scales(monkeypatch, gpu_is):
    gpu_is({"gpu": "NVIDIA RTX PRO 6000", "sm": 120})
    monkeypatch.setattr(flashinfer_adapters, "device_refusal", lambda impl, problem: None)
    problem = dataclasses.replace(small_problem(), kv_scale_format="pow2_fp32")
    assert "arbitrary_fp32" in flashinfer_adapters.sm120_unsupported(problem)


def test_reference_dispatch_is_the_reference():
    problem = small_problem()
    got = impl_registry.decode(problem, "reference")
    out, lse = sparse_decode_reference(
        problem.q, problem.cache, problem.indices, problem.softmax_scale, 0
    )
    assert torch.equal(got.out, out) and torch.equal(got.lse, lse)


def test_reference_output_does_not_depend_on_row_0_for_minus_one_entries():
    """A -1 entry gathers row 0 as a stand-in: NaN bytes there (an unwritten cache slot) must not
    reach the output through the entry's zero weight, and any other bytes there change nothing."""
    from native_cases import SCALE, decode_inputs

    q, cache, idx = decode_inputs(16, 3, 96, 64, 656, "cpu", seed=5, rows=128)
    flat = cache.view(-1, 656)
    assert bool((flat[0] == 0xFF).all()) and int(idx.min()) == -1 and int(idx[idx >= 0].min()) > 0
    poisoned = sparse_decode_reference(q, cache, idx, SCALE, 64)
    flat[0] = 0x11  # finite e4m3 bytes, finite scales and RoPE lanes
    finite_row0 = sparse_decode_reference(q, cache, idx, SCALE, 64)
    assert not poisoned[0].isnan().any()
    assert torch.equal(poisoned[0], finite_row0[0]) and torch.equal(poisoned[1], finite_row0[1])


def test_unknown_and_unsupported_names(gpu_is):
    gpu_is({"gpu": None, "sm": None})
    problem = small_problem()
    with pytest.raises(UsageError, match="unknown implementation 'nope'.*reference"):
        impl_registry.decode(problem, "nope")
    with pytest.raises(UnsupportedError, match="flashinfer-fa3-fp8 needs a CUDA GPU"):
        impl_registry.decode(problem, "flashinfer-fa3-fp8")


def test_native_without_triton_is_listed_with_its_reason(monkeypatch):
    """The registry imports the native adapter directly; what it cannot run is refused in one
    line: here a CUDA GPU without the triton package."""
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    problem = SimpleNamespace(q=SimpleNamespace(is_cuda=True, device="cuda:0"))
    registry = impl_registry.implementations()
    assert registry["native"].unsupported(problem) == "native needs the triton package"
    with pytest.raises(UnsupportedError, match="native needs the triton package"):
        impl_registry.prepare(problem, "native", registry)


def _fake(name, fail_at, message):
    def prepare(problem):
        if fail_at == "prepare":
            raise ValueError(message)

        def run():
            raise ValueError(message)

        return run

    return {name: ImplSpec(name, "fake", lambda p: None, prepare)}


@pytest.mark.parametrize("fail_at", ["prepare", "run"])
def test_known_flashinfer_errors_are_translated(fail_at):
    text = (
        "SM120 sparse MLA v32/GLM expects sparse block_tables shape (4, 1, 2048), got (4, 1, 2176)"
    )
    with pytest.raises(signatures.KnownFailure, match="page-table capacity fix") as info:
        impl_registry.decode(small_problem(), "fake", _fake("fake", fail_at, text))
    assert info.value.where == "fake"


def test_unknown_errors_pass_through_unchanged():
    with pytest.raises(ValueError, match="^something else$"):
        impl_registry.decode(small_problem(), "fake", _fake("fake", "run", "something else"))


def test_fa3_fp8_cache_is_the_packed_bytes_and_per_token_tile_scales():
    """What the fp8 adapter hands FlashInfer, and that FlashInfer's documented dequantization
    (bf16(float(fp8) * ckv_scale_arr[slot, channel // 128])) is the reference's."""
    problem = small_problem()
    ckv, kpe, kwargs = flashinfer_adapters._fa3_cache(problem, fp8=True)
    rows = problem.cache.view(-1, problem.cache.shape[-1])
    n = rows.shape[0]
    scale = kwargs["ckv_scale_arr"]
    assert ckv.shape == (n, 1, 512) and ckv.dtype == torch.float8_e4m3fn and ckv.is_contiguous()
    assert scale.shape == (n, 1, 4) and scale.dtype == torch.float32 and scale.is_contiguous()
    assert kpe.shape == (n, 1, 0) and kwargs["kpe_scale"] == 1.0
    assert torch.equal(ckv.view(n, 512).view(torch.uint8), rows[:, :512])
    kernel_view = (ckv.view(n, 4, 128).to(torch.bfloat16).float() * scale.view(n, 4, 1)).to(
        torch.bfloat16
    )
    ok = torch.isfinite(scale.view(n, 4)).all(dim=1)  # the poisoned block is NaN in both
    expect, _ = rowformat.dequantize_rows(rows)
    assert torch.equal(kernel_view.view(n, 512)[ok], expect[ok])


def test_fa3_bf16_cache_is_the_dequantized_rows():
    problem = small_problem(rope_dim=64)
    ckv, kpe, kwargs = flashinfer_adapters._fa3_cache(problem, fp8=False)
    rows = problem.cache.view(-1, problem.cache.shape[-1])
    latent, rope = rowformat.dequantize_rows(rows)
    assert kwargs == {}
    bits = lambda t: t.contiguous().view(torch.int16)  # noqa: E731  (NaN rows compare by bits)
    assert torch.equal(bits(ckv.view(-1, 512)), bits(latent)) and torch.equal(
        bits(kpe.view(-1, 64)), bits(rope)
    )


# --- GPU: every adapter this GPU can run against the reference --------------------------------


def _gpu_impls():
    if not torch.cuda.is_available():
        return ["(no gpu)"]
    problem = small_problem("cuda")
    ok, _ = impl_registry.runnable(problem)
    return [s.name for s in ok if s.name != "reference"] or ["(none runnable)"]


@pytest.mark.gpu
@pytest.mark.parametrize("rope_dim", [0, 64])
@pytest.mark.parametrize("impl", _gpu_impls())
def test_gpu_adapter_matches_reference_with_padding_and_empty_rows(impl, rope_dim):
    if impl.startswith("("):
        pytest.skip("no GPU implementation runs here")
    problem = small_problem("cuda", rope_dim=rope_dim, tokens=16)
    spec = impl_registry.implementations()[impl]
    if (reason := spec.unsupported(problem)) is not None:
        pytest.skip(reason)
    got = impl_registry.decode(problem, impl)
    torch.cuda.synchronize()
    ref_out, ref_lse = sparse_decode_reference(
        problem.q, problem.cache, problem.indices, problem.softmax_scale, rope_dim
    )
    cmp = compare.close(got.out, ref_out, **spec.tolerance.kwargs())
    assert cmp.passed, cmp.detail
    empty = (problem.indices < 0).all(dim=1)
    assert empty.any() and float(got.out[empty].abs().max()) == 0.0
    if got.lse is not None:  # natural log, rows with entries (empty rows differ by kernel)
        valid = ~empty
        assert torch.allclose(got.lse[valid], ref_lse[valid], atol=1e-2, rtol=1e-3)


@pytest.mark.gpu
def test_gpu_closure_output_is_rewritten_every_call():
    problem = small_problem("cuda", tokens=8)
    for spec in impl_registry.runnable(problem)[0]:
        run = impl_registry.prepare(problem, spec.name)
        first = run()
        first.out.fill_(float("nan"))
        second = run()
        torch.cuda.synchronize()
        assert isinstance(second, DecodeOutput) and bool(torch.isfinite(second.out).all()), (
            spec.name
        )
        assert second.out.shape == (8, problem.heads, g.LATENT_DIM)
