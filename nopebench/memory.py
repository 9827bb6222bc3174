"""How much memory this process may still take, so that work is sized before it starts.

`available_bytes()` is the kernel's MemAvailable, lowered to what a cgroup memory limit (a
container, a CI job, a systemd slice) leaves; `require()` turns "too little" into one line
saying what was asked, what is available and what fits, before anything is allocated.
"""

from __future__ import annotations

from pathlib import Path

from nopebench.errors import UnsupportedError

GIB = 1 << 30


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom() -> int | None:
    """limit - usage of this process's memory cgroup (v2, else v1); None without a limit."""
    v2 = Path("/sys/fs/cgroup")
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        own = []
    for line in own:  # v2: "0::/some/path"
        if line.startswith("0::"):
            base = v2 / line[3:].lstrip("/")
            limit, usage = _read_int(base / "memory.max"), _read_int(base / "memory.current")
            if limit is not None and usage is not None:
                return max(0, limit - usage)
    limit = _read_int(v2 / "memory" / "memory.limit_in_bytes")
    usage = _read_int(v2 / "memory" / "memory.usage_in_bytes")
    if limit is not None and usage is not None and limit < 1 << 60:  # v1 "no limit" is huge
        return max(0, limit - usage)
    return None


def available_bytes() -> int | None:
    """Bytes this process can allocate before the machine (or its cgroup) runs out; None when
    neither /proc/meminfo nor a cgroup says."""
    known = [b for b in (_meminfo_available(), _cgroup_headroom()) if b is not None]
    return min(known) if known else None


def require(need: int, what: str, fits: str | None = None) -> None:
    """Refuse, before any work, work that needs more memory than is available: exit 3 (this
    machine cannot run that), one line with both amounts and `fits`, what would."""
    have = available_bytes()
    if have is None or need <= have:
        return
    hint = f"; {fits}" if fits else ""
    raise UnsupportedError(
        f"{what} needs about {need / GIB:.1f} GiB of memory and {have / GIB:.1f} GiB is "
        f"available{hint}"
    )
