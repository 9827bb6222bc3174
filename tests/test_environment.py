"""The environment record without a GPU: GPU state through a fake pynvml, the compilers'
versions from fake binaries, the package's own version from a source tree, and bench-decode's
clock-variation warning with fakes at the device boundary."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from nopebench import environment, nvml
from nopebench.config import REPO_ROOT

PCI = "00000000:65:00.0"
NVCC_OUT = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
PTXAS_OUT = """ptxas: NVIDIA (R) Ptx optimizing assembler
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Tue_May_27_02:18:05_PDT_2025
Cuda compilation tools, release 12.9, V12.9.86
Build cuda_12.9.r12.9/compiler.36037853_0
"""


class FakeNvml(types.ModuleType):
    """The slice of pynvml the harness calls. `sm_clocks`: successive current SM clocks (the
    last repeats); `fail`: names of calls that raise NVMLError."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1

    class NVMLError(Exception):
        pass

    def __init__(self, sm_clocks=(1980,), fail=(), ecc=(1, 0), persistence=0):
        super().__init__("pynvml")
        self.sm_clocks, self.fail = list(sm_clocks), set(fail)
        self.ecc, self.persistence = ecc, persistence
        self.inits = self.shutdowns = 0
        self.handle_by: tuple | None = None

    def _call(self, name):
        if name in self.fail:
            raise self.NVMLError(f"{name}: Not Supported")

    def nvmlInit(self):
        self._call("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self._call("nvmlDeviceGetHandleByPciBusId")
        self.handle_by = ("pci", bus_id)
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index):
        self._call("nvmlDeviceGetHandleByIndex")
        self.handle_by = ("index", index)
        return "handle"

    def nvmlDeviceGetClockInfo(self, handle, kind):
        assert handle == "handle"
        self._call("nvmlDeviceGetClockInfo")
        if kind == self.NVML_CLOCK_SM:
            return self.sm_clocks.pop(0) if len(self.sm_clocks) > 1 else self.sm_clocks[0]
        return 3201

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        self._call("nvmlDeviceGetMaxClockInfo")
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        self._call("nvmlDeviceGetPowerManagementLimit")
        return 700000  # mW

    def nvmlDeviceGetEccMode(self, handle):
        self._call("nvmlDeviceGetEccMode")
        return list(self.ecc)

    def nvmlDeviceGetCurrentEccMode(self, handle):
        self._call("nvmlDeviceGetCurrentEccMode")
        return self.ecc[0]

    def nvmlDeviceGetPersistenceMode(self, handle):
        self._call("nvmlDeviceGetPersistenceMode")
        return self.persistence


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(**kw) -> FakeNvml:
        fake = FakeNvml(**kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def _fake_gpu(monkeypatch, pci_bus_id=PCI):
    info = {"gpu": "NVIDIA H200", "sm": 90, "driver": "580", "pci_bus_id": pci_bus_id}
    monkeypatch.setattr(environment, "gpu_info", lambda: info)


# ---------------------------------------------------------------- GPU state through NVML


def test_every_gpu_field_filled_from_nvml(fake_nvml):
    fake = fake_nvml(sm_clocks=(1755,), ecc=(1, 0), persistence=1)
    state = nvml.gpu_state(PCI)
    assert state["unavailable"] == {}
    assert all(state[f] is not None for f in nvml.STATE_FIELDS)
    assert state["sm_clock_mhz"] == 1755 and state["sm_clock_max_mhz"] == 1980
    assert state["mem_clock_mhz"] == state["mem_clock_max_mhz"] == 3201
    assert state["power_limit_w"] == 700.0  # NVML answers in mW
    assert state["ecc_enabled"] is True and state["ecc_pending_enabled"] is False
    assert state["persistence_mode"] is True
    assert fake.handle_by == ("pci", PCI) and fake.inits == fake.shutdowns == 1


def test_a_failing_query_is_none_with_its_reason(fake_nvml):
    fake = fake_nvml(fail={"nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEccMode"})
    state = nvml.gpu_state(PCI)
    assert (
        state["power_limit_w"] is None and "Not Supported" in state["unavailable"]["power_limit_w"]
    )
    # ECC falls back to the current mode alone; the pending one says why it is missing
    assert state["ecc_enabled"] is True and state["ecc_pending_enabled"] is None
    assert "nvmlDeviceGetEccMode" in state["unavailable"]["ecc_pending_enabled"]
    assert set(state["unavailable"]) == {"power_limit_w", "ecc_pending_enabled"}
    assert state["sm_clock_mhz"] == 1980 and fake.shutdowns == 1


@pytest.mark.parametrize(
    "fail, needle, shutdowns",
    [
        ({"nvmlInit"}, "nvmlInit failed", 0),
        ({"nvmlDeviceGetHandleByPciBusId"}, f"no device at PCI bus id {PCI}", 1),
    ],
)
def test_nvml_that_cannot_answer_leaves_every_field_none(fake_nvml, fail, needle, shutdowns):
    fake = fake_nvml(fail=fail)
    state = nvml.gpu_state(PCI)
    assert all(state[f] is None for f in nvml.STATE_FIELDS)
    assert set(state["unavailable"]) == set(nvml.STATE_FIELDS)
    assert all(needle in why for why in state["unavailable"].values())
    assert fake.shutdowns == shutdowns


def test_without_pynvml_every_field_is_none_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    state = nvml.gpu_state(PCI)
    assert all(state[f] is None for f in nvml.STATE_FIELDS)
    assert all("nvidia-ml-py" in why for why in state["unavailable"].values())


def test_without_a_gpu_nvml_is_not_asked(monkeypatch, fake_nvml):
    fake = fake_nvml()
    monkeypatch.setattr(environment, "gpu_info", lambda: {"gpu": None, "sm": None})
    state = environment.gpu_state()
    assert all(state[f] is None for f in nvml.STATE_FIELDS)
    assert set(state["unavailable"].values()) == {"no CUDA GPU visible"}
    assert fake.inits == 0


def test_environment_finds_the_gpu_by_its_pci_bus_id(monkeypatch, fake_nvml):
    fake = fake_nvml()
    _fake_gpu(monkeypatch)
    assert environment.gpu_state()["unavailable"] == {}
    assert fake.handle_by == ("pci", PCI)
    _fake_gpu(monkeypatch, pci_bus_id=None)  # a torch without PCI ids: NVML by index
    assert environment.gpu_state()["unavailable"] == {}
    assert fake.handle_by[0] == "index"


# ---------------------------------------------------------------- compilers and own version


@pytest.mark.parametrize(
    "text, version",
    [
        (NVCC_OUT, "13.0.88"),
        (PTXAS_OUT, "12.9.86"),
        ("Cuda compilation tools, release 12.4\n", "12.4"),
        ("command not found", None),
    ],
)
def test_tool_version_parsed_from_version_output(text, version):
    assert environment.tool_version(text) == version


def _script(path: Path, output: str) -> Path:
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\n")
    path.chmod(0o755)
    return path


def test_tool_record_runs_the_binary(tmp_path):
    nvcc = _script(tmp_path / "nvcc", NVCC_OUT)
    assert environment.tool_record(nvcc, "none") == {
        "path": str(nvcc),
        "version": "13.0.88",
        "unavailable": None,
    }
    mute = _script(tmp_path / "mute", "")
    assert environment.tool_record(mute, "none")["unavailable"].startswith("no version")
    gone = environment.tool_record(tmp_path / "gone", "none")
    assert gone["version"] is None and "FileNotFoundError" in gone["unavailable"]
    assert environment.tool_record(None, "no nvcc here") == {
        "path": None,
        "version": None,
        "unavailable": "no nvcc here",
    }


def test_toolchain_records_nvcc_ptxas_and_tritons_ptxas(monkeypatch, tmp_path):
    from nopebench import cuda_build as build

    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = _script(bin_dir / "nvcc", NVCC_OUT)
    _script(bin_dir / "ptxas", PTXAS_OUT)
    triton_ptxas = _script(tmp_path / "ptxas-blackwell", PTXAS_OUT.replace("12.9", "13.4"))
    compiler = types.ModuleType("triton.backends.nvidia.compiler")
    compiler.get_ptxas = lambda arch: types.SimpleNamespace(path=str(triton_ptxas), arch=arch)
    monkeypatch.setitem(sys.modules, "triton.backends.nvidia.compiler", compiler)
    monkeypatch.setattr(build, "find_nvcc", lambda: nvcc)
    _fake_gpu(monkeypatch)
    environment.toolchain.cache_clear()
    try:
        tools = environment.toolchain()
        assert tools["nvcc"]["version"] == "13.0.88"
        assert tools["ptxas"] == {
            "path": str(bin_dir / "ptxas"),
            "version": "12.9.86",
            "unavailable": None,
        }
        assert tools["triton_ptxas"]["version"] == "13.4.86"
        monkeypatch.setattr(environment, "gpu_info", lambda: {"gpu": None, "sm": None})
        monkeypatch.setattr(build, "find_nvcc", lambda: None)
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        environment.toolchain.cache_clear()
        tools = environment.toolchain()
        assert tools["nvcc"]["version"] is None and "no nvcc" in tools["nvcc"]["unavailable"]
        assert tools["ptxas"]["version"] is None and tools["ptxas"]["unavailable"]
        assert "no CUDA GPU" in tools["triton_ptxas"]["unavailable"]
    finally:
        environment.toolchain.cache_clear()


def _pyproject_version() -> str:
    text = (REPO_ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', project, re.M).group(1)


def test_own_version_without_installed_metadata(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert environment.package_version("torch") is None  # the metadata really is gone
    assert environment.package_version("nopebench") == _pyproject_version()


def test_run_record_from_a_source_tree_holds_the_version(tmp_path):
    """The launchers put the checkout on PYTHONPATH without installing it."""
    code = (
        "import json; from nopebench.environment import environment_header; "
        "print(json.dumps(environment_header(['x'])['versions']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["nopebench"] == _pyproject_version()


# ---------------------------------------------------------------- clock samples


def test_clock_sampler_flags_a_varying_sm_clock(fake_nvml):
    fake = fake_nvml(sm_clocks=(1980, 1980, 1755, 1980))
    with nvml.ClockSampler(PCI) as clocks:
        for _ in range(4):
            clocks.sample()
    s = clocks.summary()
    assert (s["samples"], s["sm_min_mhz"], s["sm_max_mhz"]) == (4, 1755, 1980)
    assert s["sm_variation"] == pytest.approx(225 / 1980) and s["varied"] is True
    warning = nvml.clock_warning(s)
    assert "1755-1980 MHz" in warning and "11.4%" in warning and "\n" not in warning
    assert fake.inits == fake.shutdowns == 1  # NVML stays open between samples


def test_clock_sampler_steady_clock_gives_no_warning(fake_nvml):
    fake_nvml(sm_clocks=(1980, 1965, 1980))
    with nvml.ClockSampler(PCI) as clocks:
        for _ in range(3):
            clocks.sample()
    s = clocks.summary()
    assert s["varied"] is False and s["sm_variation"] == pytest.approx(15 / 1980)
    assert nvml.clock_warning(s) is None
    assert nvml.clock_warning({**s, "threshold": 0.005, "varied": True})  # the bound decides


def test_clock_sampler_without_nvml_says_why(monkeypatch, fake_nvml):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with nvml.ClockSampler(PCI) as clocks:
        clocks.sample()
    s = clocks.summary()
    assert s["samples"] == 0 and s["varied"] is None and "nvidia-ml-py" in s["unavailable"]
    assert nvml.clock_warning(s) is None
    fake = fake_nvml(fail={"nvmlDeviceGetClockInfo"})
    with nvml.ClockSampler(PCI) as clocks:
        clocks.sample()
    s = clocks.summary()
    assert s["failed_samples"] == 1 and "Not Supported" in s["unavailable"]
    assert fake.shutdowns == 1


# ---------------------------------------------------------------- bench-decode's warning

REFERENCE_RUN = (
    REPO_ROOT / "results/reference/h200-bench-decode-full/20261201T030621.424505Z-7e6a68"
)


@pytest.mark.parametrize("sm_clocks, warned", [((1980, 1980, 1700, 1980), True), ((1980,), False)])
def test_bench_decode_warns_when_the_sm_clock_varies(
    monkeypatch, tmp_path, capsys, fake_nvml, sm_clocks, warned
):
    import torch

    from nopebench.bench.timing import Ceilings
    from nopebench.commands import bench_decode
    from nopebench.commands.options import BenchDecodeOptions, Output

    rows = pd.read_csv(REFERENCE_RUN / "results.csv")
    calls = []
    fake_nvml(sm_clocks=sm_clocks)
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_decode, "measure_ceilings", lambda: Ceilings(4000.0, 700.0))

    def fake_grid(cfg, model, cases, impls, ceil, budget, progress):
        for case in cases:
            progress(case.case_id)
            calls.append(case.case_id)
        return rows.to_dict("records")

    monkeypatch.setattr(bench_decode, "run_grid", fake_grid)
    opts = BenchDecodeOptions(quick=True, output=Output(tmp_path))
    assert bench_decode.execute(opts) == 0  # a warning, not a failure
    run_dir = next((tmp_path / "bench-decode").iterdir())
    clock = json.loads((run_dir / "results.json").read_text())["summary"]["sm_clock"]
    assert json.loads((run_dir / "run.json").read_text())["summary"]["sm_clock"] == clock
    assert clock["samples"] == len(calls) + 1 > 2  # before each case and after the last
    assert [t["at"] for t in clock["trace"]] == [*(f"before {c}" for c in calls), "end"]
    assert clock["varied"] is warned
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "SM clock varied" in line]
    assert len(lines) == (1 if warned else 0)
    if warned:
        lowest = min(clock["trace"], key=lambda t: t["sm_mhz"])["at"]
        assert "1700-1980 MHz" in lines[0] and f"lowest {lowest}" in lines[0]
