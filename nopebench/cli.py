"""The command line: parse, dispatch, exit. Each command's work lives in its capability module,
imported lazily so `nopebench --help` and a bad argument never pay for torch or lm-eval."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # the click typer uses: its own copy in newer releases, the click package before
    from typer.core import _click as click
except ImportError:
    import click

from nopebench import SUMMARY, __version__
from nopebench.commands import options as o
from nopebench.errors import (
    EXIT_INTERRUPTED,
    EXIT_SYSTEM_FAILED,
    EXIT_USAGE,
    NopebenchError,
)

PROG = "nopebench"
# click 8.2+ raises this for a bare `nopebench`; older click shows the help by itself.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _OneLineErrors(TyperGroup):
    """Click's and typer's own errors (an unknown flag, a value out of range) as the one line
    every other error is, instead of typer's boxed usage text; exit 2, as click gives them."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(
                args=args,
                prog_name=prog_name or PROG,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except _NO_ARGS_IS_HELP as exc:
            click.echo(exc.ctx.get_help())
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            from nopebench.console import error_line

            ctx = getattr(exc, "ctx", None)
            where = f" (see `{ctx.command_path} -h`)" if ctx is not None else ""
            error_line(f"{exc.format_message().rstrip('.')}{where}")
            sys.exit(exc.exit_code)
        except typer.Abort:
            from nopebench.console import error_line

            error_line("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        print(f"{PROG} {__version__}")
        raise typer.Exit(0)


@app.callback(
    help=f"{SUMMARY}.\n\nExit codes: 0 ok, 1 a check failed, 2 bad input, 3 this machine cannot "
    "run that, 4 the server or machine failed, 130 interrupted."
)
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """The command group: its help (the description and the exit codes) is the decorator's."""


ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Model config: a YAML path or a bundled name (glm53-flash, glm5, dsv32).",
    ),
]
BenchModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Model config, replacing the bench config's.")
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print the result records as JSON on stdout; tables go to stderr."),
]
ResultsOpt = Annotated[
    Path | None,
    typer.Option("--results-dir", help="Root for run directories (default: ./results)."),
]
NoiseFloorOpt = Annotated[
    float,
    typer.Option(
        "--noise-floor",
        metavar="FRACTION",
        help="Run-to-run noise: a cell is marked only beyond the larger of its two spreads and "
        "this fraction, in [0, 1); the default is the largest difference between two H200 grids "
        "of the same code, rounded up; 0: the spreads alone.",
    ),
]


def _dispatch(fn: Callable[[], int], json_out: bool = False) -> None:
    """Run a command body and exit with its code. Every error is one line on stderr with its
    exit code (errors.py), never a traceback, and a run directory the command had opened gets
    the status it ended in (`error`, `interrupted`) instead of staying `running`.

    With `json_out` stdout carries only the JSON document; tables and status go to stderr.
    """
    from nopebench import console as out

    try:
        with out.data_on_stdout(json_out):
            code = fn()
    except NopebenchError as exc:
        _close_open_runs("error", str(exc))
        out.error_line(str(exc))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        _close_open_runs("interrupted", "interrupted")
        out.error_line("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except OSError as exc:
        if exc.errno == errno.EPIPE:  # the reader of a pipe went away: nothing left to say
            _close_open_runs("interrupted", "output pipe closed")
            with contextlib.suppress(OSError):  # no second complaint when Python flushes stdout
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(EXIT_INTERRUPTED) from None
        message, code = describe_os_error(exc)
        _close_open_runs("error", message)
        out.error_line(message)
        raise typer.Exit(code) from None
    except BaseException as exc:
        _close_open_runs("error", f"{type(exc).__name__}: {exc}")
        raise
    raise typer.Exit(code)


# A path or permission problem is the user's to fix (exit 2); the rest (a full disk, an I/O
# error) is the machine failing (exit 4).
_PATH_ERRNOS = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENAMETOOLONG,
    errno.ELOOP,
    errno.ENOTEMPTY,
}


def describe_os_error(exc: OSError) -> tuple[str, int]:
    """One line and an exit code for an OSError that reached the command line."""
    what = exc.strerror or str(exc)
    where = f"{exc.filename}: " if exc.filename is not None else ""
    code = EXIT_USAGE if exc.errno in _PATH_ERRNOS else EXIT_SYSTEM_FAILED
    return f"{where}{what}", code


