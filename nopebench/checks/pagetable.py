"""`nopebench check-pagetable`: the sparse page table is sized by the top-k buffer width.

Checks, one row each:
- width math for the model, and the index_topk x kpool grid;
- FlashInfer's own SM120 argument validation of the pre-fix and fixed sizings (CPU tensors;
  the real kernel on an SM120 GPU), see flashinfer_validation;
- -1 padding bounds the active length: decode over the widened buffer (active entries, -1
  tail) equals decode over exactly the valid entries; rows with no valid entry give zeros;
  shuffling where the -1 entries sit changes nothing. Run with the reference (small sizes on
  CPU) and, on a GPU, with every registry implementation the GPU can run;
- CUDA-graph capture and replay of a batch-512 decode at the widened width (GPU only): the
  upstream failure happened at capture;
- the DeepSeek-V3.2 control: width == index_topk, both sizings agree, FlashInfer accepts it.
Exit 0 only when every check that ran passed; checks this machine cannot run are skipped.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nopebench import compare, rowformat, signatures
from nopebench import console as out
from nopebench import geometry as g
from nopebench.checks import flashinfer_validation
from nopebench.config import ModelConfig, load_model_config
from nopebench.impls import metadata
from nopebench.impls import registry as impl_registry
from nopebench.impls.interface import DecodeOutput, DecodeProblem, ImplSpec

CONTROL_MODEL = "dsv32"
GRID_TOPK = (512, 1024, 2048)
GRID_KPOOL = (1, 4, 16)
CPU_QUERY_TOKENS = 8  # seconds on 2 CPU cores at W = 2176, 16 heads
GPU_QUERY_TOKENS = 64
GRAPH_QUERY_TOKENS = 512  # the batch of the upstream capture failure
EMPTY_ROWS = 2  # trailing rows with no valid entry
REQUESTS = 2  # requests sharing the query tokens, each with its own shuffled block table
POISON = rowformat.POISON_BYTE


@dataclass(frozen=True)
class PaddingCase:
    """One decode step with a -1 padded top-k buffer. `active` valid entries per row, then -1;
    the last `empty_rows` rows have none. `real_rope`: the cache holds random RoPE lanes (a RoPE
    model); otherwise RoPE lanes and, for rope_dim 64 (the shim), the query's last 64 are zero."""

    case_id: str
    query_tokens: int
    heads: int
    topk_width: int
    active: int
    rope_dim: int
    real_rope: bool
    block_size: int
    row_bytes: int
    softmax_scale: float
    kv_scale_format: str
    empty_rows: int
    seed: int


def model_case(
    cfg: ModelConfig, query_tokens: int, seed: int, rope_dim: int | None = None
) -> PaddingCase:
    rope_dim = cfg.qk_rope_head_dim if rope_dim is None else rope_dim
    case_id = f"{cfg.name}-T{query_tokens}-H{cfg.heads_per_gpu}-W{cfg.topk_width}-rope{rope_dim}"
    return PaddingCase(
        case_id=case_id,
        query_tokens=query_tokens,
        heads=cfg.heads_per_gpu,
        topk_width=cfg.topk_width,
        active=cfg.max_active,
        rope_dim=rope_dim,
        real_rope=not cfg.nope,
        block_size=cfg.block_size,
        row_bytes=g.FULL_ROW_BYTES if rope_dim else cfg.row_bytes,
        softmax_scale=cfg.softmax_scale,
        kv_scale_format=cfg.kv_scale_format,
        empty_rows=min(EMPTY_ROWS, query_tokens - 1),
        seed=seed + zlib.crc32(case_id.encode()),
    )


