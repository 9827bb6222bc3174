"""The environment header every run record carries: where and with what it ran.

Besides host, git state and package versions: the GPU (torch's view), its state through NVML
(clocks, power limit, ECC, persistence mode; nvml.py), and the compilers its kernels were built
with (nvcc and ptxas of the CUDA toolkit, and the ptxas Triton uses for this GPU). A value that
cannot be read is None, with the reason next to it.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from nopebench import __version__, nvml
from nopebench.config import REPO_ROOT

PACKAGES = ("nopebench", "torch", "triton", "flashinfer-python", "lm_eval", "pandas", "pydantic")
_TOOL_VERSION = re.compile(r"release (\d+\.\d+)(?:, V(\d+(?:\.\d+)+))?")


def package_version(name: str) -> str | None:
    """The installed distribution's version; nopebench's own is that of the code running, which
    a source tree on PYTHONPATH (no installed metadata) has as well."""
    if name == "nopebench":
        return __version__
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_numbers(version: str | None, count: int) -> tuple[int, ...]:
    """The first `count` numbers of a version string ('3.6.0+git' -> (3, 6) for 2); fewer when
    it has fewer, () for None."""
    return tuple(int(part) for part in re.findall(r"\d+", version or "")[:count])


def git_state() -> dict[str, Any]:
    """Commit and dirty flag of the checkout the harness runs from (None outside git).

    NOPEBENCH_GIT_SHA (and NOPEBENCH_GIT_DIRTY=1) override git: a launcher that copies the tree
    to a GPU machine knows the commit, while a .git carried along with the copy may be stale.
    """
    if os.environ.get("NOPEBENCH_GIT_SHA"):
        return {
            "git_sha": os.environ["NOPEBENCH_GIT_SHA"],
            "git_dirty": os.environ.get("NOPEBENCH_GIT_DIRTY") == "1",
        }

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha, "git_dirty": None if status is None else bool(status)}


@cache
def gpu_info() -> dict[str, Any]:
    """Name, compute capability, driver and memory of GPU 0; {'gpu': None} without one."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None, "sm": None, "driver": None, "cuda_runtime": None}
    props = torch.cuda.get_device_properties(0)
    pci = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    driver = None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        driver = out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "gpu": props.name,
        "sm": props.major * 10 + props.minor,
        "sm_count": props.multi_processor_count,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "driver": driver,
        "cuda_runtime": torch.version.cuda,
        # NVML's form, "00000000:65:00.0": it names the same GPU whatever CUDA_VISIBLE_DEVICES is
        "pci_bus_id": None if None in pci else "{:08X}:{:02X}:{:02X}.0".format(*pci),
    }


def _nvml_target() -> tuple[str | None, int, str | None]:
    """(PCI bus id, NVML index, reason there is none) of the GPU that gpu_info describes."""
    info = gpu_info()
    if info.get("gpu") is None:
        return None, 0, "no CUDA GPU visible"
    if info.get("pci_bus_id"):
        return info["pci_bus_id"], 0, None
    try:  # torch's mapping through CUDA_VISIBLE_DEVICES; else the first NVML device
        import torch

        return None, int(torch.cuda._get_nvml_device_index(0)), None
    except Exception:  # noqa: BLE001
        return None, 0, None


def gpu_state() -> dict[str, Any]:
    """Clocks now and at most, power limit, ECC and persistence mode of that GPU (nvml.py)."""
    pci_bus_id, index, reason = _nvml_target()
    if reason is not None:
        return nvml.unavailable_state(reason)
    return nvml.gpu_state(pci_bus_id, index)


def clock_sampler() -> nvml.ClockSampler:
    """A sampler of that GPU's clocks, for a benchmark to call around its cases."""
    pci_bus_id, index, reason = _nvml_target()
    return nvml.ClockSampler(pci_bus_id, index, unavailable=reason)


def tool_version(text: str) -> str | None:
    """'12.6.85' from nvcc's or ptxas's --version ('... release 12.6, V12.6.85'), else the
    release."""
    match = _TOOL_VERSION.search(text)
    if match is None:
        return None
    return match.group(2) or match.group(1)


def tool_record(path: os.PathLike | str | None, absent: str) -> dict[str, Any]:
    """{'path', 'version', 'unavailable'} of one compiler binary; `absent`: why there is none."""
    if path is None:
        return {"path": None, "version": None, "unavailable": absent}
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"path": str(path), "version": None, "unavailable": f"{type(exc).__name__}: {exc}"}
    version = tool_version(out.stdout + out.stderr)
    reason = None if version else f"no version in its --version output (exit {out.returncode})"
    return {"path": str(path), "version": version, "unavailable": reason}


def _triton_ptxas(sm: int | None) -> tuple[str | None, str]:
    """The ptxas Triton runs for this GPU (it picks by architecture and honours its own
    TRITON_PTXAS*_PATH variables), or None and why."""
    if sm is None:
        return None, "no CUDA GPU visible (Triton picks its ptxas by the GPU's architecture)"
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return str(get_ptxas(sm).path), ""
    except Exception as exc:  # noqa: BLE001 - no Triton, or a Triton without get_ptxas(arch)
        return None, f"Triton's ptxas unknown ({type(exc).__name__}: {exc})"


@cache
def toolchain() -> dict[str, Any]:
    """nvcc and ptxas of the CUDA toolkit (the CUDA libraries' build), and Triton's ptxas."""
    from nopebench.cuda_build import find_nvcc

    nvcc = find_nvcc()
    beside = [d / "ptxas" for d in (nvcc.parent, nvcc.resolve().parent)] if nvcc else []
    found = shutil.which("ptxas")
    ptxas = next((p for p in beside if p.is_file()), Path(found) if found else None)
    triton_path, why = _triton_ptxas(gpu_info().get("sm"))
    return {
        "nvcc": tool_record(nvcc, "no nvcc in $CUDA_HOME, on PATH or under /usr/local/cuda*"),
        "ptxas": tool_record(ptxas, "no ptxas next to nvcc or on PATH"),
        "triton_ptxas": tool_record(triton_path, why),
    }


def environment_header(command: list[str] | None = None) -> dict[str, Any]:
    """Everything needed to say where a result came from and how to reproduce it."""
    return {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(command if command is not None else ["nopebench", *sys.argv[1:]]),
        "host": platform.node(),
        "python": platform.python_version(),
        **git_state(),
        **gpu_info(),
        "gpu_state": gpu_state(),
        "toolchain": toolchain(),
        "versions": {name: package_version(name) for name in PACKAGES},
    }
