"""The one GPU timing function, and the two ceilings every benchmark is measured against.

`time_gpu` follows Triton's do_bench and FlashInfer's bench_gpu_time_with_cudagraph: warm up
(JIT, autotuning and first-touch stay out), capture the calls in a CUDA graph so launch gaps
vanish, rotate through several input sets so a call never finds its inputs in L2, replay until
a time budget is spent, and keep every sample. A call that cannot be captured is timed eagerly
with events around a batch, and the record says so.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

TARGET_REPLAY_MS = 2.0  # each sample spans ~2 ms so event resolution (~0.5 us) is negligible


@dataclass(frozen=True)
class Timing:
    """Per-call times in milliseconds, one sample per replay of `calls_per_sample` calls."""

    samples_ms: tuple[float, ...]
    calls_per_sample: int
    graph: bool

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    def quantile_ms(self, q: float) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the noise band a comparison must beat."""
        return (self.quantile_ms(0.9) - self.quantile_ms(0.1)) / self.median_ms

    def as_row(self) -> dict:
        return {
            "median_ms": self.median_ms,
            "p10_ms": self.quantile_ms(0.1),
            "p90_ms": self.quantile_ms(0.9),
            "spread": self.spread,
            "samples": len(self.samples_ms),
            "calls_per_sample": self.calls_per_sample,
            "cuda_graph": self.graph,
        }


def time_gpu(
    calls: Sequence[Callable[[], object]],
    budget_s: float = 1.0,
    min_samples: int = 10,
    max_samples: int = 200,
    use_graph: bool = True,
) -> Timing:
    """Median-ready per-call GPU time of `calls`, each call working on its own input set."""
    if not calls:
        raise ValueError("time_gpu needs at least one call")
    for _ in range(2):
        for fn in calls:
            fn()
    torch.cuda.synchronize()
    rounds = _rounds_for_target(calls)
    replay = _capture(calls, rounds) if use_graph else None
    run = replay if replay is not None else (lambda: _run_rounds(calls, rounds))
    run()  # one warm replay after capture
    torch.cuda.synchronize()
    start_evt = torch.cuda.Event(enable_timing=True)
    end_evt = torch.cuda.Event(enable_timing=True)
    per_sample = rounds * len(calls)
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < max_samples and (
        len(samples) < min_samples or time.perf_counter() < deadline
    ):
        start_evt.record()
        run()
        end_evt.record()
        end_evt.synchronize()
        samples.append(start_evt.elapsed_time(end_evt) / per_sample)
    return Timing(tuple(samples), per_sample, replay is not None)


def _run_rounds(calls: Sequence[Callable[[], object]], rounds: int) -> None:
    for _ in range(rounds):
        for fn in calls:
            fn()


def _rounds_for_target(calls: Sequence[Callable[[], object]]) -> int:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    _run_rounds(calls, 1)
    end.record()
    end.synchronize()
    one_round = max(start.elapsed_time(end), 1e-3)
    return max(1, min(1000, round(TARGET_REPLAY_MS / one_round)))


def _capture(calls: Sequence[Callable[[], object]], rounds: int) -> Callable[[], None] | None:
    """A replay function for a CUDA graph of the calls, or None if they cannot be captured."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            _run_rounds(calls, rounds)
    except Exception:  # noqa: BLE001 - any capture failure means: time eagerly instead
        torch.cuda.synchronize()
        return None
    return graph.replay


def rotation_count(bytes_per_set: int, l2_bytes: int | None, max_sets: int = 64) -> int:
    """Input sets to rotate through so their total is at least 3x the L2 size (cold L2)."""
    l2 = l2_bytes or 64 * 2**20
    return max(2, min(max_sets, -(-3 * l2 // max(bytes_per_set, 1))))


@dataclass(frozen=True)
class Ceilings:
    """The device's measured copy bandwidth and bf16 matmul rate, the roofline's two sides."""

    copy_gbps: float
    matmul_tflops: float

    def as_row(self) -> dict:
        return {"copy_gbps": self.copy_gbps, "matmul_tflops": self.matmul_tflops}


def measure_ceilings(
    copy_bytes: int = 2 * 2**30, matmul_n: int = 8192, budget_s: float = 0.5
) -> Ceilings:
    """Device copy bandwidth (bytes read + written) and dense bf16 matmul rate, on random data.

    The copy is timed eagerly: on the H200 a copy captured in a CUDA graph (a memcpy node) runs
    about a third slower than the same copy launched eagerly, for 1-4 GiB and any dtype.
    """
    src = torch.randint(0, 256, (copy_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_once = functools.partial(dst.copy_, src)
    copy = min(
        (
            time_gpu([copy_once], budget_s=budget_s / 2, min_samples=5, use_graph=graphed)
            for graphed in (False, True)
        ),
        key=lambda t: t.median_ms,
    )
    del src, dst
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device="cuda")
    c = torch.empty_like(a)
    mm = time_gpu([lambda: torch.matmul(a, b, out=c)], budget_s=budget_s, min_samples=5)
    return Ceilings(
        copy_gbps=2 * copy_bytes / (copy.median_ms * 1e-3) / 1e9,
        matmul_tflops=2 * matmul_n**3 / (mm.median_ms * 1e-3) / 1e12,
    )
