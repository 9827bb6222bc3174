"""`nopebench build`: compile the CUDA libraries (the cache kernels and the native register
decode kernel), show what ptxas made of them, load them; with --compile-only also the SM90
Gluon decode kernels (Triton, no GPU needed)."""

from __future__ import annotations

from rich.markup import escape

from nopebench import console as out
from nopebench.cache_kernels.library import CACHE_LIBRARY
from nopebench.commands.options import BuildOptions
from nopebench.cuda_build import (
    COMPILE_ONLY_TARGETS,
    DEFAULT_ROOT,
    BuildError,
    BuildResult,
    build_libraries,
    parse_targets,
    target_for_capability,
)
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, UnsupportedError
from nopebench.impls.native.register_library import REGISTER_LIBRARY

LIBRARIES = (CACHE_LIBRARY, REGISTER_LIBRARY)


def execute(opts: BuildOptions, root=DEFAULT_ROOT) -> int:
    """Build the requested targets (default: the local GPU's; with --compile-only: sm_90a,
    sm_100a and sm_120a, no GPU needed) and, unless compile-only, load the local one."""
    arch, compile_only, force = opts.arch, opts.compile_only, opts.force
    local = None if compile_only else _local_target()
    if arch:
        targets = parse_targets(arch)
    elif compile_only:
        targets = COMPILE_ONLY_TARGETS
    elif local is None:
        raise UnsupportedError(
            "no CUDA GPU is visible to build for: use --compile-only (sm_90a, sm_100a, sm_120a) "
            "or --arch LIST"
        )
    else:
        targets = (local,)
    jobs = sum(lib.builds_for(t) for t in targets for lib in LIBRARIES)
    try:
        with out.progress_bar("build", total=jobs) as advance:
            results = build_libraries(targets, LIBRARIES, root=root, force=force, on_done=advance)
    except BuildError as exc:
        out.err_console.print(escape(exc.log), highlight=False, soft_wrap=True)
        raise
    loaded = None
    if local is not None and local in targets:
        import torch

        from nopebench.cache_kernels.library import load_library
        from nopebench.impls.native import register_library

        load_library(torch.device("cuda"))
        if REGISTER_LIBRARY.builds_for(local):
            register_library.load_library(torch.device("cuda"))
        loaded = local
    print_builds(results, loaded)
    if compile_only:
        return build_native_hopper()
    return EXIT_OK


def build_native_hopper() -> int:
    """Compile the SM90 decode kernels in each planned shape; exit 1 if one spills, lacks wgmma
    or outgrows the shared memory the planner assumed. On a GPU the kernels compile when they
    run."""
    from nopebench.impls.native import build as hopper_build

    title = "nopebench build: native decode kernels (Gluon, sm_90)"
    if (reason := hopper_build.gluon_missing()) is not None:
        out.console.print(f"{title}: skipped, {reason}", highlight=False)
        return EXIT_OK
    try:
        with out.progress_bar("native sm_90", total=hopper_build.BUILD_COUNT) as advance:
            builds = hopper_build.build_hopper(on_done=advance)
    except Exception as exc:  # noqa: BLE001 - Triton's compile errors have no common type
        summary = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise BuildError(
            f"Triton failed to compile the native Hopper kernel: {summary}", str(exc), None
        ) from None
    rows = [
        (
            b.shape,
            "; ".join(b.problems) or "ok",
            b.seconds,
            b.registers,
            b.stack_bytes,
            b.shared_bytes,
            b.planned_bytes,
        )
        for b in builds
    ]
    columns = ["shape", "result", "compile s", "regs", "stack B", "shared B", "planned B"]
    out.console.print(out.table(title, columns, rows))
    return EXIT_CHECK_FAILED if any(b.problems for b in builds) else EXIT_OK


def _local_target() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return target_for_capability(*torch.cuda.get_device_capability(0))


def print_builds(results: list[BuildResult], loaded: str | None) -> None:
    """One row per (library, target, kernel): registers and spills decide occupancy and speed.
    A library whose instructions a target lacks is not built for it, and says so."""
    rows = []
    for r in results:
        status = ("cached" if r.cached else "built") + (", loaded" if r.target == loaded else "")
        for k in r.resources or ():
            kernel = k.kernel.replace("_kernel", "")
            rows.append(
                (
                    r.name,
                    r.target,
                    status,
                    r.seconds,
                    kernel,
                    k.registers,
                    f"{k.spill_stores}/{k.spill_loads}",
                    k.stack_bytes,
                )
            )
    columns = [
        "library",
        "target",
        "result",
        "compile s",
        "kernel",
        "regs",
        "spill B st/ld",
        "stack B",
    ]
    out.console.print(out.table("nopebench build: CUDA libraries", columns, rows))
    for r in results:
        out.console.print(f"{r.name} {r.target}: {r.library}", highlight=False, soft_wrap=True)
    built = {(r.name, r.target) for r in results}
    for lib in LIBRARIES:
        for target in sorted({r.target for r in results}):
            if (lib.name, target) not in built:
                out.console.print(
                    f"{lib.name} {target}: not built (needs sm_{lib.min_sm} or newer)",
                    highlight=False,
                )