def _close_open_runs(status: str, error: str) -> None:
    """Give every run directory still `running` in this process its final status. records is
    looked up, not imported: if it was never imported, no run directory was opened."""
    records = sys.modules.get("nopebench.records")
    if records is not None:
        records.close_open_runs(status, error)


@app.command(
    help="Compile the CUDA cache kernels (cached by source hash); "
    "--compile-only also the SM90 decode kernel."
)
def build(
    arch: Annotated[
        str | None,
        typer.Option(help="Comma-separated targets, e.g. sm_90a,sm_120a (default: the local GPU)."),
    ] = None,
    compile_only: Annotated[
        bool,
        typer.Option(
            "--compile-only",
            help="Build sm_90a, sm_100a and sm_120a and the SM90 decode kernel without a GPU; "
            "load nothing.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild even when the source hash is unchanged.")
    ] = False,
) -> None:
    from nopebench.commands import build as command

    _dispatch(
        lambda: command.execute(o.BuildOptions(arch=arch, compile_only=compile_only, force=force))
    )


@app.command(
    "verify-layout",
    help="Write random rows into a sentinel-filled cache "
    "and check every byte of the fp8_ds_mla layout.",
)
def verify_layout(
    model: ModelOpt = o.DEFAULT_MODEL,
    impl: Annotated[str, typer.Option(help="reference, cuda or all.")] = o.VerifyLayoutOptions.impl,
    tokens: Annotated[
        int, typer.Option(min=1, max=1 << 20, help="Tokens written per case.")
    ] = o.VerifyLayoutOptions.tokens,
    seed: Annotated[
        int, typer.Option(help="Base seed; each case derives its own from its id.")
    ] = 0,
    sweep: Annotated[
        bool,
        typer.Option("--sweep", help="The full grid: T x block size x row size x scale format."),
    ] = False,
    results_dir: ResultsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from nopebench.commands import verify_layout as command

    opts = o.VerifyLayoutOptions(model, impl, tokens, seed, sweep, o.Output(results_dir, json_out))
    _dispatch(lambda: command.execute(opts), json_out)


@app.command(
    "check-pagetable",
    help="Check the sparse page table is sized by the top-k buffer width, "
    "with FlashInfer's own validation.",
)
def check_pagetable(
    model: ModelOpt = o.DEFAULT_MODEL,
    seed: Annotated[int, typer.Option(help="Seed for the random decode checks.")] = 0,
    results_dir: ResultsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from nopebench.commands import check_pagetable as command

    opts = o.CheckPagetableOptions(model, seed, o.Output(results_dir, json_out))
    _dispatch(lambda: command.execute(opts), json_out)


@app.command("bench-decode")
def bench_decode(
    config: Annotated[
        str,
        typer.Option(
            "--config", "-c", help="Bench config: a YAML path or a bundled name (h200-nope)."
        ),
    ] = o.DEFAULT_BENCH_CONFIG,
    model: BenchModelOpt = None,
    impl: Annotated[
        list[str] | None,
        typer.Option(help="Implementations to run (repeat); default: the config's."),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="A small grid and short timing budget.")
    ] = False,
    baseline: Annotated[
        Path | None,
        typer.Option(help="A previous bench-decode results.csv to mark regressions against."),
    ] = None,
    noise_floor: NoiseFloorOpt = o.DEFAULT_NOISE_FLOOR,
    heads: Annotated[
        list[int] | None, typer.Option("--heads", help="Only these head counts (repeat).")
    ] = None,
    tokens: Annotated[
        list[int] | None, typer.Option("--tokens", help="Only these query-token counts (repeat).")
    ] = None,
    width: Annotated[
        list[int] | None, typer.Option("--width", help="Only these top-k widths (repeat).")
    ] = None,
    mode: Annotated[
        list[str] | None,
        typer.Option("--mode", help="Only these modes: nope, nope-pool, shim (repeat)."),
    ] = None,
    results_dir: ResultsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check, then time, sparse MLA decode: NoPE against the shim, FlashMLA and FlashInfer."""
    from nopebench.commands import bench_decode as command

    def options() -> o.BenchDecodeOptions:  # inside _dispatch: a bad --noise-floor is one line
        return o.BenchDecodeOptions(
            config=config,
            model=model,
            impls=tuple(impl or ()),
            quick=quick,
            baseline=baseline,
            noise_floor=noise_floor,
            output=o.Output(results_dir, json_out),
            heads=tuple(heads or ()),
            tokens=tuple(tokens or ()),
            widths=tuple(width or ()),
            modes=tuple(mode or ()),
        )

    _dispatch(lambda: command.execute(options()), json_out)


@app.command(
    "bench-cache",
    help="Throughput of the CUDA cache write and gather/upconvert kernels "
    "against the torch reference.",
)
def bench_cache(
    tokens: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated token counts (default: "
            f"{','.join(map(str, o.DEFAULT_CACHE_TOKENS))}; "
            f"--quick: {','.join(map(str, o.QUICK_CACHE_TOKENS))})."
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer sizes and a short timing budget.")
    ] = False,
    results_dir: ResultsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from nopebench.commands import bench_cache as command

    _dispatch(
        lambda: command.execute(
            o.BenchCacheOptions(
                tokens=o.parse_token_list(tokens) if tokens else None,
                quick=quick,
                output=o.Output(results_dir, json_out),
            )
        ),
        json_out,
    )


@app.command()
def gsm8k(
    config: Annotated[
        str,
        typer.Option(
            "--config",
            "-c",
            help="GSM8K config: a YAML path or a bundled name (glm53-flash-nvfp4-tp4).",
        ),
    ],
    base_url: Annotated[
        str | None,
        typer.Option(
            help="Server root or its OpenAI base, e.g. http://127.0.0.1:8000 or "
            "http://127.0.0.1:8000/v1 (overrides the config)."
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Evaluate only the first N problems.")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="Directory with train.jsonl and test.jsonl (overrides the config)."),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option(help="A failed run's directory: reuse its finished generations.")
    ] = None,
    results_dir: ResultsOpt = None,
) -> None:
    """GSM8K through lm-eval against an OpenAI-compatible server (launched or given)."""
    from nopebench.commands import gsm8k as command

    _dispatch(
        lambda: command.execute(o.Gsm8kOptions(config, base_url, limit, data, resume, results_dir))
    )


@app.command()
def run(
    model: ModelOpt = o.DEFAULT_MODEL,
    gsm8k_config: Annotated[
        str | None, typer.Option("--gsm8k", help="Also run GSM8K with this config.")
    ] = None,
    results_dir: ResultsOpt = None,
) -> None:
    """The main job: every check this machine can run, then a report."""
    from nopebench.commands import run as command

    _dispatch(lambda: command.execute(o.RunOptions(model, gsm8k_config, results_dir)))


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="The baseline run directory.")],
    run_b: Annotated[Path, typer.Argument(help="The run compared with it (same kind).")],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Also write a new .csv (the cells) or .json (everything); never replaces a file.",
        ),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option("--json", help="Print the comparison as JSON on stdout (tables: stderr)."),
    ] = False,
    noise_floor: NoiseFloorOpt = o.DEFAULT_NOISE_FLOOR,
) -> None:
    """Two bench-decode or bench-cache runs side by side per cell: both medians and spreads,
    B / A, and a regression mark where B is slower by more than the larger of the two spreads
    and the noise floor (exit 1)."""
    from nopebench.commands import compare as command

    _dispatch(
        lambda: command.execute(o.CompareOptions(run_a, run_b, output, json_out, noise_floor))
    )


@app.command()
def report(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run directories (default: the latest run of each kind)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Report directory (default: a new one under ./results/report/)."
        ),
    ] = None,
    results_dir: ResultsOpt = None,
) -> None:
    """Turn run directories into one Markdown report with PNG plots."""
    from nopebench.commands import report as command

    _dispatch(lambda: command.execute(o.ReportOptions(tuple(runs or ()), output, results_dir)))


def _sigterm_as_interrupt() -> None:
    """`kill` (SIGTERM) ends a command the way Ctrl-C does: cleanup runs, run.json says
    `interrupted`, exit 130."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main() -> None:
    _sigterm_as_interrupt()
    try:
        app()
    except SystemExit as exc:
        if exc.code != EXIT_INTERRUPTED:
            raise
        # Exit 130 as documented. Leaving through the interpreter instead can end the process
        # by SIGINT (status -2) when the KeyboardInterrupt passed through an extension's own
        # Python call on its way here, although it was handled.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_INTERRUPTED)
