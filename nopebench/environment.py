"""The environment header every run record carries: where and with what it ran."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from functools import cache
from typing import Any

from nopebench.config import REPO_ROOT

PACKAGES = ("nopebench", "torch", "triton", "flashinfer-python", "lm_eval", "pandas", "pydantic")


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


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
        "versions": {name: package_version(name) for name in PACKAGES},
    }
