"""The command line: parse, dispatch, exit. Each command's work lives in its capability module,
imported lazily so `nopebench --help` and a bad argument never pay for torch or lm-eval."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from nopebench.commands import options as o
from nopebench.errors import EXIT_USAGE, UsageError

app = typer.Typer(
    help="Validate and benchmark NoPE sparse MLA (GLM-5.3-Flash) on FlashInfer's sparse MLA backends.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="Model config: a YAML path or a name under configs/models/."
    ),
]
BenchModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Model config, replacing the bench config's.")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Also print the result records as JSON on stdout.")
]
ResultsOpt = Annotated[
    Path | None, typer.Option("--results-dir", help="Root for run directories (default: results/).")
]


def _dispatch(fn: Callable[[], int]) -> None:
    """Run a command body; bad input is one line on stderr and exit 2, never a traceback."""
    try:
        code = fn()
    except UsageError as exc:
        from nopebench.console import error_line

        error_line(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        from nopebench.console import error_line

        error_line("interrupted")
        raise typer.Exit(130) from None
    raise typer.Exit(code)


@app.command()
def build(
    arch: Annotated[
        str | None,
        typer.Option(help="Comma-separated targets, e.g. sm_90a,sm_120a (default: the local GPU)."),
    ] = None,
    compile_only: Annotated[
        bool,
        typer.Option(
            "--compile-only",
            help="Build sm_90a, sm_100a and sm_120a and the SM90 decode kernel without a GPU; load nothing.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild even when the source hash is unchanged.")
    ] = False,
) -> None:
    """Compile the CUDA cache kernels (cached by source hash); --compile-only also the SM90 decode kernel."""
    from nopebench.commands import build as command

    _dispatch(
        lambda: command.execute(o.BuildOptions(arch=arch, compile_only=compile_only, force=force))
    )


@app.command("verify-layout")
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
    """Write random rows into a sentinel-filled cache and check every byte of the fp8_ds_mla layout."""
    from nopebench.commands import verify_layout as command

    opts = o.VerifyLayoutOptions(model, impl, tokens, seed, sweep, o.Output(results_dir, json_out))
    _dispatch(lambda: command.execute(opts))


@app.command("check-pagetable")
def check_pagetable(
    model: ModelOpt = o.DEFAULT_MODEL,
    seed: Annotated[int, typer.Option(help="Seed for the random decode checks.")] = 0,
    results_dir: ResultsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the sparse page table is sized by the top-k buffer width, with FlashInfer's own validation."""
    from nopebench.commands import check_pagetable as command

    opts = o.CheckPagetableOptions(model, seed, o.Output(results_dir, json_out))
    _dispatch(lambda: command.execute(opts))


@app.command("bench-decode")
def bench_decode(
    config: Annotated[
        str,
        typer.Option(
            "--config", "-c", help="Bench config: a YAML path or a name under configs/bench/."
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

    opts = o.BenchDecodeOptions(
        config=config,
        model=model,
        impls=tuple(impl or ()),
        quick=quick,
        baseline=baseline,
        output=o.Output(results_dir, json_out),
        heads=tuple(heads or ()),
        tokens=tuple(tokens or ()),
        widths=tuple(width or ()),
        modes=tuple(mode or ()),
    )
    _dispatch(lambda: command.execute(opts))


@app.command("bench-cache")
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
    """Throughput of the CUDA cache write and gather/upconvert kernels against the torch reference."""
    from nopebench.commands import bench_cache as command

    _dispatch(
        lambda: command.execute(
            o.BenchCacheOptions(
                tokens=o.parse_token_list(tokens) if tokens else None,
                quick=quick,
                output=o.Output(results_dir, json_out),
            )
        )
    )


@app.command()
def gsm8k(
    config: Annotated[
        str,
        typer.Option(
            "--config", "-c", help="GSM8K config: a YAML path or a name under configs/gsm8k/."
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
) -> None:
    """Two bench-decode or bench-cache runs side by side per cell: both medians and spreads,
    B / A, and a regression mark where B is slower by more than the larger spread (exit 1)."""
    from nopebench.commands import compare as command

    _dispatch(lambda: command.execute(o.CompareOptions(run_a, run_b, output, json_out)))


@app.command()
def report(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run directories (default: the latest run of each kind)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Report directory (default: a new one under results/report/)."
        ),
    ] = None,
    results_dir: ResultsOpt = None,
) -> None:
    """Turn run directories into one Markdown report with PNG plots."""
    from nopebench.commands import report as command

    _dispatch(lambda: command.execute(o.ReportOptions(tuple(runs or ()), output, results_dir)))


def main() -> None:
    try:
        app()
    except SystemExit as exc:  # click turns usage errors into exit 2 already
        sys.exit(exc.code)
