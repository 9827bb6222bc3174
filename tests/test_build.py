"""`nopebench build`: targets, the hash-keyed cache (a second build never calls nvcc), the
compiler's message on failure, and the real compile-only build of all three targets."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import stat
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nopebench import cuda_build as b
from nopebench import geometry as g
from nopebench.cache_kernels.library import ABI_VERSION, CACHE_LIBRARY, declare
from nopebench.cli import app
from nopebench.commands import build as command
from nopebench.commands.options import BuildOptions
from nopebench.errors import SystemFailedError, UnsupportedError, UsageError
from nopebench.impls.native import register_library
from nopebench.impls.native.constants import REG_INDEX_CAP
from nopebench.impls.native.register_library import REGISTER_LIBRARY

HAS_NVCC = b.find_nvcc() is not None
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found")

WRITE_KERNEL = "_ZN9nopecache30concat_and_cache_ds_mla_kernelIlEEvPhli"
FAKE_NVCC = """#!/usr/bin/env bash
# Stands in for nvcc: counts its compile calls, writes the -o file, prints ptxas-style lines.
if [ "$1" = "--version" ]; then
    echo "Cuda compilation tools, release 13.0, V13.0.0 (fake)"; exit 0
fi
if [ "$1" = "--list-gpu-arch" ]; then
    printf 'compute_%s\\n' 75 80 86 89 90 100 120; exit 0
fi
echo call >> "{counter}"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "not a library" > "$out"
cat >&2 <<'EOF'
ptxas info    : Compiling entry function '{kernel}' for 'sm_90a'
ptxas info    : Function properties for {kernel}
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
ptxas info    : Compiling entry function '_ZN9nopecache23gather_upconvert_kernelEPKhli' for 'sm_90a'
ptxas info    : Function properties for _ZN9nopecache23gather_upconvert_kernelEPKhli
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
EOF
"""


@pytest.fixture
def fake_tools(tmp_path: Path) -> tuple[b.Toolchain, Path, Path]:
    """(toolchain with a counting fake nvcc, its call counter, a source dir copy)."""
    counter = tmp_path / "calls"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC.format(counter=counter, kernel=WRITE_KERNEL))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    src = tmp_path / "src"
    src.mkdir()
    (src / CACHE_LIBRARY.source).write_text("// kernel\n")
    (src / "numerics.cuh").write_text("// header\n")
    return b.Toolchain(nvcc, "Cuda compilation tools, release 13.0 (fake)"), counter, src


def at(src: Path, **changes) -> b.CudaLibrary:
    """The cache library's description with its sources in `src` (and any other changes)."""
    return dataclasses.replace(CACHE_LIBRARY, source_dir=src, **changes)


