"""Compile a CUDA source of the package into a plain shared library, cached by what decides
the binary.

A plain library (extern "C" launchers, no torch headers) is the binding that compiles on the
CPU-only CI machines (nvcc is all it needs). Two libraries are built this way, each described
by a `CudaLibrary`: the cache kernels (`cache_kernels.library.CACHE_LIBRARY`) and the native
register decode kernel (`impls.native.register_library.REGISTER_LIBRARY`). Their sources ship
inside the package. One library per target architecture lives in
`build/kernels/<name>-<target>-<hash>/` of a source checkout (or, for an installed package,
under the user's cache directory), where the hash covers the sources (by file name and
content), the flags, the nvcc version and the target: an unchanged tree never calls nvcc again,
and a changed one never loads a stale binary. Each directory is built under a temporary name
and renamed into place, so an interrupted or concurrent build never leaves a half-written
library behind.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from nopebench import geometry as g
from nopebench.config import REPO_ROOT
from nopebench.errors import SystemFailedError, UnsupportedError, UsageError


def _default_root() -> Path:
    """build/kernels in a source checkout; else $XDG_CACHE_HOME (or ~/.cache)/nopebench/kernels,
    since an installed package's directory is no place for build output."""
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / "build" / "kernels"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "nopebench" / "kernels"


