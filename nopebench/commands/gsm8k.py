"""`nopebench gsm8k`: check the inputs, start or check the server, evaluate, record, judge.

Everything that can be wrong before a single request (config, local data, the run to resume,
a given server that is down, a dataset that cannot be loaded, a results directory that cannot
be written) fails in one line with exit 2 and writes nothing. From then on the run has a
directory; a failure there is recorded in its run.json with the command that resumes it, and
a server that died, stalled or kept failing exits 4. The exit code is 0 when strict-match
reaches the config's threshold and 1 below it. A run of fewer problems than the full set
(--limit) is not judged against that threshold: it records its scores with their standard
errors, status `done`, exit 0.

A config with `attention_backend` is also exit 1 when the server's log does not show vLLM
selecting that backend: checked once the server is ready and before the first question, so
such a run asks nothing (see `backend`). Around the evaluation the server's own request
counters are read (vLLM's /metrics), and run.json records what the server says it answered.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from nopebench import console as out
from nopebench.commands.options import Gsm8kOptions
from nopebench.config import resolve_config_path
from nopebench.errors import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    NopebenchError,
    SystemFailedError,
    UsageError,
)
from nopebench.gsm8k.backend import BackendCheckFailed, check_backend
from nopebench.gsm8k.config import Gsm8kConfig, load_gsm8k_config
from nopebench.gsm8k.data import (
    TASK_NAME,
    LocalData,
    check_local_data,
    load_task,
    problem_count,
    task_yaml,
    write_task_dir,
)
from nopebench.gsm8k.evaluate import CACHE_FILE, EvaluationFailed, Outcome, run_lm_eval
from nopebench.gsm8k.progress import quiet_third_party_progress
from nopebench.gsm8k.resume import (
    cached_answers,
    copy_cache,
    previous_cache,
    resume_command,
    resumed_status,
    save_config,
)
from nopebench.gsm8k.server import (
    LaunchedServer,
    answered_between,
    check_port_free,
    check_server,
    launched_server,
    request_counts,
)
from nopebench.gsm8k.summary import print_summary, sample_rows, summarize, to_jsonable, write_jsonl
from nopebench.records import RunDir, check_results_root, write_json

SERVER_LOG = "server.log"
SERVER_RECORD = "server.json"


def execute(opts: Gsm8kOptions) -> int:
    config, base_url, limit, data = opts.config, opts.base_url, opts.limit, opts.data
    resume, results_dir = opts.resume, opts.results_dir
    with quiet_third_party_progress() as added_env:  # before lm-eval (and its tqdm) is imported
        cfg, local, previous = _preflight(config, base_url, limit, data, resume)
        check_results_root(results_dir)
        with tempfile.TemporaryDirectory(prefix="nopebench-gsm8k-") as task_dir:
            manager, task = load_task(
                write_task_dir(Path(task_dir), cfg.data, local), cfg.data, local
            )
            total = min(problem_count(task), cfg.limit or problem_count(task))
            run = _start_run(cfg, local, config, resume, previous, results_dir)
            hint = resume_command(config, base_url, limit, data, results_dir, run.path)
            try:
                outcome = _evaluate_recorded(cfg, task, manager, total, run, hint, added_env)
            except BackendCheckFailed as exc:
                run.finish(
                    "failed",
                    {
                        "error": exc.message,
                        "attention_backend": exc.record,
                        "asked": 0,
                        "total": total,
                    },
                )
                out.error_line(exc.message)
                return EXIT_CHECK_FAILED
            full = problem_count(task)
        return _record(cfg, run, outcome, local, full)


def _preflight(
    config: str, base_url: str | None, limit: int | None, data: Path | None, resume: Path | None
) -> tuple[Gsm8kConfig, LocalData | None, Path | None]:
    """Every check that needs no run directory: a failure here writes nothing."""
    cfg = load_gsm8k_config(config, base_url, limit, data)
    local_dir = cfg.data.local_dir()
    local = check_local_data(local_dir) if local_dir is not None else None
    previous = previous_cache(resume, cfg) if resume is not None else None
    if cfg.server.launch is None:
        log_file = cfg.server.log_file
        if cfg.attention_backend is not None and not Path(log_file).is_file():
            raise UsageError(
                f"server.log_file {log_file}: no such file (the given server's log, "
                f"read for its attention backend)"
            )
        check_server(cfg.server.base_url, cfg.model)
    else:
        check_port_free(cfg.server.base_url)
    return cfg, local, previous


def _start_run(
    cfg: Gsm8kConfig,
    local: LocalData | None,
    config: str,
    resume: Path | None,
    previous: Path | None,
    results_dir: Path | None,
) -> RunDir:
    """A fresh run directory with the effective config, the task, and a resumed run's answers."""
    run = RunDir.create("gsm8k", results_dir)
    save_config(run.path, cfg, str(resolve_config_path(config, "gsm8k")), resume)
    run.file("task.yaml").write_text(
        yaml.safe_dump(task_yaml(cfg.data, local), sort_keys=False), encoding="utf-8"
    )
    if previous is not None:
        copy_cache(previous, run.path)
        ended = resumed_status(resume)
        how = " (its process is gone: died)" if ended == "died" else ""
        out.console.print(
            f"resuming {resume}{how}: "
            f"{cached_answers(run.file(CACHE_FILE))} finished answers reused"
        )
    return run


