"""GPU state through NVML (the `nvidia-ml-py` package, imported as `pynvml`, which ships with the
GPU stack): SM and memory clocks, power limit, ECC and persistence mode, and clock samples taken
during a benchmark. The clocks in a run's header are those when it started, which on an idle GPU
are its idle clocks; the samples are taken under load.

pynvml is imported only here and only when asked for. Every query is guarded: one that fails
records None with the reason, and so does every field when pynvml, the driver or the GPU is
missing, so a record is always whole and never the cause of a failed run.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any

STATE_FIELDS = (
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "mem_clock_max_mhz",
    "power_limit_w",
    "ecc_enabled",
    "ecc_pending_enabled",
    "persistence_mode",
)

# bench-decode warns when its SM clock samples span more than this fraction of their maximum:
# a compute-bound kernel's time scales with the clock, so such a run's ratios mix two speeds.
CLOCK_VARIATION_THRESHOLD = 0.05


class NvmlUnavailable(Exception):
    """NVML cannot answer for this GPU; the message says why, in one line."""


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def nvml_device(pci_bus_id: str | None = None, index: int = 0) -> Iterator[tuple[Any, Any]]:
    """(pynvml, device handle) of the GPU with this PCI bus id (else NVML index `index`), with
    NVML initialised for the block and shut down after it."""
    try:
        with warnings.catch_warnings():  # some pynvml builds warn on import; records say enough
            warnings.simplefilter("ignore")
            import pynvml
    except ImportError:
        raise NvmlUnavailable("pynvml is not importable (package nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError or a missing libnvidia-ml: the same
        raise NvmlUnavailable(f"nvmlInit failed ({_reason(exc)})") from None
    try:
        try:
            if pci_bus_id:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
            else:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001
            which = f"PCI bus id {pci_bus_id}" if pci_bus_id else f"index {index}"
            raise NvmlUnavailable(f"NVML has no device at {which} ({_reason(exc)})") from None
        yield pynvml, handle
    finally:
        with suppress(Exception):  # shutting down is best effort
            pynvml.nvmlShutdown()


def _enabled(nv: Any, value: Any) -> bool:
    return int(value) == int(getattr(nv, "NVML_FEATURE_ENABLED", 1))


def _queries(nv: Any, handle: Any) -> dict[str, Any]:
    """Field name -> a function reading it; ECC's current and pending modes come from one call."""
    ecc: dict[str, Any] = {}

    def ecc_modes() -> tuple[Any, ...]:
        if "modes" not in ecc:
            try:
                modes, why = tuple(nv.nvmlDeviceGetEccMode(handle)), None
            except Exception as exc:  # noqa: BLE001 - older drivers: the current mode alone
                modes, why = (nv.nvmlDeviceGetCurrentEccMode(handle),), _reason(exc)
            ecc.update(modes=modes, why=why)
        return ecc["modes"]

    def ecc_pending() -> bool:
        modes = ecc_modes()
        if len(modes) < 2:
            raise NvmlUnavailable(f"nvmlDeviceGetEccMode failed ({ecc['why']})")
        return _enabled(nv, modes[1])

    return {
        "sm_clock_mhz": lambda: int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
        "sm_clock_max_mhz": lambda: int(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)),
        "mem_clock_mhz": lambda: int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)),
        "mem_clock_max_mhz": lambda: int(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_MEM)),
        "power_limit_w": lambda: nv.nvmlDeviceGetPowerManagementLimit(handle) / 1000,  # mW
        "ecc_enabled": lambda: _enabled(nv, ecc_modes()[0]),
        "ecc_pending_enabled": ecc_pending,
        "persistence_mode": lambda: _enabled(nv, nv.nvmlDeviceGetPersistenceMode(handle)),
    }


def unavailable_state(reason: str) -> dict[str, Any]:
    return {**dict.fromkeys(STATE_FIELDS), "unavailable": dict.fromkeys(STATE_FIELDS, reason)}


