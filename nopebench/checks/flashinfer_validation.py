"""FlashInfer's own argument validation of the two sparse page-table sizings, without a GPU.

FlashInfer's SM120 sparse path validates every argument before any device work. Called with
CPU tensors (flashinfer-python 0.7.2.post1):

- the pre-fix sizing (sparse_mla_top_k = index_topk = 2048 with a [512, 1, 2176] buffer) is
  rejected with `ValueError: SM120 sparse MLA v32/GLM expects sparse block_tables shape
  (512, 1, 2048), got (512, 1, 2176)`;
- the fixed sizing (2176) passes every check of `_trtllm_batch_decode_sparse_mla_v32_sm120`
  (layout, dtypes, block_tables shape, kv_cache row size, seq_lens) and reaches the runner
  `_trtllm_batch_decode_sparse_mla_sm120`, whose first statement, `is_sm12x_supported(device)`,
  raises `ValueError: device must be a cuda device` from `get_compute_capability`. Exactly that
  exception, raised from inside that runner, is what counts as "passed all argument validation".

Both the public entry point (`trtllm_batch_decode_with_kv_cache_mla(backend="sparse")`, what a
serving backend calls) and the private validator itself are exercised; the private one is
guarded by version and presence and reported as skipped when missing, never a crash. The SM100
trtllm-gen shape check (`_check_trtllm_gen_mla_shape`, pure shape logic) is run the same way.
On an SM120 GPU the public call runs the real kernel on CUDA tensors instead.
"""

from __future__ import annotations

import inspect
import traceback
from dataclasses import dataclass, field

import torch

from nopebench import environment, signatures
from nopebench import geometry as g
from nopebench.config import ModelConfig
from nopebench.impls.metadata import PageTableSizing

DEVICE_STOP_MESSAGE = "device must be a cuda device"
DEVICE_STOP_FRAME = "_trtllm_batch_decode_sparse_mla_sm120"  # the runner the validator hands to
PRIVATE_VALIDATOR = "_trtllm_batch_decode_sparse_mla_v32_sm120"
TRTLLM_GEN_SHAPE_CHECK = "_check_trtllm_gen_mla_shape"
MIN_VERSION = (0, 7, 0)  # GLM53_NOPE first shipped in 0.7.0
VALIDATION_TOKENS = 512  # the batch of the upstream error message
CACHE_BLOCKS = 8
BLOCK_SIZE = 64
SM120_WORKSPACE_BYTES = 512 << 20


@dataclass(frozen=True)
class Layout:
    """One query/cache layout FlashInfer's SM120 path distinguishes."""

    name: str
    rope_dim: int
    kv_scale_format: str

    @property
    def qk_dim(self) -> int:
        return g.qk_dim(self.rope_dim)


def layouts_for(cfg: ModelConfig) -> list[Layout]:
    """The layouts a model is served with: NoPE models natively (GLM53_NOPE) and through the
    576-wide zero-padded shim (GLM_NSA); RoPE models by their scale format."""
    if cfg.nope:
        return [
            Layout("GLM53_NOPE", 0, "arbitrary_fp32"),
            Layout("GLM_NSA shim", g.ROPE_DIM, "arbitrary_fp32"),
        ]
    name = "GLM_NSA" if cfg.kv_scale_format == "arbitrary_fp32" else "DSV3_2"
    return [Layout(name, g.ROPE_DIM, cfg.kv_scale_format)]


@dataclass(frozen=True)
class Outcome:
    """What one FlashInfer entry point did with one sizing."""

    entry: str
    status: str  # "accepted", "rejected" or "skipped"
    message: str
    kernel_ran: bool = False


@dataclass(frozen=True)
class SizingVerdict:
    layout: Layout
    sizing: PageTableSizing
    expected: str  # "accepted", or the exact rejection text
    outcomes: list[Outcome] = field(default_factory=list)
    passed: bool | None = None  # None: skipped
    detail: str = ""


def flashinfer_version() -> str | None:
    return environment.package_version("flashinfer-python")


def _core():
    """flashinfer.mla._core, or None when FlashInfer cannot be imported here."""
    try:
        from flashinfer.mla import _core
    except Exception:
        return None
    return _core


def expected_sm120_rejection(
    sizing: PageTableSizing, tokens: int = VALIDATION_TOKENS
) -> str | None:
    """FlashInfer's exact error text for a sizing that does not fit its buffer, else None."""
    if sizing.mismatch() is None:
        return None
    return (
        f"SM120 sparse MLA v32/GLM expects sparse block_tables shape "
        f"{sizing.block_tables_shape(tokens)}, got {(tokens, 1, sizing.buffer_width)}"
    )


