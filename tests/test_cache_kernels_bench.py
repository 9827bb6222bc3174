"""bench-cache without a GPU: argument parsing, the byte model, the check-then-time runner
(kernels faked with the reference at the boundary, timing faked), failed checks as rows, and
the command's records."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import nopebench.cache_kernels as ck
from nopebench import geometry as g
from nopebench import rowformat
from nopebench.bench import cache as cb
from nopebench.bench import timing
from nopebench.commands import bench_cache
from nopebench.commands.options import (
    DEFAULT_CACHE_TOKENS,
    MAX_CACHE_TOKENS,
    QUICK_CACHE_TOKENS,
    BenchCacheOptions,
    Output,
    parse_token_list,
)
from nopebench.errors import UnsupportedError, UsageError


def test_parse_tokens():
    assert parse_token_list("1024, 4096,1024") == (1024, 4096)
    assert BenchCacheOptions(quick=True).token_counts() == QUICK_CACHE_TOKENS
    assert BenchCacheOptions(quick=False).token_counts() == DEFAULT_CACHE_TOKENS
    assert BenchCacheOptions((77,), quick=True).token_counts() == (77,)
    for bad in ("", "0", "-5", "1k", "1.5", str(MAX_CACHE_TOKENS + 1)):
        with pytest.raises(UsageError):
            parse_token_list(bad)


def test_bytes_are_the_fewest_each_op_moves():
    nope528, nope656, rope656 = cb.VARIANTS
    assert cb.op_bytes("write", 10, nope528) == 10 * (1024 + 528)
    assert cb.op_bytes("write", 10, nope656) == 10 * (1024 + 656)
    assert cb.op_bytes("write", 10, rope656) == 10 * (1024 + 128 + 656)
    assert cb.op_bytes("gather", 10, nope656) == 10 * (528 + 1152)  # the NoPE tail is not read
    assert cb.op_bytes("gather", 10, rope656) == 10 * (656 + 1152)


def test_inputs_are_random_and_tables_read_back_every_written_row():
    v = cb.VARIANTS[2]
    s = cb.make_set(5000, v, torch.Generator().manual_seed(0), "cpu")
    assert not (s.kv_c == 0).any() and s.kv_c.stride(0) == g.UPCONVERT_DIM
    plan = rowformat.gather_plan(s.cache, s.block_table, s.workspace_starts, 5000, v.rope_dim)
    assert torch.equal(plan, s.slot_mapping)


def fake_timing(calls, budget_s=1.0, use_graph=True, **kw):
    for fn in calls:
        fn()
    ms = 1.0 if use_graph else 30.0
    return timing.Timing((ms, ms), 1, use_graph)


@pytest.fixture
def cpu_kernels(monkeypatch):
    """The kernels replaced by the reference (the boundary the runner talks to) and timing by
    one call per set, so the runner's logic runs on the CPU."""

    def into(out, cache, table, starts, total, rope_dim, seq=None):
        return out.copy_(rowformat.gather_upconvert(cache, table, starts, total, rope_dim, seq))

    monkeypatch.setattr(ck, "write_cache", rowformat.write_cache)
    monkeypatch.setattr(ck, "write_cache_unchecked", rowformat.write_cache)
    monkeypatch.setattr(ck, "gather_upconvert", rowformat.gather_upconvert)
    monkeypatch.setattr(ck, "gather_upconvert_into", into)
    monkeypatch.setattr(timing, "time_gpu", fake_timing)


def test_runner_checks_then_times_both_implementations(cpu_kernels):
    rows = cb.measure(300, cb.VARIANTS[1], 0.01, copy_gbps=1000.0, l2_bytes=1 << 20, device="cpu")
    assert {(r["op"], r["impl"]) for r in rows} == {
        (o, i) for o in ("write", "gather") for i in ("cuda", "torch")
    }
    for r in rows:
        assert r["check_passed"] and r["error"] is None and r["input_sets"] >= 2
        assert r["gbps"] == pytest.approx(r["bytes"] / (r["median_ms"] * 1e-3) / 1e9)
        assert r["pct_copy"] == pytest.approx(100 * r["gbps"] / 1000.0)
    cuda = [r for r in rows if r["impl"] == "cuda"]
    assert all(r["speedup"] == pytest.approx(30.0) for r in cuda)


