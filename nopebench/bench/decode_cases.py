"""bench-decode's config, its cases, and the tensors each case runs on.

A case is one (heads, query tokens, buffer width, active entries, mode) point of the grid; its
seed derives from its id. Modes name what a decode reads:
- nope: 512-wide queries over compact 528-byte rows (the native NoPE layout);
- nope-pool: 512-wide queries over 656-byte rows (vLLM's pool layout, tail zero, not read);
- shim: 576-wide queries with zero RoPE lanes over 656-byte rows with zero tails (the
  zero-padded RoPE workaround NoPE replaces).

A cell is named by (heads, query tokens, width, mode), which is what the command line filters
by; so a config lists each width once. Acceptance criteria are data too: each compares an
(implementation, mode) with another (or with the fastest of several) at one cell of the grid or
at every cell of a selection, or holds it to a share of the roofline there.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from nopebench import geometry as g
from nopebench import rowformat
from nopebench.config import (
    ModelConfig,
    StrictModel,
    load_config,
    load_model_config,
    resolve_config_path,
)
from nopebench.errors import UsageError
from nopebench.impls.interface import DecodeProblem

Mode = Literal["nope", "nope-pool", "shim"]
MODE_LAYOUT: dict[str, tuple[int, int]] = {  # mode -> (rope_dim, row_bytes)
    "nope": (0, g.NOPE_ROW_BYTES),
    "nope-pool": (0, g.FULL_ROW_BYTES),
    "shim": (g.ROPE_DIM, g.FULL_ROW_BYTES),
}
POISON = rowformat.POISON_BYTE
BENCH_CONFIG_VERSION = 2  # 2: acceptance criteria are the config's `criteria`


class WidthSpec(StrictModel):
    width: int = Field(gt=0, le=65536)
    active: int = Field(ge=0)

    @model_validator(mode="after")
    def _fits(self) -> WidthSpec:
        if self.active > self.width:
            raise ValueError(f"active = {self.active} exceeds width = {self.width}")
        return self


class TimingSpec(StrictModel):
    budget_s: float = Field(default=0.3, gt=0, le=60)
    min_samples: int = Field(default=10, ge=1)
    max_samples: int = Field(default=200, ge=1)


class QuickSpec(StrictModel):
    heads: list[int] = Field(min_length=1)
    query_tokens: list[int] = Field(min_length=1)
    widths: list[WidthSpec] = Field(min_length=1)
    budget_s: float = Field(default=0.1, gt=0)

    @model_validator(mode="after")
    def _one_entry_per_width(self) -> QuickSpec:
        _check_widths(self.widths, "quick.widths")
        return self


class Side(StrictModel):
    """One side of a criterion: an implementation run in a mode, or (a baseline only) the
    fastest in each cell of the implementations `fastest_of` names."""

    impl: str | None = Field(default=None, min_length=1)
    fastest_of: list[str] | None = Field(default=None, min_length=1)
    mode: Mode

    @model_validator(mode="after")
    def _one_kind(self) -> Side:
        if (self.impl is None) == (self.fastest_of is None):
            raise ValueError("give exactly one of impl or fastest_of")
        return self

    def impls(self) -> list[str]:
        return [self.impl] if self.impl is not None else list(self.fastest_of)


# A cell's fields in a config, and the columns of bench-decode's records that hold them.
RECORD_COLUMN = {"heads": "heads", "tokens": "query_tokens", "width": "width", "active": "active"}


def cell_label(heads: int, tokens: int, width: int, active: int) -> str:
    """How tables and records name one point of the grid."""
    return f"H={heads} T={tokens} W={width} ({active} active)"


class Cell(StrictModel):
    """One point of the grid."""

    heads: int = Field(gt=0, le=128)
    tokens: int = Field(gt=0)
    width: int = Field(gt=0)
    active: int = Field(ge=0)

    def label(self) -> str:
        return cell_label(self.heads, self.tokens, self.width, self.active)


class Cells(StrictModel):
    """Points of the grid: each field given narrows the selection, so {} is every cell and
    {tokens: 512} every cell at 512 query tokens."""

    heads: int | None = Field(default=None, gt=0, le=128)
    tokens: int | None = Field(default=None, gt=0)
    width: int | None = Field(default=None, gt=0)
    active: int | None = Field(default=None, ge=0)

    def conditions(self) -> str:
        """The values given, as in a cell's label ("H=128 T=512"); empty for every cell."""
        given = (("H", self.heads), ("T", self.tokens), ("W", self.width), ("active", self.active))
        return " ".join(f"{key}={value}" for key, value in given if value is not None)

    def label(self) -> str:
        return f"every cell at {self.conditions()}" if self.conditions() else "every cell"