def build_problem(case: PaddingCase, device: torch.device) -> DecodeProblem:
    """A random widened problem: logical positions through shuffled block tables (the metadata
    conversion under test), and a poisoned last block that no valid entry names."""
    gen = torch.Generator().manual_seed(case.seed)
    bs = case.block_size
    logical_blocks = -(-2 * case.active // bs)
    seq_len = logical_blocks * bs
    num_blocks = REQUESTS * logical_blocks + 1  # + the poisoned block
    slots = (num_blocks - 1) * bs
    # FlashMLA's test distribution (latent N(0, 1), queries N(0, 1) clamped to [-1, 1]), which the
    # element rule abs 1e-3 / rel 2/128 was set for: every flash kernel rounds softmax weights to
    # bf16 before P @ V, and with sharper attention FlashInfer's own fa3 misses that rule too
    # (measured on the H200, results/reference/), while the cosine check still passes.
    kv_c = torch.randn(slots, g.LATENT_DIM, generator=gen).to(torch.bfloat16)
    k_pe = (
        torch.randn(slots, g.ROPE_DIM, generator=gen).to(torch.bfloat16) if case.real_rope else None
    )
    cache = torch.full((num_blocks, bs, case.row_bytes), POISON, dtype=torch.uint8)
    cache.view(-1, case.row_bytes)[:slots] = rowformat.pack_rows(
        kv_c, k_pe, case.kv_scale_format, case.row_bytes
    )
    block_table = torch.stack(
        [torch.randperm(num_blocks - 1, generator=gen)[:logical_blocks] for _ in range(REQUESTS)]
    )
    block_table = torch.cat([block_table, torch.full((REQUESTS, 1), -1)], dim=1).to(torch.int32)
    positions = torch.rand(case.query_tokens, seq_len, generator=gen).argsort(dim=1)[
        :, : case.active
    ]
    logical = torch.full((case.query_tokens, case.topk_width), -1, dtype=torch.int32)
    logical[:, : case.active] = positions.to(torch.int32)
    logical[case.query_tokens - case.empty_rows :] = -1
    req_of_token = torch.arange(case.query_tokens, dtype=torch.int32) % REQUESTS
    indices = metadata.logical_to_physical(logical, block_table, req_of_token, bs, num_blocks)
    q = (
        torch.randn(case.query_tokens, case.heads, g.qk_dim(case.rope_dim), generator=gen)
        .clamp(-1, 1)
        .to(torch.bfloat16)
    )
    if case.rope_dim and not case.real_rope:
        q[..., g.LATENT_DIM :] = 0
    return DecodeProblem(
        q.to(device),
        cache.to(device),
        indices.to(device),
        case.softmax_scale,
        case.rope_dim,
        case.kv_scale_format,
    )


def compact_problem(problem: DecodeProblem) -> DecodeProblem:
    """The same step over exactly the valid entries: W = the largest active length."""
    counts = metadata.valid_counts(problem.indices)
    width = max(1, int(counts.max()))
    return dataclasses.replace(
        problem, indices=metadata.compact_to_front(problem.indices)[:, :width].contiguous()
    )


def shuffled_problem(problem: DecodeProblem, seed: int) -> DecodeProblem:
    """The same step with every row's entries, -1 included, in a random order."""
    gen = torch.Generator().manual_seed(seed)
    perm = (
        torch.rand(problem.indices.shape, generator=gen).argsort(dim=1).to(problem.indices.device)
    )
    return dataclasses.replace(problem, indices=torch.gather(problem.indices, 1, perm).contiguous())


# --- result rows -------------------------------------------------------------------------------


ROW_FIELDS = ("layout", "sizing", "sparse_mla_top_k", "max_abs_err", "cos_diff")


def row(check: str, impl: str, passed: bool | None, detail: str, **fields: Any) -> dict[str, Any]:
    """One check result. Parameters of the case (layout, sizing rule, capacity) and metrics are
    fields of their own, never folded into the check name."""
    unknown = set(fields) - set(ROW_FIELDS)
    if unknown:
        raise ValueError(f"unknown row fields {sorted(unknown)}")
    result = "skipped" if passed is None else ("passed" if passed else "failed")
    return {
        "check": check,
        "impl": impl,
        **{k: fields.get(k) for k in ROW_FIELDS},
        "result": result,
        "detail": detail,
    }


def case_label(r: dict[str, Any]) -> str:
    """The case columns of a row as one display cell (display only; records keep the fields)."""
    parts = [
        r.get("layout"),
        r.get("sizing") and f"{r['sizing']} sizing",
        r.get("sparse_mla_top_k") and f"sparse_mla_top_k={r['sparse_mla_top_k']}",
    ]
    return ", ".join(p for p in parts if p) or "-"


def error_detail(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    why = signatures.explain(str(exc))
    return f"{text} -> {why}" if why and not isinstance(exc, signatures.KnownFailure) else text


def guarded(check: str, impl: str, fn: Callable[[], list[dict]]) -> list[dict]:
    """A check that raises becomes a failed row naming the error, never a crash."""
    try:
        return fn()
    except Exception as exc:
        return [row(check, impl, False, error_detail(exc))]


# --- width and sizing --------------------------------------------------------------------------


def width_facts(index_topk: int, kpool: int) -> dict[str, Any]:
    width = g.topk_buffer_width(index_topk, kpool)
    active = g.max_active_topk(index_topk, kpool)
    prefix = metadata.prefix_sizing(index_topk, width)
    return {
        "index_topk": index_topk,
        "kpool": kpool,
        "max_active": active,
        "width": width,
        "pre_fix_sparse_mla_top_k": prefix.sparse_mla_top_k,
        "pre_fix_fits": prefix.mismatch() is None,
        "width_ok": width % g.TOPK_ALIGN == 0 and active <= width < active + g.TOPK_ALIGN,
    }


def width_checks(cfg: ModelConfig) -> tuple[list[dict], list[dict]]:
    """Rows for the model's width and sizing, and the grid table (also one row)."""
    facts = width_facts(cfg.index_topk, cfg.index_kpool)
    rows = [
        row(
            "buffer-width",
            "-",
            facts["width_ok"],
            f"round_up({cfg.index_topk} + {cfg.index_kpool} - 1, {g.TOPK_ALIGN}) "
            f"= {facts['width']}; "
            f"at most {facts['max_active']} active, the rest -1",
        )
    ]
    buffer = torch.full((1, cfg.topk_width), -1, dtype=torch.int32)
    fixed = metadata.sizing_from_buffer(buffer)
    prefix = metadata.prefix_sizing(cfg.index_topk, cfg.topk_width)
    rows.append(
        row(
            "sizing",
            "-",
            fixed.mismatch() is None and fixed.buffer_width == cfg.topk_width,
            f"fixed: sparse_mla_top_k = max_seq_len = {fixed.sparse_mla_top_k} (buffer shape[1]); "
            f"pre-fix: {prefix.sparse_mla_top_k} ({prefix.mismatch() or 'the same'})",
        )
    )
    grid = [width_facts(t, k) for t in GRID_TOPK for k in GRID_KPOOL]
    bad = [
        f"{f['index_topk']}/{f['kpool']}"
        for f in grid
        if not f["width_ok"] or f["pre_fix_fits"] != (f["width"] == f["index_topk"])
    ]
    rows.append(
        row(
            "width-grid",
            "-",
            not bad,
            f"index_topk {GRID_TOPK} x kpool {GRID_KPOOL}: "
            + (
                f"wrong for {bad}"
                if bad
                else f"{sum(not f['pre_fix_fits'] for f in grid)} of {len(grid)} need the fix"
            ),
        )
    )
    return rows, grid


# --- FlashInfer validation ---------------------------------------------------------------------


def validation_rows(cfg: ModelConfig, check: str = "flashinfer-sm120-validation") -> list[dict]:
    version = flashinfer_validation.flashinfer_version()
    rows = []
    buffer = torch.full((1, cfg.topk_width), -1, dtype=torch.int32)
    # What must happen is stated from the config alone: the backend's sizing is accepted; the
    # pre-fix sizing is rejected exactly when kpool widens the buffer past index_topk.
    cases = (
        (metadata.sizing_from_buffer(buffer), True),
        (metadata.prefix_sizing(cfg.index_topk, cfg.topk_width), cfg.topk_width == cfg.index_topk),
    )
    for layout in flashinfer_validation.layouts_for(cfg):
        for sizing, expect_accept in cases:
            verdict = flashinfer_validation.validate_sizing(
                layout, cfg.heads_per_gpu, sizing, expect_accept
            )
            rows.append(
                row(
                    check,
                    "flashinfer",
                    verdict.passed,
                    f"flashinfer-python {version}: {verdict.detail}",
                    layout=layout.name,
                    sizing=sizing.rule,
                    sparse_mla_top_k=sizing.sparse_mla_top_k,
                )
            )
    return rows


# --- decode checks -----------------------------------------------------------------------------


def run_impl(problem: DecodeProblem, impl: str, registry: dict[str, ImplSpec]) -> DecodeOutput:
    result = impl_registry.decode(problem, impl, registry)
    if problem.q.device.type == "cuda":
        torch.cuda.synchronize()
    return result


def padding_rows(
    spec: ImplSpec,
    problem: DecodeProblem,
    registry: dict[str, ImplSpec],
    seed: int,
    reference: torch.Tensor,
) -> list[dict]:
    """The three -1 padding checks for one implementation (the kernel runs before any
    comparison; `reference` is the reference over exactly the valid entries)."""
    name = spec.name
    wide = run_impl(problem, name, registry).out.clone()
    compact = run_impl(compact_problem(problem), name, registry).out.clone()
    shuffled = run_impl(shuffled_problem(problem, seed), name, registry).out.clone()
    counts = metadata.valid_counts(problem.indices)
    active, width = int(counts.max()), problem.width
    tol = spec.tolerance.kwargs()
    to_ref, to_compact = compare.close(wide, reference, **tol), compare.close(wide, compact, **tol)
    ok = to_ref.passed and to_compact.passed
    rows = [
        row(
            "padding-bounds-active",
            name,
            ok,
            f"W={width} ({active} active, -1 tail) vs exactly the valid entries (W={active}): "
            f"vs reference {to_ref.detail}; vs itself compact {to_compact.detail}",
            max_abs_err=max(to_ref.max_abs_err, to_compact.max_abs_err),
            cos_diff=to_ref.cos_diff,
        )
    ]
    empty = counts == 0
    empty_out = wide[empty]
    zero = (
        bool(torch.isfinite(empty_out).all()) and float(empty_out.abs().max()) == 0.0
        if empty_out.numel()
        else None
    )
    rows.append(
        row(
            "empty-rows-zero",
            name,
            zero,
            f"{int(empty.sum())} rows with no valid entry: "
            + (
                "all exactly zero"
                if zero
                else "no such row in this case"
                if zero is None
                else f"max |out| {float(empty_out.float().abs().max()):.4g}"
            ),
        )
    )
    shuf = compare.close(shuffled, wide, **tol)
    rows.append(
        row(
            "shuffled-padding",
            name,
            shuf.passed,
            f"-1 positions shuffled within rows: {shuf.detail}",
            max_abs_err=shuf.max_abs_err,
            cos_diff=shuf.cos_diff,
        )
    )
    return rows


def decode_checks(cfg: ModelConfig, seed: int, registry: dict[str, ImplSpec]) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokens = GPU_QUERY_TOKENS if device.type == "cuda" else CPU_QUERY_TOKENS
    case = model_case(cfg, tokens, seed)
    problem = build_problem(case, device)
    reference = run_impl(compact_problem(problem), "reference", registry).out
    ok_specs, refused = impl_registry.runnable(problem, registry)
    rows = []
    for spec in ok_specs:
        rows += guarded(
            "padding-bounds-active",
            spec.name,
            lambda spec=spec: padding_rows(spec, problem, registry, case.seed + 1, reference),
        )
    rows += [row("decode-padding", name, None, reason) for name, reason in refused.items()]
    return rows


def graph_rows(cfg: ModelConfig, seed: int, registry: dict[str, ImplSpec]) -> list[dict]:
    """Capture and replay a batch-512 decode at the widened width for every GPU implementation."""
    check = "cuda-graph-capture"
    if not torch.cuda.is_available():
        return [row(check, "-", None, "needs a CUDA GPU; none is visible")]
    case = model_case(cfg, GRAPH_QUERY_TOKENS, seed)
    problem = build_problem(case, torch.device("cuda"))
    ok_specs, refused = impl_registry.runnable(problem, registry)
    gpu_specs = [s for s in ok_specs if s.name != "reference"]
    rows = [row(check, name, None, reason) for name, reason in refused.items()]
    if not gpu_specs:
        return rows or [row(check, "-", None, "no GPU implementation runs on this machine")]
    reference = run_impl(problem, "reference", registry).out
    for spec in gpu_specs:
        rows += guarded(
            check, spec.name, lambda spec=spec: [capture_replay(spec, problem, registry, reference)]
        )
    return rows


def capture_replay(
    spec: ImplSpec, problem: DecodeProblem, registry: dict[str, ImplSpec], reference: torch.Tensor
) -> dict:
    run = impl_registry.prepare(problem, spec.name, registry)
    eager = run().out.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch recommends
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    captured.out.fill_(float("nan"))  # replay must overwrite every element
    graph.replay()
    torch.cuda.synchronize()
    replay = compare.close(captured.out, eager)
    to_ref = compare.close(eager, reference, **spec.tolerance.kwargs())
    exact = bool(torch.equal(captured.out, eager))
    return row(
        "cuda-graph-capture",
        spec.name,
        replay.passed and to_ref.passed,
        f"T={problem.tokens} H={problem.heads} W={problem.width}: captured and replayed; "
        f"replay vs eager {'bit-exact' if exact else replay.detail}; "
        f"eager vs reference {to_ref.detail}",
        max_abs_err=replay.max_abs_err,
        cos_diff=to_ref.cos_diff,
    )


# --- DeepSeek-V3.2 control ---------------------------------------------------------------------


def control_rows() -> list[dict]:
    cfg = load_model_config(CONTROL_MODEL)
    fixed = metadata.sizing_from_buffer(cfg.topk_width)
    prefix = metadata.prefix_sizing(cfg.index_topk, cfg.topk_width)
    same = cfg.topk_width == cfg.index_topk and (fixed.sparse_mla_top_k, fixed.max_seq_len) == (
        prefix.sparse_mla_top_k,
        prefix.max_seq_len,
    )
    rows = [
        row(
            "dsv32-control",
            "-",
            same,
            f"{cfg.name}: width {cfg.topk_width}, index_topk {cfg.index_topk}; "
            f"fixed and pre-fix sizing {'agree' if same else 'differ'} "
            f"({fixed.sparse_mla_top_k} / {prefix.sparse_mla_top_k})",
        )
    ]
    return rows + validation_rows(cfg, check="dsv32-control")


def run_checks(
    cfg: ModelConfig, seed: int, registry: dict[str, ImplSpec] | None = None
) -> dict[str, Any]:
    """Every check for one model: {'rows', 'width_table', 'implementations'}."""
    registry = impl_registry.implementations() if registry is None else registry
    steps: list[tuple[str, Callable[[], list[dict]]]] = [
        ("flashinfer validation", lambda: validation_rows(cfg)),
        ("decode padding", lambda: decode_checks(cfg, seed, registry)),
        ("graph capture", lambda: graph_rows(cfg, seed, registry)),
        ("dsv32 control", control_rows),
    ]
    rows, grid = width_checks(cfg)
    with out.progress_bar("check-pagetable", total=len(steps)) as advance:
        for label, step in steps:
            rows += guarded(label, "-", step)
            advance(label)
    return {"rows": rows, "width_table": grid, "implementations": implementation_table(registry)}


def implementation_table(registry: dict[str, ImplSpec]) -> list[dict]:
    """Which implementations this machine can run at all (a tiny problem on the GPU if any)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    probe = DecodeProblem(
        torch.zeros(1, 1, g.LATENT_DIM, dtype=torch.bfloat16, device=device),
        torch.zeros(1, 64, g.FULL_ROW_BYTES, dtype=torch.uint8, device=device),
        torch.full((1, 128), -1, dtype=torch.int32, device=device),
        1.0,
        0,
    )
    return [
        {"impl": s.name, "description": s.description, "refusal": s.unsupported(probe)}
        for s in registry.values()
    ]


def passed(rows: list[dict]) -> bool:
    return all(r["result"] != "failed" for r in rows)
