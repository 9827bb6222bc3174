"""The typed options of every command: one frozen dataclass each, with the defaults.

The command line builds these (cli.py) and so does `nopebench run` (commands/run.py), so a flag
given to `run` reaches every step that takes it, and each default is written here only. This
module imports nothing heavy: `nopebench --help` and a usage error never load torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nopebench.errors import UsageError

DEFAULT_MODEL = "glm53-flash"
DEFAULT_BENCH_CONFIG = "h200-nope"
DEFAULT_CACHE_TOKENS = (1024, 4096, 16384, 65536, 262144)
QUICK_CACHE_TOKENS = (4096, 65536)
MAX_CACHE_TOKENS = 1 << 22
# How far a cell's median may move between two runs before `compare` and bench-decode's
# --baseline mark it: the tolerance is the largest of the two cells' spreads and this floor.
# Measured on the two full H200 bench-decode grids committed under
# results/reference/h200-bench-decode-full with no kernel or timing change between them (runs
# ...094054.640900Z-fe99ec and ...102442.983433Z-a34e82): over the 319 cells both timed, B / A
# lay in 0.957-1.058, the largest |B / A - 1| 0.0575 (flashinfer-fa3-bf16, 64 heads x 1 token,
# shim), while the cells' within-run spreads were ~1%; rounded up to the next percent. The two
# earlier same-kernel grids there (...025356 and ...030621) stay inside it (0.947-1.037).
DEFAULT_NOISE_FLOOR = 0.06


def check_noise_floor(value: float) -> float:
    """A noise floor as given: a fraction in [0, 1) (NaN refused), else one UsageError line."""
    if not 0 <= value < 1:
        raise UsageError(
            f"--noise-floor {value!r}: expected a fraction in [0, 1), e.g. "
            f"{DEFAULT_NOISE_FLOOR} for {100 * DEFAULT_NOISE_FLOOR:.0f}%"
        )
    return value


@dataclass(frozen=True)
class Output:
    """Where a command writes its run directory, and whether it prints its records as JSON."""

    results_dir: Path | None = None  # root for run directories (default: ./results)
    json_out: bool = False


@dataclass(frozen=True)
class BuildOptions:
    arch: str | None = None  # comma-separated targets; None: the local GPU's
    compile_only: bool = False  # sm_90a, sm_100a, sm_120a and the SM90 decode kernels, no GPU
    force: bool = False  # rebuild even when the source hash is unchanged


@dataclass(frozen=True)
class VerifyLayoutOptions:
    model: str = DEFAULT_MODEL
    impl: str = "reference"  # reference, cuda or all
    tokens: int = 4096
    seed: int = 0
    sweep: bool = False
    output: Output = Output()


@dataclass(frozen=True)
class CheckPagetableOptions:
    model: str = DEFAULT_MODEL
    seed: int = 0
    output: Output = Output()


@dataclass(frozen=True)
class BenchDecodeOptions:
    config: str = DEFAULT_BENCH_CONFIG
    model: str | None = None  # replaces the bench config's model when given
    impls: tuple[str, ...] = ()  # empty: the config's
    quick: bool = False
    baseline: Path | None = None
    noise_floor: float = DEFAULT_NOISE_FLOOR  # the --baseline rule's (see DEFAULT_NOISE_FLOOR)
    output: Output = Output()
    # Case filters over the config's grid; each empty tuple keeps every value.
    heads: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    widths: tuple[int, ...] = ()
    modes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_noise_floor(self.noise_floor)


@dataclass(frozen=True)
class BenchCacheOptions:
    tokens: tuple[int, ...] | None = None  # None: DEFAULT_CACHE_TOKENS, or QUICK_CACHE_TOKENS
    quick: bool = False
    output: Output = Output()

    def token_counts(self) -> tuple[int, ...]:
        if self.tokens:
            return self.tokens
        return QUICK_CACHE_TOKENS if self.quick else DEFAULT_CACHE_TOKENS


def parse_token_list(text: str) -> tuple[int, ...]:
    """'1024,4096' -> (1024, 4096): distinct counts in [1, MAX_CACHE_TOKENS], in order."""
    values: list[int] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        if not item.isdigit() or not 1 <= int(item) <= MAX_CACHE_TOKENS:
            raise UsageError(
                f"--tokens {item!r}: expected integers in [1, {MAX_CACHE_TOKENS}], comma-separated"
            )
        if int(item) not in values:
            values.append(int(item))
    if not values:
        raise UsageError("--tokens: give at least one token count")
    return tuple(values)


@dataclass(frozen=True)
class Gsm8kOptions:
    config: str
    base_url: str | None = None
    limit: int | None = None
    data: Path | None = None
    resume: Path | None = None
    results_dir: Path | None = None


@dataclass(frozen=True)
class RunOptions:
    model: str = DEFAULT_MODEL
    gsm8k: str | None = None  # a GSM8K config; without one that step is skipped
    results_dir: Path | None = None


@dataclass(frozen=True)
class ReportOptions:
    runs: tuple[Path, ...] = ()  # empty: the latest run of each kind
    output: Path | None = None
    results_dir: Path | None = None


@dataclass(frozen=True)
class CompareOptions:
    run_a: Path  # the baseline run directory
    run_b: Path  # the run compared with it
    output: Path | None = None  # a new .csv (the cells) or .json (everything) file; never replaced
    json_out: bool = False
    noise_floor: float = DEFAULT_NOISE_FLOOR

    def __post_init__(self) -> None:
        check_noise_floor(self.noise_floor)
