"""The SM clock and board power each decode implementation runs at (a developer diagnostic).

An H100 or H200 SXM board caps its power at 700 W and lowers its SM clock to stay under it, so
two kernels can run at different clocks. For each implementation and cell this replays one
prepared launch back to back for a few seconds (after a warm-up) while `nvidia-smi -lms` samples
the SM clock, power, temperature and the active clock-event reasons, then prints one line per run
with the medians, the time per launch and where it ran (GPU, driver, versions, git sha, time).
The problems are bench-decode's (its cache and query generator); the launches are not checked
here (bench-decode checks the same launches). Rows go to stdout as CSV, library logs to stderr.

    python3 tools/clock_probe.py --impl native --impl flashinfer-fa3-bf16 --cells 128x512,64x512
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

from nopebench.bench.decode_cases import DecodeCase, build_cache, make_problem
from nopebench.config import load_model_config
from nopebench.environment import environment_header
from nopebench.impls import registry as impl_registry

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def sample_while(run, seconds: float) -> tuple[list[list[str]], float]:
    """Replays `run` for `seconds` under nvidia-smi sampling; the samples and ms per launch."""
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    launches, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            run()
        launches += 20
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    smi.terminate()
    out, err = smi.communicate()
    samples = [[f.strip() for f in line.split(",")] for line in out.splitlines() if "," in line]
    if not samples:
        raise SystemExit(f"error: nvidia-smi gave no samples: {err.strip()[:200]}")
    return samples, 1e3 * elapsed / launches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", action="append", required=True, choices=impl_registry.names())
    ap.add_argument("--cells", default="128x512,64x512", help="HEADSxTOKENS,...")
    ap.add_argument("--mode", default="nope", choices=["nope", "shim"])
    ap.add_argument("--width", type=int, default=2176)
    ap.add_argument("--active", type=int, default=2051)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    model = load_model_config("glm53-flash")
    cache, usable = build_cache(a.mode, 1 << 20, 64, model.kv_scale_format, "cuda")
    env = environment_header()
    where = [
        env.get("gpu"),
        env.get("driver"),
        env["versions"].get("torch"),
        env["versions"].get("triton"),
        env["versions"].get("flashinfer-python"),
        env.get("git_sha"),
        env["timestamp"],
    ]
    print(
        "round,cell,impl,ms_per_launch,sm_mhz,power_w,temp_c,event_reasons,samples,"
        "gpu,driver,torch,triton,flashinfer,git_sha,timestamp",
        flush=True,
    )
    for cell in a.cells.split(","):
        heads, tokens = (int(x) for x in cell.split("x"))
        case = DecodeCase(heads, tokens, a.width, a.active, a.mode)
        problem = make_problem(case, cache, usable, model, 0)
        runs = {name: impl_registry.prepare(problem, name) for name in a.impl}
        for run in runs.values():  # first launches build and compile, outside any window
            run()
        torch.cuda.synchronize()
        for r in range(a.rounds):
            for name, run in runs.items():
                sample_while(run, 1.0)  # warm-up: clocks and temperature settle
                samples, ms = sample_while(run, a.seconds)
                sm = statistics.median(float(s[0]) for s in samples)
                pw = statistics.median(float(s[1]) for s in samples)
                tc = statistics.median(float(s[2]) for s in samples)
                reasons = sorted({s[3] for s in samples})
                row = [r, cell, name, f"{ms:.4f}", f"{sm:.0f}", f"{pw:.0f}", f"{tc:.0f}"]
                row += ["|".join(reasons), len(samples), *where]
                print(",".join(str(x) for x in row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