DEFAULT_ROOT = _default_root()
BUILD_RECORD = "build.json"
COMPILE_ONLY_TARGETS = ("sm_90a", "sm_100a", "sm_120a")
# Every library: a shared object, C++17, optimized, with line info and ptxas's resource lines.
BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-Xptxas", "-v")
TARGET_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")
# Capabilities whose architecture-specific ("a") target the kernels are built for.
ARCH_SPECIFIC = {(9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120a"}
# Headers every library shares: row_layout.h (the row, from ROW_DEFINES) and emulator.h (CUDA's
# thread model on the CPU, for the emulators).
CUDA_INCLUDE = Path(__file__).resolve().parent / "cuda"
ROW_LAYOUT_HEADER = CUDA_INCLUDE / "row_layout.h"
# The fp8_ds_mla row as `geometry` describes it, passed to every library as -D flags and named
# by row_layout.h, so no CUDA source carries offsets of its own.
ROW_DEFINES = (
    ("NOPE_ROW_LATENT", g.LATENT_DIM),
    ("NOPE_ROW_TILE", g.TILE),
    ("NOPE_ROW_SCALE_OFFSET", g.SCALE_OFFSET),
    ("NOPE_ROW_ROPE_OFFSET", g.ROPE_OFFSET),
    ("NOPE_ROW_ROPE_DIM", g.ROPE_DIM),
    ("NOPE_ROW_FULL_BYTES", g.FULL_ROW_BYTES),
)


@dataclass(frozen=True)
class CudaLibrary:
    """One shared library: its translation unit (and the headers beside it), its flags and the
    oldest architecture its instructions exist on."""

    name: str  # short name: build directories and messages
    label: str  # what it holds, for tables
    source_dir: Path
    source: str  # the translation unit in source_dir
    filename: str  # the library file
    flags: tuple[str, ...]  # nvcc flags beyond BASE_FLAGS
    min_sm: int = 0  # targets below sm_<min_sm> are not built
    # Compile-time constants the source takes from Python (beyond ROW_DEFINES), as (name, value)
    defines: tuple[tuple[str, int], ...] = ()

    @property
    def define_flags(self) -> tuple[str, ...]:
        """The -D constants every compile of the source takes, GPU build or CPU emulator."""
        return tuple(f"-D{name}={value}" for name, value in (*ROW_DEFINES, *self.defines))

    @property
    def include_flags(self) -> tuple[str, ...]:
        """Where its includes are found (not part of the build hash: the headers' contents are)."""
        return ("-I", str(CUDA_INCLUDE), "-I", str(self.source_dir))

    @property
    def all_flags(self) -> tuple[str, ...]:
        return (*BASE_FLAGS, *self.define_flags, *self.flags)

    def builds_for(self, target: str) -> bool:
        return target_number(target) >= self.min_sm


class BuildError(SystemFailedError):
    """nvcc failed on the sources (the toolchain failed, not the input: exit 4). The message
    is one line; `log` holds the compiler's full output."""

    def __init__(self, summary: str, log: str, log_path: Path | None) -> None:
        super().__init__(summary)
        self.log = log
        self.log_path = log_path


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    version_text: str  # full `nvcc --version` output: part of the build hash

    @property
    def release(self) -> str:
        m = re.search(r"release (\d+\.\d+)", self.version_text)
        return m.group(1) if m else "unknown"


@dataclass(frozen=True)
class KernelResources:
    """One kernel's line of ptxas -v: what limits its occupancy and whether it spills."""

    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int


@dataclass(frozen=True)
class BuildResult:
    name: str  # the CudaLibrary's
    target: str
    library: Path
    digest: str
    cached: bool
    seconds: float
    resources: tuple[KernelResources, ...]

    @property
    def directory(self) -> Path:
        return self.library.parent


# ---------------------------------------------------------------- toolchain and targets


def find_nvcc() -> Path | None:
    """nvcc from $CUDA_HOME, then PATH, then the newest /usr/local/cuda*/bin."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return Path(home) / "bin" / "nvcc"
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    candidates = sorted(Path("/usr/local").glob("cuda*/bin/nvcc"), key=_version_key, reverse=True)
    return candidates[0] if candidates else None


def cuda_include_dir() -> Path | None:
    """The CUDA headers (cuda_runtime.h), for host-only builds such as the tests' emulator."""
    candidates = []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        candidates.append(Path(home) / "include")
    nvcc = find_nvcc()
    if nvcc is not None:
        candidates.append(nvcc.resolve().parent.parent / "include")
    candidates += [
        p.parent.parent / "include"
        for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"), key=_version_key, reverse=True)
    ]
    return next((c for c in candidates if (c / "cuda_runtime.h").is_file()), None)


EMULATOR_SOURCE = "emulator.cpp"


def emulator_compiler() -> str | None:
    """The host C++ compiler the kernels' CPU emulators build with, if there is one."""
    return shutil.which("g++") or shutil.which("c++")


def emulator_missing() -> str | None:
    """None where the CPU emulators can be built here, else why not, in one line."""
    if emulator_compiler() is None or cuda_include_dir() is None:
        return "the CPU emulator needs a C++ compiler and the CUDA headers"
    return None


def compile_emulator(library: CudaLibrary, out: Path) -> Path:
    """`library`'s kernels on the CPU: its `emulator.cpp` (the kernels' own source, run by
    `cuda/emulator.h`) built as a host shared library at `out`, exporting the library's C ABI.
    UnsupportedError without a C++ compiler or the CUDA headers (for their types);
    SystemFailedError with the compiler's first lines when it fails."""
    if (why := emulator_missing()) is not None:
        raise UnsupportedError(why)
    cxx, include = emulator_compiler(), cuda_include_dir()
    cmd = [
        cxx,
        "-std=c++17",
        "-O2",
        "-shared",
        "-fPIC",
        "-Wno-attributes",
        "-Wno-unknown-pragmas",
        "-x",
        "c++",
        "-I",
        str(include),
        *library.include_flags,
        *library.define_flags,
        "-o",
        str(out),
        str(library.source_dir / EMULATOR_SOURCE),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemFailedError(
            f"{library.label} emulator: {cxx} exit {proc.returncode}: "
            + "\n".join(proc.stderr.strip().splitlines()[:20])
        )
    return out


def _version_key(path: Path) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", path.parent.parent.name)
    return tuple(int(n) for n in numbers) or (0,)


@cache
def _version_text(nvcc: Path) -> str:
    proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise UnsupportedError(
            f"{nvcc} --version failed (exit {proc.returncode}): {proc.stderr.strip()[:200]}"
        )
    return proc.stdout.strip()


@cache
def _listed_architectures(nvcc: Path) -> frozenset[int] | None:
    """The compute capabilities this nvcc builds, as `nvcc --list-gpu-arch` names them
    (compute_90 -> 90); None where it cannot say, and the build then finds out itself."""
    try:
        proc = subprocess.run(
            [str(nvcc), "--list-gpu-arch"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    numbers = frozenset(int(n) for n in re.findall(r"^compute_(\d+)$", proc.stdout, re.M))
    return numbers if proc.returncode == 0 and numbers else None


def check_targets(targets: Sequence[str], tools: Toolchain) -> None:
    """UnsupportedError, before any build starts, naming the targets this nvcc cannot build."""
    known = _listed_architectures(tools.nvcc)
    if known is None:
        return
    missing = [t for t in targets if target_number(t) not in known]
    if missing:
        listed = ", ".join(f"sm_{n}" for n in sorted(known))
        raise UnsupportedError(
            f"nvcc {tools.release} cannot build {', '.join(missing)}; it builds {listed} "
            "(nvcc --list-gpu-arch)"
        )


def toolchain() -> Toolchain:
    nvcc = find_nvcc()
    if nvcc is None:
        raise UnsupportedError(
            "nvcc not found: set CUDA_HOME or put nvcc on PATH (CUDA 12.8+ builds sm_90a, "
            "sm_100a, sm_120a)"
        )
    return Toolchain(nvcc=nvcc, version_text=_version_text(nvcc))


def target_for_capability(major: int, minor: int) -> str:
    """The target to build for a GPU: the architecture-specific one where the kernels have it."""
    return ARCH_SPECIFIC.get((major, minor), f"sm_{major}{minor}")


def parse_targets(arch: str) -> tuple[str, ...]:
    """'sm_90a, sm_120a' -> ('sm_90a', 'sm_120a'); UsageError names the bad entry."""
    targets: list[str] = []
    for item in (part.strip() for part in arch.split(",")):
        if not item:
            continue
        if not TARGET_RE.match(item):
            raise UsageError(
                f"--arch {item!r}: expected targets like sm_90a, sm_100a, sm_120a or sm_89, "
                "comma-separated"
            )
        if item not in targets:
            targets.append(item)
    if not targets:
        raise UsageError("--arch: give at least one target, e.g. sm_90a")
    return tuple(targets)


def target_number(target: str) -> int:
    """'sm_90a' -> 90, 'sm_120a' -> 120."""
    m = TARGET_RE.match(target)
    if not m:
        raise UsageError(f"not a build target: {target!r}")
    return int(m.group(1))


def gencode(target: str) -> tuple[str, ...]:
    m = TARGET_RE.match(target)
    if not m:
        raise UsageError(f"not a build target: {target!r}")
    arch = m.group(1) + m.group(2)
    return ("-gencode", f"arch=compute_{arch},code=sm_{arch}")


# ---------------------------------------------------------------- the cache key


def source_files(library: CudaLibrary) -> list[Path]:
    """The library's translation unit, every header beside it and the shared row layout (all
    can change the binary)."""
    main = library.source_dir / library.source
    if not main.is_file():
        raise UsageError(f"{main}: kernel source not found")
    return [main, *sorted(library.source_dir.glob("*.cuh")), ROW_LAYOUT_HEADER]


def build_digest(
    sources: Sequence[Path], flags: Sequence[str], toolchain_text: str, target: str
) -> str:
    h = hashlib.sha256()
    for part in (target, toolchain_text, "\0".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    for path in sources:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------- building


def build_library(
    target: str,
    library: CudaLibrary,
    *,
    root: Path = DEFAULT_ROOT,
    force: bool = False,
    tools: Toolchain | None = None,
) -> BuildResult:
    """`library` for `target`: from the cache when its hash matches, else compiled now."""
    tools = tools or toolchain()
    sources = source_files(library)
    flags = (*library.all_flags, *gencode(target))
    digest = build_digest(sources, flags, tools.version_text, target)
    final = Path(root) / f"{library.name}-{target}-{digest[:16]}"
    if not force:
        cached = _read_record(final, library)
        if cached is not None:
            return cached
    check_targets((target,), tools)
    Path(root).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{library.name}-{target}-", dir=root))
    try:
        result = _compile(target, library, digest, flags, sources, tools, work, final)
        if final.exists() and (force or _read_record(final, library) is None):
            shutil.rmtree(final)  # replaced on --force, or an incomplete directory
        try:
            os.replace(work, final)
        except OSError:  # a concurrent build of the same hash finished first: use it
            cached = _read_record(final, library)
            if cached is None:
                raise
            return cached
        return BuildResult(
            library.name,
            target,
            final / library.filename,
            digest,
            False,
            result.seconds,
            result.resources,
        )
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def build_libraries(
    targets: Sequence[str],
    libraries: Sequence[CudaLibrary],
    *,
    root: Path = DEFAULT_ROOT,
    force: bool = False,
    on_done: Callable[[str], None] | None = None,
    tools: Toolchain | None = None,
) -> list[BuildResult]:
    """Build every library for every target it builds for, in parallel (nvcc is
    single-threaded); results in (target, library) order."""
    tools = tools or toolchain()
    check_targets(targets, tools)
    jobs = [(t, lib) for t in targets for lib in libraries if lib.builds_for(t)]

    def one(job: tuple[str, CudaLibrary]) -> BuildResult:
        result = build_library(job[0], job[1], root=root, force=force, tools=tools)
        if on_done:
            on_done(f"{job[1].name} {job[0]}")
        return result

    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        return list(pool.map(one, jobs))


def _compile(
    target: str,
    library: CudaLibrary,
    digest: str,
    flags: Sequence[str],
    sources: Sequence[Path],
    tools: Toolchain,
    work: Path,
    final: Path,
) -> BuildResult:
    cmd = [
        str(tools.nvcc),
        *flags,
        *library.include_flags,
        "-o",
        str(work / library.filename),
        str(library.source_dir / library.source),
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(
            f"nvcc for the {library.name} library, {target}, did not finish in {exc.timeout:.0f} s",
            "",
            None,
        ) from None
    seconds = time.perf_counter() - start
    log = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        log_path = Path(final.parent) / f"failed-{library.name}-{target}.log"
        log_path.write_text(f"$ {' '.join(cmd)}\n{log}\n", encoding="utf-8")
        raise BuildError(
            f"nvcc failed for the {library.name} library, {target} (exit {proc.returncode}): "
            f"{first_error(log)} (full log: {log_path})",
            log,
            log_path,
        )
    resources = parse_ptxas(log)
    (work / "nvcc.log").write_text(f"$ {' '.join(cmd)}\n{log}\n", encoding="utf-8")
    record = {
        "name": library.name,
        "target": target,
        "digest": digest,
        "library": library.filename,
        "seconds": seconds,
        "nvcc": str(tools.nvcc),
        "nvcc_release": tools.release,
        "flags": list(flags),
        "sources": [p.name for p in sources],
        "resources": [asdict(r) for r in resources],
        "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    (work / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return BuildResult(
        library.name, target, work / library.filename, digest, False, seconds, resources
    )


def _read_record(directory: Path, library: CudaLibrary) -> BuildResult | None:
    """A finished build in `directory`, or None when there is none (or it is incomplete)."""
    record_path = directory / BUILD_RECORD
    path = directory / library.filename
    if not (record_path.is_file() and path.is_file()):
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        resources = tuple(KernelResources(**r) for r in record["resources"])
        return BuildResult(
            library.name,
            record["target"],
            path,
            record["digest"],
            True,
            float(record["seconds"]),
            resources,
        )
    except (ValueError, KeyError, TypeError):
        return None


def first_error(log: str) -> str:
    """The compiler's first error line (or its last line), for a one-line summary."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "no output"


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> tuple[KernelResources, ...]:
    """Per-kernel registers, spills and stack from `-Xptxas -v` output."""
    found: list[KernelResources] = []
    name, frame = None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            name, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME.search(line)) and name:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and name:
            found.append(
                KernelResources(kernel_label(name), int(m.group(1)), frame[1], frame[2], frame[0])
            )
            name = None
    return tuple(found)


_INDEX_TYPES = {"i": "int32", "l": "int64"}


def kernel_label(mangled: str) -> str:
    """A mangled kernel name as a short label.

    '_ZN9nopecache30concat_and_cache_ds_mla_kernelIlEEv...'
    -> 'concat_and_cache_ds_mla_kernel<int64>'
    """
    m = re.match(r"_ZN9nopecache(\d+)", mangled)
    if not m:
        return mangled
    start = m.end()
    name = mangled[start : start + int(m.group(1))]
    rest = mangled[start + len(name) :]
    if rest.startswith("I") and len(rest) > 1:
        return f"{name}<{_INDEX_TYPES.get(rest[1], rest[1])}>"
    return name


# ---------------------------------------------------------------- loading

_load_lock = threading.Lock()
_loaded: dict[tuple[str, str], ctypes.CDLL] = {}


@dataclass(frozen=True)
class Binding:
    """What the Python side expects of a library: every exported function's C signature, and
    the ABI version its `abi_symbol` must answer (bumped whenever a signature or struct
    changes)."""

    library: CudaLibrary
    signatures: Mapping[str, tuple[list, Any]]
    abi_symbol: str
    abi_version: int


def declare(lib: ctypes.CDLL, signatures: Mapping[str, tuple[list, Any]]) -> ctypes.CDLL:
    """Give every exported function its C signature (ctypes would guess int otherwise)."""
    for name, (args, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = restype
    return lib


def load(
    binding: Binding,
    capability: tuple[int, int],
    on_built: Callable[[str], None] | None = None,
) -> ctypes.CDLL:
    """`binding`'s library for a GPU of this capability: built on first use (then cached on
    disk), loaded once a process, its signatures declared and its ABI version checked.
    `on_built` hears one line when nvcc ran."""
    library = binding.library
    target = target_for_capability(*capability)
    if not library.builds_for(target):
        raise UnsupportedError(
            f"the {library.label} need sm_{library.min_sm} or newer, not {target}"
        )
    with _load_lock:
        key = (library.name, target)
        if key not in _loaded:
            result = build_library(target, library)
            if not result.cached and on_built is not None:
                on_built(
                    f"built the {library.label} for {target} in {result.seconds:.1f} s: "
                    f"{result.library}"
                )
            lib = declare(ctypes.CDLL(str(result.library)), binding.signatures)
            version = getattr(lib, binding.abi_symbol)()
            if version != binding.abi_version:
                raise UnsupportedError(
                    f"{result.library} has ABI {version}, expected {binding.abi_version}: "
                    "rebuild with `nopebench build --force`"
                )
            _loaded[key] = lib
        return _loaded[key]
