"""The OpenAI-compatible server: check a given one, or launch one and always stop it.

A launched server (e.g. `vllm serve ...`, whose engine spawns one worker per GPU) runs in its
own process group, so stopping it means signalling the group, not one pid: SIGTERM, then
SIGKILL after `stop_timeout_s`. That happens on every way out of the `with` block: normal end,
a failed evaluation, Ctrl-C, and SIGTERM to the harness (turned into KeyboardInterrupt so the
cleanup runs). The server's own terminal-less output goes straight to a log file in the run
directory; if the server dies before it is ready, its last lines are shown and matched against
the known NoPE crash signatures, which name the missing upstream fix. The server's pid (its
process group) goes to `server.json` in the run directory as soon as it starts, so a harness
killed with SIGKILL, which can stop nothing, leaves a record of what to stop.

vLLM counts the requests it finished in `/metrics` (`vllm:request_success_total`, per finish
reason); `request_counts` reads them, so a run can record the server's own count of what it
answered next to the harness's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from nopebench import console as out
from nopebench.errors import SystemFailedError, UsageError
from nopebench.gsm8k.config import LaunchConfig
from nopebench.signatures import explain

POLL_S = 0.5
SUCCESS_METRIC = "vllm:request_success_total"
_SAMPLE = re.compile(r"^vllm:request_success_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
NOT_ANSWERED = ("abort", "error")  # finish reasons of requests that got no answer
TAIL_LINES = 30
TAIL_BYTES = 256 * 1024


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    """Status and body of a GET; connection problems raise OSError (URLError is one).

    Sends OPENAI_API_KEY as lm-eval does, so a server behind a key answers the probes too."""
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - http(s) checked in config
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class ServerAnswerError(Exception):
    """The server was reached but answered wrongly (an HTTP error, or not a model list)."""


def served_models(base_url: str, timeout: float = 10.0) -> list[str]:
    """Model ids from GET /v1/models. OSError when the server cannot be reached at all;
    ServerAnswerError when it answers, but with an HTTP error or something else."""
    status, body = _get(base_url.rstrip("/") + "/v1/models", timeout)
    if status != 200:
        raise ServerAnswerError(f"GET /v1/models answered HTTP {status}")
    try:
        return [str(m["id"]) for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerAnswerError(
            f"GET /v1/models answered something that is not a model list ({exc})"
        ) from None


def parse_request_counts(text: str, model: str | None = None) -> dict[str, int] | None:
    """`vllm:request_success_total` per finish reason, summed over engines, from a Prometheus
    text page; only `model`'s series when given. None when the page has no such counter."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if model is not None and labels.get("model_name", model) != model:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        reason = labels.get("finished_reason", "unknown")
        counts[reason] = counts.get(reason, 0) + int(value)
    return counts or None


def request_counts(
    base_url: str, model: str | None = None, timeout: float = 10.0
) -> dict[str, int] | None:
    """The server's own finished-request counters (see `parse_request_counts`); None when it
    has no /metrics or no such counter (a server that is not vLLM) or cannot be reached."""
    try:
        status, body = _get(base_url.rstrip("/") + "/metrics", timeout)
    except OSError:
        return None
    if status != 200:
        return None
    return parse_request_counts(body.decode("utf-8", errors="replace"), model)


def answered_between(before: dict[str, int] | None, after: dict[str, int] | None) -> dict | None:
    """What the server finished between two readings: answered (stop, length, ...) and not."""
    if before is None or after is None:
        return None
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}
    return {
        "metric": SUCCESS_METRIC,
        "answered": sum(v for k, v in delta.items() if k not in NOT_ANSWERED),
        "not_answered": {k: delta.get(k, 0) for k in NOT_ANSWERED},
        "by_reason": delta,
    }


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return f"{reason.__class__.__name__}: {reason}" if not isinstance(reason, str) else reason


def check_server(base_url: str, model: str) -> None:
    """A given server must be up and serve `model`; otherwise one line saying which is wrong."""
    try:
        models = served_models(base_url)
    except ServerAnswerError as exc:  # it is there, but failing: the server's fault (exit 4)
        raise SystemFailedError(
            f"server {base_url} is reachable but failing: {exc}; check its log"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"server {base_url} is not reachable ({_reason(exc)}); "
            "start it, or use a config with server.launch"
        ) from None
    _require_model(base_url, model, models)


def _require_model(base_url: str, model: str, models: list[str]) -> None:
    if model not in models:
        served = ", ".join(models) or "nothing"
        raise UsageError(
            f"server {base_url} does not serve model {model!r} (it serves: {served}); "
            "set `model` in the config to the served name"
        )