def _on_sm120_gpu() -> bool:
    return environment.gpu_info().get("sm") in (120, 121)


def _sm120_kwargs(
    layout: Layout, heads: int, sizing: PageTableSizing, device: torch.device
) -> dict:
    """Arguments of one decode step as the fixed or pre-fix backend would pass them."""
    tokens = VALIDATION_TOKENS
    block_tables = torch.full(
        (tokens, 1, sizing.buffer_width), -1, dtype=torch.int32, device=device
    )
    block_tables[:, 0, 0] = torch.arange(tokens, device=device, dtype=torch.int32) % (
        CACHE_BLOCKS * BLOCK_SIZE
    )
    workspace_bytes = SM120_WORKSPACE_BYTES if device.type == "cuda" else 16
    return dict(
        query=torch.zeros(tokens, 1, heads, layout.qk_dim, dtype=torch.bfloat16, device=device),
        kv_cache=torch.zeros(
            CACHE_BLOCKS, BLOCK_SIZE, g.FULL_ROW_BYTES, dtype=torch.uint8, device=device
        ),
        workspace_buffer=torch.zeros(workspace_bytes, dtype=torch.uint8, device=device),
        qk_nope_head_dim=256 if layout.rope_dim == 0 else 128,
        kv_lora_rank=g.LATENT_DIM,
        qk_rope_head_dim=layout.rope_dim,
        block_tables=block_tables,
        seq_lens=None,
        sparse_mla_top_k=sizing.sparse_mla_top_k,
        bmm1_scale=0.0625,
        bmm2_scale=1.0,
        kv_scale_format=layout.kv_scale_format,
    )


def classify_sm120(exc: BaseException) -> Outcome:
    """Accepted when the exception is the first device requirement of the SM120 runner, i.e.
    every argument check before it passed; rejected otherwise."""
    frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
    if (
        isinstance(exc, ValueError)
        and str(exc) == DEVICE_STOP_MESSAGE
        and DEVICE_STOP_FRAME in frames
    ):
        return Outcome(
            "",
            "accepted",
            f"passed every argument check; stopped at the first device "
            f"requirement in {DEVICE_STOP_FRAME}: {DEVICE_STOP_MESSAGE!r}",
        )
    return Outcome("", "rejected", str(exc))


def call_public(layout: Layout, heads: int, sizing: PageTableSizing) -> Outcome:
    """trtllm_batch_decode_with_kv_cache_mla(backend="sparse"); the real kernel on an SM120 GPU."""
    entry = "trtllm_batch_decode_with_kv_cache_mla"
    try:
        from flashinfer.mla import trtllm_batch_decode_with_kv_cache_mla
    except Exception as exc:
        return Outcome(
            entry, "skipped", f"flashinfer is not importable ({type(exc).__name__}: {exc})"
        )
    on_gpu = _on_sm120_gpu()
    kwargs = _sm120_kwargs(layout, heads, sizing, torch.device("cuda" if on_gpu else "cpu"))
    try:
        trtllm_batch_decode_with_kv_cache_mla(
            **kwargs,
            max_seq_len=sizing.max_seq_len,
            backend="sparse",
            return_lse=True,
            return_lse_base="basee",
        )
    except Exception as exc:
        return _named(classify_sm120(exc), entry)
    if on_gpu:
        torch.cuda.synchronize()
    return Outcome(entry, "accepted", "ran the SM120 kernel", kernel_ran=on_gpu)


def call_private(layout: Layout, heads: int, sizing: PageTableSizing) -> Outcome:
    """FlashInfer's SM120 validator itself, on CPU tensors, guarded by version and presence."""
    entry = PRIVATE_VALIDATOR
    version = flashinfer_version()
    core = _core()
    fn = getattr(core, PRIVATE_VALIDATOR, None) if core is not None else None
    if fn is None or environment.version_numbers(version, 3) < MIN_VERSION:
        return Outcome(entry, "skipped", f"not available in flashinfer {version}")
    kwargs = _sm120_kwargs(layout, heads, sizing, torch.device("cpu"))
    extra = dict(
        out=None,
        sinks=None,
        skip_softmax_threshold_scale_factor=None,
        uses_shared_paged_kv_idx=True,
        lse=None,
        return_lse=True,
        lse_scale=1.0,
    )
    params = set(inspect.signature(fn).parameters)
    if not set(kwargs) | set(extra) <= params:
        return Outcome(entry, "skipped", f"signature changed in flashinfer {version}; not called")
    try:
        fn(**{k: v for k, v in {**kwargs, **extra}.items() if k in params})
    except Exception as exc:
        return _named(classify_sm120(exc), entry)
    return Outcome(entry, "accepted", "returned without a device requirement (unexpected on CPU)")