def _evaluate_recorded(
    cfg: Gsm8kConfig, task, manager, total: int, run: RunDir, hint: str, added_env: bool
) -> Outcome:
    """Evaluate; a failure or Ctrl-C is written to run.json with the answers kept and the hint."""
    try:
        return _evaluate(cfg, task, manager, total, run, hint, added_env)
    except KeyboardInterrupt:
        kept = cached_answers(run.file(CACHE_FILE))
        run.finish(
            "interrupted",
            {"error": "interrupted", "answers_kept": kept, "total": total, "resume": hint},
        )
        out.err_console.print(
            f"interrupted with {kept} of {total} answers kept; resume with: {hint}",
            highlight=False,
            soft_wrap=True,
        )
        raise
    except NopebenchError as exc:
        run.finish(
            "error",
            {
                "error": str(exc),
                "answers_kept": cached_answers(run.file(CACHE_FILE)),
                "total": total,
                "resume": hint,
            },
        )
        raise


@contextmanager
def _server(cfg: Gsm8kConfig, run: RunDir, added_env: bool) -> Iterator[LaunchedServer | None]:
    """The launched server for the evaluation, or nothing when the config names a running one."""
    launch = cfg.server.launch
    if launch is None:
        yield None
        return
    env = {k: v for k, v in os.environ.items() if not (added_env and k == "TQDM_DISABLE")}
    env.update(launch.env)
    with launched_server(
        launch,
        cfg.server.base_url,
        cfg.model,
        run.file(SERVER_LOG),
        env,
        command=cfg.launch_command(),
        record_path=run.file(SERVER_RECORD),
    ) as server:
        yield server


def _check_backend(cfg: Gsm8kConfig, server: LaunchedServer | None) -> dict[str, Any] | None:
    """The backend the server's log shows, when the config requires one (else None); raises
    BackendCheckFailed, before any question, when the log shows another or none."""
    if cfg.attention_backend is None:
        return None
    log = server.log_path if server is not None else Path(cfg.server.log_file)
    return check_backend(cfg.attention_backend, log)


def _evaluate(
    cfg: Gsm8kConfig, task, manager, total: int, run: RunDir, hint: str, added_env: bool
) -> Outcome:
    with _server(cfg, run, added_env) as server:
        backend = _check_backend(cfg, server)
        before = request_counts(cfg.server.base_url, cfg.model)
        try:
            outcome = run_lm_eval(cfg, task, manager, total, run.path)
        except EvaluationFailed as exc:
            kept = cached_answers(run.path / CACHE_FILE)
            message = f"GSM8K stopped with {kept} of {total} answers kept: {exc.reason}"
            if server is not None:
                message += f"; {server.describe_failure()}"
            raise SystemFailedError(f"{message}; resume with: {hint}") from None
        counted = answered_between(before, request_counts(cfg.server.base_url, cfg.model))
        return dataclasses.replace(outcome, attention_backend=backend, server_requests=counted)


def _record(
    cfg: Gsm8kConfig, run: RunDir, outcome: Outcome, local: LocalData | None, full: int
) -> int:
    rows = sample_rows(outcome.results["samples"][TASK_NAME])
    summary = summarize(
        cfg,
        outcome.results,
        rows,
        outcome.wall_s,
        outcome.asked,
        outcome.from_cache,
        outcome.retries,
        full=full,
    )
    summary["data"] = (
        str(local.dir) if local is not None else f"{cfg.data.hub_path} ({cfg.data.hub_name})"
    )
    summary["attention_backend"] = outcome.attention_backend
    summary["server_requests"] = outcome.server_requests
    write_json(
        run.file("results.json"), {"summary": summary, "lm_eval": to_jsonable(outcome.results)}
    )
    write_jsonl(run.file("samples.jsonl"), rows)
    if summary["passed"] is None:  # a sample: scores with standard errors, no verdict
        run.finish("done", summary)
        print_summary(cfg, summary, run.path)
        return EXIT_OK
    run.finish("passed" if summary["passed"] else "failed", summary)
    print_summary(cfg, summary, run.path)
    return EXIT_OK if summary["passed"] else EXIT_CHECK_FAILED