def test_a_wrong_kernel_is_a_row_with_an_error_and_is_not_timed(cpu_kernels, monkeypatch):
    def broken(cache, kv_c, k_pe, slots, fmt):
        rowformat.write_cache(cache, kv_c, k_pe, slots, fmt)
        cache.view(-1)[7] ^= 1

    monkeypatch.setattr(ck, "write_cache", broken)
    rows = cb.measure(100, cb.VARIANTS[0], 0.01, copy_gbps=1000.0, l2_bytes=1 << 20, device="cpu")
    write_cuda = next(r for r in rows if r["op"] == "write" and r["impl"] == "cuda")
    assert (
        not write_cuda["check_passed"]
        and "1 of" in write_cuda["error"]
        and "median_ms" not in write_cuda
    )
    gather_cuda = next(r for r in rows if r["op"] == "gather" and r["impl"] == "cuda")
    assert gather_cuda["check_passed"]  # compared on the same (broken) cache bytes
    summary = cb.summarize(rows, {"copy_gbps": 1000.0})
    assert not summary["checks_passed"]


def test_summary_marks_the_targets():
    rows = [
        {
            "op": "write",
            "variant": "nope528",
            "tokens": 65536,
            "impl": "cuda",
            "pct_copy": 70.0,
            "speedup": 50.0,
            "check_passed": True,
            "error": None,
        },
        {
            "op": "gather",
            "variant": "nope528",
            "tokens": 65536,
            "impl": "cuda",
            "pct_copy": 55.0,
            "speedup": 50.0,
            "check_passed": True,
            "error": None,
        },
        {
            "op": "gather",
            "variant": "nope528",
            "tokens": 4096,
            "impl": "cuda",
            "pct_copy": 5.0,
            "speedup": 2.0,
            "check_passed": True,
            "error": None,
        },
    ]
    s = cb.summarize(rows, {"copy_gbps": 4000.0})
    assert s["targets_met"] == {"write/nope528/T65536": True, "gather/nope528/T65536": False}
    assert not s["all_targets_met"] and s["checks_passed"] and s["errors"] == 0


def test_command_without_gpu_is_one_line_unsupported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UnsupportedError, match="needs a CUDA GPU"):
        bench_cache.execute(BenchCacheOptions())
    with pytest.raises(UsageError, match="--tokens"):  # bad input is reported by the parser
        parse_token_list("x")


def test_command_writes_long_format_records(tmp_path, monkeypatch, capsys):
    rows = [
        {
            "op": "write",
            "variant": "nope528",
            "tokens": 65536,
            "impl": impl,
            "median_ms": 0.1 / 3,
            "gbps": 1234.5678901234567,
            "pct_copy": 65.0,
            "speedup": 25.0 if impl == "cuda" else None,
            "check_passed": True,
            "error": None,
        }
        for impl in ("cuda", "torch")
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("nopebench.cache_kernels.library.load_library", lambda device: None)
    monkeypatch.setattr(
        "nopebench.environment.gpu_info",
        lambda: {"gpu": "fake", "sm": 90, "driver": None, "cuda_runtime": None},
    )
    monkeypatch.setattr(
        cb,
        "run_bench",
        lambda sizes, budget, progress: (
            rows,
            cb.summarize(rows, {"copy_gbps": 1900.0, "matmul_tflops": 1.0}),
        ),
    )
    assert bench_cache.execute(BenchCacheOptions((65536,), output=Output(tmp_path))) == 0
    run_dir = next((tmp_path / "bench-cache").iterdir())
    table = pd.read_csv(run_dir / "results.csv")
    assert list(table["impl"]) == ["cuda", "torch"] and (table["run_id"] == run_dir.name).all()
    assert table["gbps"][0] == 1234.5678901234567  # full precision
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "passed" and record["summary"]["all_targets_met"]
    assert "bench-cache" in capsys.readouterr().out