def read_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a (possibly large) log file."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - TAIL_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def check_port_free(base_url: str) -> None:
    """Before a launch: nothing may answer there already, or its /health would pass for ours
    while ours fails to bind, and the evaluation would run against the wrong server."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=2):
            pass
    except OSError:
        return
    raise UsageError(
        f"something already listens at {base_url}; "
        f"stop it, or evaluate it with --base-url {base_url}"
    )


@dataclass
class LaunchedServer:
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        """The leader's pid, which is also the process group of everything it starts."""
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def diagnosis(self) -> str | None:
        """The missing fix, when the log shows a known crash signature."""
        return explain(read_tail(self.log_path, lines=400))

    def describe_failure(self) -> str:
        """A clause for an error line: whether the server died, and the known cause if any."""
        parts = []
        code = self.exit_code()
        if code is not None:
            parts.append(f"the server exited with code {code} (log: {self.log_path})")
        else:
            parts.append(f"server log: {self.log_path}")
        why = self.diagnosis()
        if why:
            parts.append(f"known failure: {why}")
        return "; ".join(parts)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _wait_group_gone(proc: subprocess.Popen, deadline: float) -> bool:
    """Reap the leader, then wait for the rest of its group; False if time ran out."""
    while True:
        remaining = deadline - time.monotonic()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, min(POLL_S, remaining)))
        if proc.returncode is not None and not _group_alive(proc.pid):
            return True
        if remaining <= 0:
            return False
        if proc.returncode is not None:  # leader gone, workers still exiting
            time.sleep(min(0.05, remaining))


def stop_server(proc: subprocess.Popen, stop_timeout_s: float) -> None:
    """SIGTERM the whole process group, SIGKILL whatever is left after the grace period."""
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    _signal_group(pgid, signal.SIGTERM)
    if _wait_group_gone(proc, time.monotonic() + stop_timeout_s):
        return
    _signal_group(pgid, signal.SIGKILL)
    _wait_group_gone(
        proc, time.monotonic() + 10.0
    )  # unreaped zombies may outlive this; nothing left to do


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let `kill <harness>` run the same cleanup as Ctrl-C (only the main thread owns signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait_ready(server: LaunchedServer, base_url: str, model: str, timeout_s: float) -> None:
    """Poll /health, then /v1/models for `model`, with a spinner; stop early if the server dies."""
    start = time.monotonic()
    state = "starting"
    with out.status(f"waiting for the server at {base_url}") as spinner:
        while True:
            elapsed = time.monotonic() - start
            last = read_tail(server.log_path, lines=1)[:120]
            spinner.update(
                f"waiting for the server at {base_url} ({state}, {elapsed:.0f} s): {last}"
            )
            with suppress(subprocess.TimeoutExpired):
                server.process.wait(timeout=POLL_S)
            if server.exit_code() is not None:
                _report_early_exit(server)
            try:
                status, _ = _get(base_url + "/health", timeout=5)
                if status == 200:
                    state = "healthy, loading model list"
                    models = served_models(base_url, timeout=5)
                    _require_model(base_url, model, models)
                    return
                state = f"/health answered HTTP {status}"
            except ServerAnswerError as exc:
                state = str(exc)[:80]
            except OSError as exc:
                state = f"not answering yet ({_reason(exc)})"[:80]
            if elapsed > timeout_s:
                raise SystemFailedError(
                    f"the server at {base_url} was not ready after {timeout_s:.0f} s "
                    f"(launch.startup_timeout_s; log: {server.log_path})"
                )


def _report_early_exit(server: LaunchedServer) -> None:
    tail = read_tail(server.log_path)
    out.err_console.print(
        f"[bold]last lines of {server.log_path}:[/]", highlight=False, soft_wrap=True
    )
    out.err_console.print(
        tail or "(empty log)", markup=False, highlight=False, style="dim", soft_wrap=True
    )
    message = (
        f"the launched server exited with code {server.exit_code()} before it was ready "
        f"(log: {server.log_path})"
    )
    why = server.diagnosis()
    if why:
        message += f"; known failure: {why}"
    raise SystemFailedError(message)


def _write_record(path: Path, proc: subprocess.Popen, command: list[str], log_path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    record = {"pid": proc.pid, "pgid": proc.pid, "command": command, "log": str(log_path)}
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextmanager
def launched_server(
    launch: LaunchConfig,
    base_url: str,
    model: str,
    log_path: Path,
    env: dict[str, str],
    command: list[str] | None = None,
    record_path: Path | None = None,
) -> Iterator[LaunchedServer]:
    """Start the server (`command`, by default `launch.command`) with environment `env`, wait
    until it serves `model`, yield it, and always stop its process group. `record_path`, when
    given, gets the pid and command as soon as the process exists."""
    base_url = base_url.rstrip("/")
    command = list(command if command is not None else launch.command)
    check_port_free(base_url)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log, _sigterm_as_interrupt():
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise UsageError(
                f"cannot start the server {command[0]!r} ({exc.strerror or exc})"
            ) from None
        server = LaunchedServer(proc, log_path)
        try:
            if record_path is not None:
                _write_record(record_path, proc, command, log_path)
            _wait_ready(server, base_url, model, launch.startup_timeout_s)
            yield server
        finally:
            try:
                with out.status("stopping the server"):
                    stop_server(proc, launch.stop_timeout_s)
            except KeyboardInterrupt:  # a second Ctrl-C: no more grace period
                _signal_group(proc.pid, signal.SIGKILL)
                raise