def calls(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


# ---------------------------------------------------------------- targets


@pytest.mark.parametrize(
    ("cap", "target"),
    [
        ((9, 0), "sm_90a"),
        ((10, 0), "sm_100a"),
        ((12, 0), "sm_120a"),
        ((8, 9), "sm_89"),
        ((10, 3), "sm_103"),
        ((12, 1), "sm_121"),
    ],
)
def test_target_for_capability(cap, target):
    assert b.target_for_capability(*cap) == target


def test_parse_targets_dedupes_and_rejects():
    assert b.parse_targets(" sm_90a,sm_120a , sm_90a") == ("sm_90a", "sm_120a")
    for bad in ("sm_9", "90a", "sm_90b", "compute_90a", " , "):
        with pytest.raises(UsageError):
            b.parse_targets(bad)


def test_gencode_names_the_architecture_specific_target():
    assert b.gencode("sm_100a") == ("-gencode", "arch=compute_100a,code=sm_100a")
    assert b.gencode("sm_89") == ("-gencode", "arch=compute_89,code=sm_89")


def test_find_nvcc_prefers_cuda_home(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert b.find_nvcc() == nvcc


def test_flags_never_use_fast_math():
    for library in command.LIBRARIES:
        flags = " ".join(library.all_flags)
        assert "fast-math" not in flags and "-ftz=false" in flags and "-prec-div=true" in flags
    assert "-fmad=false" in CACHE_LIBRARY.flags  # bit-exact with the reference


# ---------------------------------------------------------------- the cache


def test_second_build_does_not_call_nvcc(tmp_path, fake_tools):
    tools, counter, src = fake_tools
    first = b.build_library("sm_90a", at(src), root=tmp_path / "root", tools=tools)
    second = b.build_library("sm_90a", at(src), root=tmp_path / "root", tools=tools)
    assert calls(counter) == 1
    assert not first.cached and second.cached
    assert first.library == second.library and second.library.is_file()
    assert [d.name for d in (tmp_path / "root").iterdir()] == [
        first.directory.name
    ]  # no temp dirs left


def test_changed_source_flags_target_or_force_rebuild(tmp_path, fake_tools):
    tools, counter, src = fake_tools
    root = tmp_path / "root"
    first = b.build_library("sm_90a", at(src), root=root, tools=tools)
    (src / "numerics.cuh").write_text("// header, changed\n")
    second = b.build_library("sm_90a", at(src), root=root, tools=tools)
    assert calls(counter) == 2 and second.digest != first.digest
    b.build_library("sm_120a", at(src), root=root, tools=tools)
    assert calls(counter) == 3
    forced = b.build_library("sm_90a", at(src), root=root, tools=tools, force=True)
    assert calls(counter) == 4 and not forced.cached and forced.digest == second.digest
    extra = at(src, flags=(*CACHE_LIBRARY.flags, "-DEXTRA"))
    b.build_library("sm_90a", extra, root=root, tools=tools)
    assert calls(counter) == 5
    newer = b.Toolchain(tools.nvcc, tools.version_text + " update 1")
    b.build_library("sm_90a", at(src), root=root, tools=newer)
    assert calls(counter) == 6
    shaped = at(src, defines=(("NOPEDECODE_STAGES", 3),))  # a constant the source takes
    assert "-DNOPEDECODE_STAGES=3" in shaped.all_flags
    b.build_library("sm_90a", shaped, root=root, tools=tools)
    assert calls(counter) == 7


def test_every_library_reads_the_shared_row_layout():
    """row_layout.h is a source of both libraries (a change rebuilds them), found on their include
    path, and its values come from geometry as -D flags."""
    for library in command.LIBRARIES:
        assert b.ROW_LAYOUT_HEADER in b.source_files(library)
        assert str(b.CUDA_INCLUDE) in library.include_flags
        assert f"-DNOPE_ROW_ROPE_OFFSET={g.ROPE_OFFSET}" in library.all_flags


def test_ptxas_resources_are_recorded(tmp_path, fake_tools):
    tools, _, src = fake_tools
    built = b.build_library("sm_90a", at(src), root=tmp_path / "root", tools=tools)
    cached = b.build_library("sm_90a", at(src), root=tmp_path / "root", tools=tools)
    expected = (
        b.KernelResources("concat_and_cache_ds_mla_kernel<int64>", 32, 4, 4, 8),
        b.KernelResources("gather_upconvert_kernel", 40, 0, 0, 0),
    )
    assert built.resources == expected and cached.resources == expected
    assert "Used 32 registers" in (built.directory / "nvcc.log").read_text()


def test_incomplete_build_dir_is_not_trusted(tmp_path, fake_tools):
    tools, counter, src = fake_tools
    first = b.build_library("sm_90a", at(src), root=tmp_path / "root", tools=tools)
    (first.directory / b.BUILD_RECORD).unlink()
    b.build_library("sm_90a", at(src), root=tmp_path / "root", tools=tools)
    assert calls(counter) == 2


# ---------------------------------------------------------------- failures


@needs_nvcc
def test_compiler_error_is_one_line_plus_the_full_log(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / CACHE_LIBRARY.source).write_text('extern "C" int f() { return undefined_name; }\n')
    with pytest.raises(b.BuildError) as info:
        b.build_library("sm_90a", at(src), root=tmp_path / "root")
    err = info.value
    assert (
        "\n" not in str(err)
        and "nvcc failed for the cache library, sm_90a" in str(err)
        and "undefined_name" in str(err)
    )
    assert "undefined_name" in err.log and err.log_path.is_file()
    assert not list((tmp_path / "root").glob("*sm_90a-*"))  # nothing cached for a failed build


def test_build_command_prints_compiler_output_then_raises(monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise b.BuildError(
            "nvcc failed for sm_90a (exit 1): x.cu(3): error: boom",
            "x.cu(3): error: boom\n1 error detected",
            None,
        )

    monkeypatch.setattr(command, "build_libraries", failing)
    with pytest.raises(SystemFailedError, match="nvcc failed for sm_90a"):
        command.execute(BuildOptions(arch=None, compile_only=True, force=False))
    assert "1 error detected" in capsys.readouterr().err


def test_a_failing_compiler_exits_4_in_one_line(monkeypatch):
    def failing(*args, **kwargs):
        raise b.BuildError("nvcc failed for sm_90a (exit 1): x.cu(3): error: boom", "log", None)

    monkeypatch.setattr(command, "build_libraries", failing)
    result = CliRunner().invoke(app, ["build", "--arch", "sm_90a"])
    assert result.exit_code == 4  # the toolchain failed, not the input
    assert result.stderr.splitlines()[-1] == (
        "nopebench: error: nvcc failed for sm_90a (exit 1): x.cu(3): error: boom"
    )


def test_build_without_gpu_or_arch_exits_3(monkeypatch):
    monkeypatch.setattr(command, "_local_target", lambda: None)
    result = CliRunner().invoke(app, ["build"])
    assert result.exit_code == 3 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "no CUDA GPU" in line and "--compile-only" in line


def test_build_without_gpu_needs_compile_only(monkeypatch):
    monkeypatch.setattr(command, "_local_target", lambda: None)
    with pytest.raises(UnsupportedError, match="--compile-only"):
        command.execute(BuildOptions(arch=None, compile_only=False, force=False))


def test_cli_rejects_a_bad_arch_with_exit_2():
    result = CliRunner().invoke(app, ["build", "--compile-only", "--arch", "sm_9x"])
    assert result.exit_code == 2
    assert "sm_9x" in result.output


def test_a_target_nvcc_does_not_list_is_refused_before_any_compile(tmp_path, fake_tools):
    tools, counter, src = fake_tools
    with pytest.raises(UnsupportedError, match="cannot build sm_42;"):
        b.build_library("sm_42", at(src), root=tmp_path / "r", tools=tools)
    with pytest.raises(UnsupportedError) as info:
        b.build_libraries(("sm_90a", "sm_42", "sm_95"), [at(src)], root=tmp_path / "r", tools=tools)
    line = str(info.value)
    assert "\n" not in line and line.startswith("nvcc 13.0 cannot build sm_42, sm_95;")
    assert "sm_90, sm_100, sm_120" in line
    assert calls(counter) == 0 and not (tmp_path / "r").exists()


def test_an_nvcc_that_lists_nothing_leaves_the_targets_to_the_build(tmp_path, fake_tools):
    tools, counter, src = fake_tools
    listing = "printf 'compute_%s\\n' 75 80 86 89 90 100 120; exit 0"
    assert listing in tools.nvcc.read_text()
    text = tools.nvcc.read_text().replace(listing, "exit 1")  # an nvcc without the option
    quiet = tmp_path / "quiet" / "nvcc"
    quiet.parent.mkdir()
    quiet.write_text(text)
    quiet.chmod(0o755)
    b.build_library("sm_42", at(src), root=tmp_path / "r", tools=b.Toolchain(quiet, "fake"))
    assert calls(counter) == 1


@needs_nvcc
def test_build_of_an_architecture_this_nvcc_lacks_exits_3_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["build", "--arch", "sm_42"])
    assert result.exit_code == 3 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "cannot build sm_42" in line and "nvcc --list-gpu-arch" in line


def test_missing_nvcc_is_unsupported(monkeypatch):
    monkeypatch.setattr(b, "find_nvcc", lambda: None)
    with pytest.raises(UnsupportedError, match="nvcc not found"):
        b.toolchain()


def test_an_emulator_without_a_host_compiler_is_unsupported_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(b, "emulator_compiler", lambda: None)
    assert b.emulator_missing() == "the CPU emulator needs a C++ compiler and the CUDA headers"
    with pytest.raises(UnsupportedError, match="^the CPU emulator needs a C"):
        b.compile_emulator(REGISTER_LIBRARY, tmp_path / "lib.so")
    assert not (tmp_path / "lib.so").exists()


def _compile_layout(tmp_path: Path, defines: tuple[str, ...]) -> tuple[int, str]:
    """A host program printing row_layout.h's constants, compiled with `defines`: (exit, output
    or the compiler's error)."""
    src = tmp_path / "layout.cpp"
    src.write_text(
        '#include <stdio.h>\n#include "row_layout.h"\n'
        'int main() { printf("%d %d %d %d %d\\n", nope_row::kLatent, nope_row::kScaleOffset, '
        "nope_row::kRopeOffset, nope_row::kFullRow, nope_row::kUpconvert); }\n"
    )
    exe = tmp_path / "layout"
    cmd = [b.emulator_compiler(), "-std=c++17", "-I", str(b.CUDA_INCLUDE), *defines]
    proc = subprocess.run([*cmd, "-o", str(exe), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        return proc.returncode, proc.stderr
    return 0, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(b.emulator_compiler() is None, reason="no host C++ compiler")
def test_the_row_layout_header_takes_geometry_and_refuses_anything_else(tmp_path):
    flags = CACHE_LIBRARY.define_flags
    rc, out = _compile_layout(tmp_path, flags)
    assert rc == 0, out
    expected = (g.LATENT_DIM, g.SCALE_OFFSET, g.ROPE_OFFSET, g.FULL_ROW_BYTES, g.UPCONVERT_DIM)
    assert tuple(int(v) for v in out.split()) == expected
    rc, out = _compile_layout(tmp_path, ())  # compiled outside the package's build
    assert rc != 0 and "build through nopebench.cuda_build" in out
    moved = tuple(f if "ROPE_OFFSET" not in f else "-DNOPE_ROW_ROPE_OFFSET=532" for f in flags)
    rc, out = _compile_layout(tmp_path, moved)  # a layout the kernels' lane maps do not fit
    assert rc != 0 and "one fp32 scale a tile" in out


# ---------------------------------------------------------------- the real compile-only build


@needs_nvcc
def test_compile_only_builds_three_loadable_libraries(capsys):
    """What `make ci` runs: sm_90a, sm_100a and sm_120a, for each the cache library and the
    register decode library, shared libraries whose embedded device code is for their target
    and whose C ABI answers (no GPU needed to load them); both decode kernels spill-free."""
    assert command.execute(BuildOptions(arch=None, compile_only=True, force=False)) == 0
    table = capsys.readouterr().out
    assert (
        "native decode kernels (Gluon, sm_90)" in table
    )  # compiled within budget, or said why not
    # cached now: no nvcc call
    results = b.build_libraries(b.COMPILE_ONLY_TARGETS, command.LIBRARIES)
    assert all(r.cached for r in results)
    assert [(r.name, r.target) for r in results] == [
        (lib.name, t) for t in b.COMPILE_ONLY_TARGETS for lib in command.LIBRARIES
    ]
    for r in results:
        assert r.target in table
        data = r.library.read_bytes()
        assert data[:4] == b"\x7fELF"
        assert f"-arch {r.target}".encode() in data
        if r.name == REGISTER_LIBRARY.name:
            lib = b.declare(ctypes.CDLL(os.fspath(r.library)), register_library.SIGNATURES)
            assert lib.nopedecode_abi_version() == register_library.ABI_VERSION
            assert lib.nopedecode_params_bytes() == ctypes.sizeof(register_library.Params)
            assert lib.nopedecode_index_cap() == REG_INDEX_CAP
            assert register_library.check_library(lib) is lib  # struct, index cap
            assert {k.kernel for k in r.resources} == {
                "register_decode_qk512",
                "register_decode_qk576",
            }
            assert all(k.spill_stores == 0 and k.stack_bytes == 0 for k in r.resources)
            continue
        lib = declare(ctypes.CDLL(os.fspath(r.library)))
        assert lib.nopecache_abi_version() == ABI_VERSION
        assert {k.kernel for k in r.resources} == {
            "concat_and_cache_ds_mla_kernel<int32>",
            "concat_and_cache_ds_mla_kernel<int64>",
            "gather_upconvert_kernel",
        }
        assert all(k.spill_stores <= 8 for k in r.resources)  # a big spill would be a regression


def test_register_library_is_not_built_below_sm89(tmp_path, fake_tools):
    """Its e4m3x2 conversion needs SM89: an sm_80 build makes the cache library alone."""
    tools, counter, src = fake_tools
    libs = (
        at(src),
        dataclasses.replace(REGISTER_LIBRARY, source_dir=src, source=CACHE_LIBRARY.source),
    )
    assert REGISTER_LIBRARY.builds_for("sm_89") and REGISTER_LIBRARY.builds_for("sm_120a")
    assert not REGISTER_LIBRARY.builds_for("sm_80")
    results = b.build_libraries(("sm_80", "sm_90a"), libs, root=tmp_path / "root", tools=tools)
    assert [(r.name, r.target) for r in results] == [
        ("cache", "sm_80"),
        ("cache", "sm_90a"),
        ("decode", "sm_90a"),
    ]
    assert calls(counter) == 3


@needs_nvcc
def test_register_library_refuses_what_its_kernel_cannot_take_before_any_cuda_call():
    """The launcher's own argument checks, run on the CPU (they return before any CUDA call):
    cudaErrorInvalidValue for every shape the kernel cannot take, 0 for an empty launch."""
    built = b.build_library("sm_90a", REGISTER_LIBRARY)
    lib = b.declare(ctypes.CDLL(os.fspath(built.library)), register_library.SIGNATURES)
    good = dict(
        q=16,
        q_stride_t=16 * 512,
        q_stride_h=512,
        cache=16,
        indices=16,
        idx_stride_t=2176,
        out=16,
        lse=16,
        part=0,
        part_lse=0,
        scale_log2=0.09,
        row_bytes=528,
        tokens=0,
        heads=16,
        width=2176,
        per_split=2176,
        splits=1,
    )

    def code(rope: int = 0, **change) -> int:
        params = register_library.Params(**{**good, **change})
        return lib.nopedecode_register_decode(ctypes.byref(params), rope, None)

    assert code() == 0 and code(rope=1, row_bytes=656) == 0 and code(row_bytes=656) == 0
    invalid = 1  # cudaErrorInvalidValue
    assert lib.nopedecode_error_string(invalid) == b"invalid argument"
    for change in (
        dict(heads=20),  # not whole 16-head blocks
        dict(per_split=2200),  # not whole 32-key blocks
        dict(per_split=REG_INDEX_CAP + 32, width=REG_INDEX_CAP + 32),  # more than it stages
        dict(per_split=1088),  # two splits' worth in one
        dict(splits=2),  # an empty split
        dict(row_bytes=600),
        dict(q_stride_h=514),  # q rows not 8-byte aligned
        dict(q=18),
        dict(cache=8),  # rows not 16-byte aligned
        dict(width=0),
    ):
        assert code(**change) == invalid, change
    assert code(rope=1) == invalid  # RoPE lanes need 656-byte rows
