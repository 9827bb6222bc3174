"""`nopebench build`: compile the cache kernels, show what ptxas made of them, load them."""

from __future__ import annotations

from rich.markup import escape

from nopebench import console as out
from nopebench.cache_kernels.build import (
    COMPILE_ONLY_TARGETS,
    DEFAULT_ROOT,
    BuildError,
    BuildResult,
    build_libraries,
    parse_targets,
    target_for_capability,
)
from nopebench.errors import EXIT_OK, UnsupportedError


def build_command(arch: str | None, compile_only: bool, force: bool, root=DEFAULT_ROOT) -> int:
    """Build the requested targets (default: the local GPU's; with --compile-only: sm_90a,
    sm_100a and sm_120a, no GPU needed) and, unless compile-only, load the local one."""
    local = None if compile_only else _local_target()
    if arch:
        targets = parse_targets(arch)
    elif compile_only:
        targets = COMPILE_ONLY_TARGETS
    elif local is None:
        raise UnsupportedError("no CUDA GPU is visible to build for: use --compile-only (sm_90a, sm_100a, sm_120a) or --arch LIST")
    else:
        targets = (local,)
    try:
        with out.progress_bar("build", total=len(targets)) as advance:
            results = build_libraries(targets, root=root, force=force, on_done=advance)
    except BuildError as exc:
        out.err_console.print(escape(exc.log), highlight=False, soft_wrap=True)
        raise
    loaded = None
    if local is not None and local in targets:
        import torch

        from nopebench.cache_kernels.library import load_library

        load_library(torch.device("cuda"))
        loaded = local
    print_builds(results, loaded)
    return EXIT_OK


def _local_target() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return target_for_capability(*torch.cuda.get_device_capability(0))


def print_builds(results: list[BuildResult], loaded: str | None) -> None:
    """One row per (target, kernel): registers and spills decide occupancy and speed."""
    rows = []
    for r in results:
        status = ("cached" if r.cached else "built") + (", loaded" if r.target == loaded else "")
        for k in r.resources or ():
            kernel = k.kernel.replace("_kernel", "")
            rows.append((r.target, status, r.seconds, kernel, k.registers, f"{k.spill_stores}/{k.spill_loads}", k.stack_bytes))
    columns = ["target", "result", "compile s", "kernel", "regs", "spill B st/ld", "stack B"]
    out.console.print(out.table("nopebench build: CUDA cache kernels", columns, rows))
    for r in results:
        out.console.print(f"{r.target}: {r.library}", highlight=False, soft_wrap=True)