def call_trtllm_gen_shape(layout: Layout, heads: int, sizing: PageTableSizing) -> Outcome:
    """The SM100 trtllm-gen path's shape check (pure shape logic, runs anywhere)."""
    entry = TRTLLM_GEN_SHAPE_CHECK
    version = flashinfer_version()
    core = _core()
    fn = getattr(core, TRTLLM_GEN_SHAPE_CHECK, None) if core is not None else None
    if fn is None:
        return Outcome(entry, "skipped", f"not available in flashinfer {version}")
    tokens = VALIDATION_TOKENS
    query = torch.empty(tokens, 1, heads, layout.qk_dim, dtype=torch.bfloat16)
    kv_cache = torch.empty(CACHE_BLOCKS, BLOCK_SIZE, layout.qk_dim, dtype=torch.bfloat16)
    page_table = torch.full((tokens, 1, sizing.buffer_width), -1, dtype=torch.int32)
    try:
        fn(
            query,
            kv_cache,
            g.LATENT_DIM,
            layout.rope_dim,
            sizing.sparse_mla_top_k,
            page_table,
            BLOCK_SIZE,
        )
    except Exception as exc:
        return Outcome(entry, "rejected", str(exc))
    return Outcome(entry, "accepted", "passed the shape check")


def _named(outcome: Outcome, entry: str) -> Outcome:
    return Outcome(entry, outcome.status, outcome.message, outcome.kernel_ran)


def _matches(outcome: Outcome, sizing: PageTableSizing, expected_sm120: str | None) -> bool:
    """Whether one entry point did what the sizing predicts (skipped entries do not count)."""
    if outcome.status == "skipped":
        return True
    if expected_sm120 is None:
        return outcome.status == "accepted"
    if outcome.status != "rejected":
        return False
    if outcome.entry == TRTLLM_GEN_SHAPE_CHECK:
        sig = signatures.match(outcome.message)
        found = sig.pattern.search(outcome.message) if sig else None
        return (
            bool(found)
            and sig.name in signatures.WIDTH_SIGNATURES
            and (int(found.group(3)), int(found.group(6)))
            == (sizing.sparse_mla_top_k, sizing.buffer_width)
        )
    return outcome.message == expected_sm120


def validate_sizing(
    layout: Layout, heads: int, sizing: PageTableSizing, expect_accept: bool
) -> SizingVerdict:
    """Run every entry point on one sizing. The caller states what must happen, independently
    of the sizing under test: the backend's (fixed) sizing must be accepted everywhere; the
    pre-fix sizing must be rejected with FlashInfer's exact text (recognised by the known-failure
    signatures) exactly when kpool widens the buffer. A sizing that merely agrees with its own
    prediction is not enough: a backend that still declared index_topk would pass that."""
    expected_text = (
        None
        if expect_accept
        else (
            expected_sm120_rejection(sizing)
            or f"a rejection of sparse_mla_top_k={sizing.sparse_mla_top_k}"
        )
    )
    expected = "accepted" if expected_text is None else expected_text
    outcomes = [
        call_public(layout, heads, sizing),
        call_private(layout, heads, sizing),
        call_trtllm_gen_shape(layout, heads, sizing),
    ]
    public = outcomes[0]
    if public.status == "skipped":
        return SizingVerdict(layout, sizing, expected, outcomes, None, public.message)
    passed = all(_matches(o, sizing, expected_text) for o in outcomes)
    if expected_text is not None and public.status == "rejected":
        passed = passed and signatures.explain(public.message) is not None
    return SizingVerdict(
        layout, sizing, expected, outcomes, passed, _describe(outcomes, expected_text)
    )


def _describe(outcomes: list[Outcome], expected_text: str | None) -> str:
    """One line: what the public entry did, how the others agreed, the explanation if any."""
    public, *others = outcomes
    head = f"{public.status}: {public.message}"
    if public.status == "rejected" and (why := signatures.explain(public.message)):
        head += f" -> {why}"
    notes = []
    for o in others:
        if o.status == "skipped":
            notes.append(f"{o.entry}: skipped ({o.message})")
        elif o.status == "rejected" and o.entry == TRTLLM_GEN_SHAPE_CHECK:
            notes.append(f"{o.entry}: rejected ({o.message})")
        else:
            notes.append(f"{o.entry}: {o.status}")
    if expected_text is not None and public.message != expected_text:
        notes.append(f"expected exactly {expected_text!r}")
    return head + "; " + "; ".join(notes)
