"""The registry of sparse MLA decode implementations, and dispatch over it.

Every consumer (check-pagetable, bench-decode, the CLI's choices, table columns) gets the list
of implementations from `implementations()`; nothing routes by name with if/elif chains. An
entry that this machine cannot run stays listed and says why in one line (`unsupported`), so
tables can show it as refused rather than silently missing. Every adapter module is imported
here directly; each defers its heavy imports (Triton, FlashInfer, FlashMLA) to the moment it runs.
"""

from __future__ import annotations

from nopebench import signatures
from nopebench.errors import UnsupportedError, UsageError
from nopebench.impls import flashinfer, flashmla, reference
from nopebench.impls.interface import DecodeOutput, DecodeProblem, DecodeRun, ImplSpec
from nopebench.impls.native import adapter as native


def implementations() -> dict[str, ImplSpec]:
    """Every implementation the harness knows, in display order, keyed by name."""
    specs = [
        reference.reference_spec(),
        native.native_spec(),
        flashmla.flashmla_spec(),
        *flashinfer.flashinfer_specs(),
    ]
    return {spec.name: spec for spec in specs}


def names() -> list[str]:
    """Implementation names for CLI choices and table columns."""
    return list(implementations())


def lookup(impl_name: str, registry: dict[str, ImplSpec] | None = None) -> ImplSpec:
    registry = implementations() if registry is None else registry
    try:
        return registry[impl_name]
    except KeyError:
        raise UsageError(
            f"unknown implementation {impl_name!r}: choose one of {', '.join(registry)}"
        ) from None


def runnable(
    problem: DecodeProblem, registry: dict[str, ImplSpec] | None = None
) -> tuple[list[ImplSpec], dict[str, str]]:
    """The implementations this machine can run on `problem`, and the refusal line of each other."""
    registry = implementations() if registry is None else registry
    ok, refused = [], {}
    for spec in registry.values():
        reason = spec.unsupported(problem)
        if reason is None:
            ok.append(spec)
        else:
            refused[spec.name] = reason
    return ok, refused


def prepare(
    problem: DecodeProblem, impl_name: str, registry: dict[str, ImplSpec] | None = None
) -> DecodeRun:
    """The launch closure of one implementation for `problem`.

    Raises UsageError for an unknown name, UnsupportedError (one line) when this machine
    cannot run it, and signatures.KnownFailure when the failure is a known upstream one.
    """
    spec = lookup(impl_name, registry)
    reason = spec.unsupported(problem)
    if reason is not None:
        raise UnsupportedError(reason)
    try:
        run = spec.prepare(problem)
    except Exception as exc:
        signatures.raise_if_known(exc, spec.name)
        raise

    def checked_run() -> DecodeOutput:
        try:
            return run()
        except Exception as exc:
            signatures.raise_if_known(exc, spec.name)
            raise

    return checked_run


def decode(
    problem: DecodeProblem, impl_name: str, registry: dict[str, ImplSpec] | None = None
) -> DecodeOutput:
    """Prepare and run one implementation once (host work included: not for timing)."""
    return prepare(problem, impl_name, registry)()