def gpu_state(pci_bus_id: str | None = None, index: int = 0) -> dict[str, Any]:
    """Every STATE_FIELDS value now, and `unavailable`: field -> why it is None."""
    try:
        with nvml_device(pci_bus_id, index) as (nv, handle):
            state: dict[str, Any] = {}
            missing: dict[str, str] = {}
            for name, read in _queries(nv, handle).items():
                try:
                    state[name] = read()
                except Exception as exc:  # noqa: BLE001 - e.g. NVMLError_NotSupported
                    state[name], missing[name] = None, _reason(exc)
            return {**state, "unavailable": missing}
    except NvmlUnavailable as exc:
        return unavailable_state(str(exc))


class ClockSampler:
    """SM and memory clock samples of one GPU over a run; NVML stays open between samples.

    Use as a context manager; without NVML every sample is skipped and `summary()` says why.
    """

    def __init__(
        self,
        pci_bus_id: str | None = None,
        index: int = 0,
        unavailable: str | None = None,
        threshold: float = CLOCK_VARIATION_THRESHOLD,
    ) -> None:
        self._where = (pci_bus_id, index)
        self._stack = ExitStack()
        self._device: tuple[Any, Any] | None = None
        self.unavailable = unavailable  # why there are no samples
        self.threshold = threshold
        self.sm_mhz: list[int] = []
        self.mem_mhz: list[int] = []
        self.labels: list[str | None] = []
        self.failed = 0

    def __enter__(self) -> ClockSampler:
        if self.unavailable is None:
            try:
                self._device = self._stack.enter_context(nvml_device(*self._where))
            except NvmlUnavailable as exc:
                self.unavailable = str(exc)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._device = None
        self._stack.close()

    def sample(self, label: str | None = None) -> None:
        """Read both clocks now (`label`: when, for the trace); a failing read is counted, never
        raised."""
        if self._device is None:
            return
        nv, handle = self._device
        try:
            sm = int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
            mem = int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM))
        except Exception as exc:  # noqa: BLE001
            self.failed += 1
            self.unavailable = f"clock samples failed ({_reason(exc)})"
            return
        self.sm_mhz.append(sm)
        self.mem_mhz.append(mem)
        self.labels.append(label)

    def summary(self) -> dict[str, Any]:
        trace = [
            {"at": label, "sm_mhz": sm, "mem_mhz": mem}
            for label, sm, mem in zip(self.labels, self.sm_mhz, self.mem_mhz, strict=True)
        ]
        return {
            **clock_summary(
                self.sm_mhz, self.mem_mhz, self.threshold, self.unavailable, self.failed
            ),
            "trace": trace,
        }


def clock_summary(
    sm_mhz: list[int],
    mem_mhz: list[int],
    threshold: float = CLOCK_VARIATION_THRESHOLD,
    unavailable: str | None = None,
    failed: int = 0,
) -> dict[str, Any]:
    """Range of the clock samples; `varied`: the SM clock spanned more than `threshold` of its
    maximum (None without samples, and then `unavailable` says why)."""
    top = max(sm_mhz, default=0)
    variation = (top - min(sm_mhz)) / top if top else None
    return {
        "samples": len(sm_mhz),
        "failed_samples": failed,
        "sm_min_mhz": min(sm_mhz, default=None),
        "sm_max_mhz": max(sm_mhz, default=None),
        "mem_min_mhz": min(mem_mhz, default=None),
        "mem_max_mhz": max(mem_mhz, default=None),
        "sm_variation": variation,
        "threshold": threshold,
        "varied": None if variation is None else variation > threshold,
        "unavailable": None if sm_mhz else (unavailable or "no clock samples were taken"),
    }


def clock_warning(summary: dict[str, Any]) -> str | None:
    """The one-line warning for a run whose SM clock varied beyond the threshold, else None."""
    if not summary.get("varied"):
        return None
    lowest = min(summary.get("trace") or [], key=lambda t: t["sm_mhz"], default={}).get("at")
    return (
        f"SM clock varied {summary['sm_min_mhz']}-{summary['sm_max_mhz']} MHz across the run "
        f"({100 * summary['sm_variation']:.1f}%, above {100 * summary['threshold']:.0f}%, "
        f"{summary['samples']} samples{f'; lowest {lowest}' if lowest else ''}): timings taken "
        "at different clocks may not compare"
    )