class CriterionSpec(StrictModel):
    """A speed criterion at `cell`, or at every cell `cells` selects (each must hold):
    - with `baseline` and `min_speedup`: baseline's median time / subject's >= min_speedup (so
      1.0 means the subject is at least as fast; 0.8 means it may be up to 1.25x slower);
    - with `min_pct_roofline`: the subject's time reaches that share (in %) of the roofline."""

    name: str = Field(min_length=1)
    subject: Side
    baseline: Side | None = None
    cell: Cell | None = None
    cells: Cells | None = None
    min_speedup: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    min_pct_roofline: float | None = Field(default=None, gt=0, le=100, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_form(self) -> CriterionSpec:
        if (self.cell is None) == (self.cells is None):
            raise ValueError("give exactly one of cell (one point) or cells (a selection)")
        if self.subject.impl is None:
            raise ValueError(
                "the subject is one implementation (impl); fastest_of is for a baseline"
            )
        ratio = self.baseline is not None or self.min_speedup is not None
        if ratio == (self.min_pct_roofline is not None):
            raise ValueError("give either baseline and min_speedup, or min_pct_roofline")
        if ratio and (self.baseline is None or self.min_speedup is None):
            raise ValueError("a ratio criterion needs both baseline and min_speedup")
        return self

    def selection(self) -> dict[str, int]:
        """The selected cells as column values of bench-decode's records."""
        where = self.cell if self.cell is not None else self.cells
        return {RECORD_COLUMN[k]: v for k, v in where.model_dump().items() if v is not None}

    def scope(self) -> str:
        return self.cell.label() if self.cell is not None else self.cells.label()


class BenchConfig(StrictModel):
    version: int = BENCH_CONFIG_VERSION
    name: str
    model: str = "glm53-flash"
    heads: list[int] = Field(min_length=1)
    query_tokens: list[int] = Field(min_length=1)
    widths: list[WidthSpec] = Field(min_length=1)
    modes: list[Mode] = Field(min_length=1)
    impls: list[str] = Field(min_length=1)
    cache_rows: int = Field(default=1 << 20, ge=4096, le=1 << 26)
    reference_max_tokens: int = Field(default=64, ge=0)
    check_tokens: int = Field(default=512, ge=1)
    timing: TimingSpec = TimingSpec()
    quick: QuickSpec | None = None
    criteria: list[CriterionSpec] = []

    @field_validator("version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version != BENCH_CONFIG_VERSION:
            raise ValueError(
                f"this nopebench reads bench config version {BENCH_CONFIG_VERSION}, which holds "
                "the acceptance criteria as data (`criteria`); set version: 2 and list them"
            )
        return version

    @model_validator(mode="after")
    def _positive(self) -> BenchConfig:
        for key in ("heads", "query_tokens"):
            bad = [v for v in getattr(self, key) if v <= 0 or (key == "heads" and v > 128)]
            if bad:
                raise ValueError(
                    f"{key} must be positive{' and at most 128' if key == 'heads' else ''}, "
                    f"got {bad}"
                )
        _check_widths(self.widths, "widths")
        return self

    @model_validator(mode="after")
    def _criteria_name_cells_of_the_grid(self) -> BenchConfig:
        from nopebench.impls import registry

        known = registry.names()
        names: set[str] = set()
        for i, c in enumerate(self.criteria):
            where = f"criteria[{i}] {c.name!r}"
            if c.name in names:
                raise ValueError(f"{where}: another criterion has this name")
            names.add(c.name)
            sides = (("subject", c.subject), ("baseline", c.baseline))
            for role, side in (s for s in sides if s[1] is not None):
                for impl in side.impls():
                    if impl not in known:
                        raise ValueError(
                            f"{where}: {role} impl {impl!r} is not an implementation "
                            f"(choose from {', '.join(known)})"
                        )
                if side.mode not in self.modes:
                    raise ValueError(
                        f"{where}: {role} mode {side.mode!r} is not one of the config's modes "
                        f"({', '.join(self.modes)})"
                    )
            if not self._selects_cells(c):
                if c.cell is not None:
                    raise ValueError(f"{where}: cell {c.scope()} is not in the config's grid")
                raise ValueError(
                    f"{where}: the config's grid has no cell at {c.cells.conditions()}"
                )
        return self

    def _selects_cells(self, c: CriterionSpec) -> bool:
        """Whether the criterion's cell, or at least one cell of its selection, is in the grid
        (each value it gives is one of the grid's)."""
        want = c.selection()
        points = [
            dict(zip(RECORD_COLUMN.values(), (h, t, w.width, w.active), strict=True))
            for h in self.heads
            for t in self.query_tokens
            for w in self.widths
        ]
        return any(all(p[k] == v for k, v in want.items()) for p in points)


def _check_widths(widths: list[WidthSpec], key: str) -> None:
    seen = [w.width for w in widths]
    twice = sorted({w for w in seen if seen.count(w) > 1})
    if twice:
        raise ValueError(
            f"{key} lists width {twice[0]} more than once: a cell is named by its width, so "
            "each width appears once"
        )


def load_bench_config(value: str) -> BenchConfig:
    return load_config(resolve_config_path(value, "bench"), BenchConfig)


@dataclass(frozen=True)
class DecodeCase:
    heads: int
    query_tokens: int
    width: int
    active: int
    mode: str

    @property
    def case_id(self) -> str:
        return f"h{self.heads}-t{self.query_tokens}-w{self.width}a{self.active}-{self.mode}"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.case_id.encode())

    @property
    def rope_dim(self) -> int:
        return MODE_LAYOUT[self.mode][0]

    @property
    def row_bytes(self) -> int:
        return MODE_LAYOUT[self.mode][1]

    @property
    def row_bytes_read(self) -> int:
        """Bytes of each row a decode must read: 528 unless the RoPE lanes are part of K."""
        return g.row_bytes_read(self.rope_dim)

    @property
    def qk_dim(self) -> int:
        return g.qk_dim(self.rope_dim)

    def flops(self) -> int:
        return g.decode_flops(self.query_tokens, self.heads, self.active, self.qk_dim)

    def bytes(self) -> int:
        return g.decode_bytes(
            self.query_tokens, self.heads, self.active, self.row_bytes_read, self.qk_dim
        )


def grid(cfg: BenchConfig, quick: bool) -> list[DecodeCase]:
    """The cases of a config, in display order (mode, width, heads, tokens)."""
    heads, tokens, widths = cfg.heads, cfg.query_tokens, cfg.widths
    if quick and cfg.quick is not None:
        heads, tokens, widths = cfg.quick.heads, cfg.quick.query_tokens, cfg.quick.widths
    return [
        DecodeCase(h, t, w.width, w.active, m)
        for m in cfg.modes
        for w in widths
        for h in heads
        for t in tokens
    ]


def select_cases(
    cases: list[DecodeCase],
    heads: tuple[int, ...] = (),
    tokens: tuple[int, ...] = (),
    widths: tuple[int, ...] = (),
    modes: tuple[str, ...] = (),
    grid_name: str = "the grid",
) -> list[DecodeCase]:
    """The cases matching every filter given (an empty filter keeps every case). A value no
    case has is a UsageError naming the flag, the value and what the grid holds: the grid is a
    product, so every combination of values that exist has its case."""
    filters = (
        ("--heads", heads, "heads"),
        ("--tokens", tokens, "query_tokens"),
        ("--width", widths, "width"),
        ("--mode", modes, "mode"),
    )
    for flag, values, attr in filters:
        have = list(dict.fromkeys(getattr(c, attr) for c in cases))
        missing = [v for v in values if v not in have]
        if missing:
            raise UsageError(
                f"{flag} {missing[0]} matches no case of {grid_name} "
                f"(its {attr.replace('_', ' ')}: {', '.join(map(str, have))})"
            )
    return [
        c
        for c in cases
        if all(not values or getattr(c, attr) in values for _, values, attr in filters)
    ]


def build_cache(
    mode: str, rows: int, block_size: int, scale_format: str, device, seed: int = 0
) -> tuple[torch.Tensor, int]:
    """A packed cache of `rows` rows written through the reference writer, its last 1/16 left
    as NaN poison; returns (cache, usable rows). Latent values are N(0, 1), NoPE rows (no RoPE
    input), so 656-byte rows carry zero tails as the cache-write fix requires."""
    _, row_bytes = MODE_LAYOUT[mode]
    usable = rows - rows // 16
    gen = torch.Generator(device=device).manual_seed(seed)
    cache = torch.full(
        (rows // block_size, block_size, row_bytes), POISON, dtype=torch.uint8, device=device
    )
    step = 1 << 18
    for start in range(0, usable, step):
        n = min(step, usable - start)
        latent = torch.randn(n, g.LATENT_DIM, device=device, generator=gen).to(torch.bfloat16)
        rowformat.write_cache(
            cache, latent, None, torch.arange(start, start + n, device=device), scale_format
        )
    return cache, usable


def make_problem(
    case: DecodeCase,
    cache: torch.Tensor,
    usable: int,
    model: ModelConfig,
    set_index: int,
    tokens: int | None = None,
) -> DecodeProblem:
    """Fresh random queries (N(0,1) clamped to [-1, 1], FlashMLA's test distribution; zero RoPE
    lanes for the shim) and index rows of `active` random slots then a -1 tail, for one set."""
    device = cache.device
    tokens = case.query_tokens if tokens is None else tokens
    gen = torch.Generator(device=device).manual_seed(case.seed * 1009 + set_index)
    q = (
        torch.randn(tokens, case.heads, case.qk_dim, device=device, generator=gen)
        .clamp(-1, 1)
        .to(torch.bfloat16)
    )
    if case.rope_dim:
        q[..., g.LATENT_DIM :] = 0
    indices = torch.full((tokens, case.width), -1, dtype=torch.int32, device=device)
    indices[:, : case.active] = torch.randint(
        0, usable, (tokens, case.active), device=device, generator=gen, dtype=torch.int32
    )
    return DecodeProblem(
        q=q,
        cache=cache,
        indices=indices,
        softmax_scale=model.softmax_scale,
        rope_dim=case.rope_dim,
        kv_scale_format=model.kv_scale_format,
    )


def model_for(cfg: BenchConfig) -> ModelConfig:
    return load_model_config(cfg.model)
