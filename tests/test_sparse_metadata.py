"""Sparse page-table metadata against slow, obviously-correct Python loops."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("hypothesis")  # a dev dependency; GPU machines may lack it (CPU-only tests)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nopebench import geometry as g
from nopebench.config import load_model_config
from nopebench.impls import metadata as md

# --- slow references -----------------------------------------------------------------------------


def slow_physical(logical, block_table, req_of_token, block_size, num_blocks=None):
    out = []
    for t, row in enumerate(logical.tolist()):
        table = block_table[int(req_of_token[t])].tolist()
        slots = []
        for idx in row:
            slot = -1
            if idx >= 0 and idx // block_size < len(table):
                block = table[idx // block_size]
                if block >= 0 and (num_blocks is None or block < num_blocks):
                    slot = block * block_size + idx % block_size
            slots.append(slot)
        out.append(slots)
    return out


def slow_compact(indices):
    rows = []
    for row in indices.tolist():
        valid = [i for i in row if i >= 0]
        rows.append(valid + [-1] * (len(row) - len(valid)))
    return rows


def random_case(gen, tokens, width, requests, max_blocks, block_size, num_blocks):
    """Logical indices past the table, negative ones and -1 rows; tables with -1 and ids past
    num_blocks."""
    span = (max_blocks + 2) * block_size
    logical = torch.randint(-3, span, (tokens, width), generator=gen, dtype=torch.int32)
    if tokens:
        logical[0] = -1  # an empty row
    table = torch.randint(
        -2, num_blocks + 3, (requests, max_blocks), generator=gen, dtype=torch.int32
    )
    req = torch.randint(0, requests, (tokens,), generator=gen, dtype=torch.int32)
    return logical, table, req


# --- logical -> physical -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.integers(0, 6),
    width=st.integers(0, 40),
    requests=st.integers(1, 3),
    max_blocks=st.integers(0, 5),
    block_size=st.sampled_from([1, 2, 4, 16, 64]),
    num_blocks=st.integers(1, 8),
    bound=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_logical_to_physical_matches_loop(
    tokens, width, requests, max_blocks, block_size, num_blocks, bound, seed
):
    gen = torch.Generator().manual_seed(seed)
    logical, table, req = random_case(
        gen, tokens, width, requests, max_blocks, block_size, num_blocks
    )
    nb = num_blocks if bound else None
    got = md.logical_to_physical(logical, table, req, block_size, nb)
    assert got.dtype == torch.int32 and got.shape == logical.shape
    assert got.tolist() == slow_physical(logical, table, req, block_size, nb)


def test_logical_to_physical_large_random_int64_inputs():
    gen = torch.Generator().manual_seed(7)
    logical, table, req = random_case(gen, 64, 2176, 4, 40, 64, 200)
    got = md.logical_to_physical(logical.long(), table.long(), req.long(), 64)
    assert got.tolist() == slow_physical(logical, table, req, 64)


def test_logical_to_physical_edges_explicitly():
    table = torch.tensor([[3, -1, 7]], dtype=torch.int32)
    logical = torch.tensor([[0, 5, 64, 65, 128, 192, 500, -1, -7]], dtype=torch.int32)
    got = md.logical_to_physical(
        logical, table, torch.zeros(1, dtype=torch.int32), 64, num_blocks=5
    )
    # block 0 -> 3; block 1 is -1; block 2 -> 7 is past num_blocks=5; block 3 is past the table
    assert got.tolist() == [[192, 197, -1, -1, -1, -1, -1, -1, -1]]


def test_logical_to_physical_rejects_bad_requests():
    logical = torch.zeros(2, 4, dtype=torch.int32)
    table = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="request outside"):
        md.logical_to_physical(logical, table, torch.tensor([0, 1], dtype=torch.int32), 64)
    with pytest.raises(ValueError, match="block_size"):
        md.logical_to_physical(logical, table, torch.zeros(2, dtype=torch.int32), 0)


# --- counts, compaction, CSR ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(tokens=st.integers(0, 6), width=st.integers(0, 30), seed=st.integers(0, 2**31 - 1))
def test_counts_compaction_and_csr_match_loops(tokens, width, seed):
    gen = torch.Generator().manual_seed(seed)
    indices = torch.randint(-1, 50, (tokens, width), generator=gen, dtype=torch.int32)
    indices[torch.rand(tokens, width, generator=gen) < 0.4] = -1
    if tokens > 1:
        indices[1] = -1
    rows = indices.tolist()
    assert md.valid_counts(indices).tolist() == [sum(i >= 0 for i in r) for r in rows]
    assert md.compact_to_front(indices).tolist() == slow_compact(indices)
    csr = md.csr_of_valid(indices)
    lens = [sum(i >= 0 for i in r) for r in rows]
    assert csr.qo_indptr.tolist() == list(range(tokens + 1))
    assert csr.kv_len.tolist() == lens
    assert csr.kv_indptr.tolist() == [sum(lens[:k]) for k in range(tokens + 1)]
    assert csr.kv_indices.tolist() == [i for r in rows for i in r if i >= 0]
    assert all(
        t.dtype == torch.int32 for t in (csr.qo_indptr, csr.kv_indptr, csr.kv_indices, csr.kv_len)
    )


def test_all_rows_empty():
    indices = torch.full((3, 5), -1, dtype=torch.int32)
    csr = md.csr_of_valid(indices)
    assert csr.kv_indices.numel() == 0 and csr.kv_len.tolist() == [0, 0, 0]
    assert md.compact_to_front(indices).tolist() == indices.tolist()


# --- sizing: the fix and the bug -----------------------------------------------------------------


@pytest.mark.parametrize("model", ["glm53-flash", "glm5", "dsv32"])
def test_fixed_sizing_is_the_buffer_width(model):
    cfg = load_model_config(model)
    buffer = torch.full((4, cfg.topk_width), -1, dtype=torch.int32)
    sizing = md.sizing_from_buffer(buffer)
    assert sizing.sparse_mla_top_k == sizing.max_seq_len == cfg.topk_width == buffer.shape[1]
    assert sizing.mismatch() is None
    assert sizing.block_tables_shape(512) == (512, 1, cfg.topk_width)


def test_glm53_flash_numbers():
    cfg = load_model_config("glm53-flash")
    assert (cfg.max_active, cfg.topk_width) == (2051, 2176)
    assert md.prefix_sizing(cfg.index_topk, cfg.topk_width).block_tables_shape(512) == (
        512,
        1,
        2048,
    )


@pytest.mark.parametrize("topk", [512, 1024, 2048])
@pytest.mark.parametrize("kpool", [1, 4, 16])
def test_pre_fix_sizing_is_caught_exactly_when_kpool_widens_the_buffer(topk, kpool):
    width = g.topk_buffer_width(topk, kpool)
    bug = md.prefix_sizing(topk, width)
    assert (bug.mismatch() is None) == (width == topk)
    if width != topk:
        assert f"sparse_mla_top_k={topk}" in bug.mismatch() and f"{width} wide" in bug.mismatch()
    assert md.sizing_from_buffer(width).mismatch() is None


def test_a_sizing_that_trusts_index_topk_fails_the_buffer_rule():
    """A backend that forgot the fix (capacity from the config) must be told apart."""

    def buggy_backend(indices, index_topk):
        return md.PageTableSizing("buggy", int(indices.shape[1]), index_topk, index_topk)

    cfg = load_model_config("glm53-flash")
    buffer = torch.full((2, cfg.topk_width), -1, dtype=torch.int32)
    assert buggy_backend(buffer, cfg.index_topk).mismatch() is not None
    assert md.sizing_from_buffer(buffer).mismatch() is None


def test_sizing_rejects_nonsense():
    with pytest.raises(ValueError):
        md.sizing_from_buffer(0)
    with pytest.raises(ValueError):
        md.prefix_sizing(0, 128)
