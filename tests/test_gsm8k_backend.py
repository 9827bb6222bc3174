"""The attention-backend check: a config's `attention_backend` must be what vLLM's own selection
line in the server log names, in either of its forms, or the run fails with exit 1 and one line
before a question is sent. Launch mode passes `--attention-backend` to the server; attach mode
reads the log file the config names. Crafted log lines stand in for vLLM's here; the real CPU
server's log is checked in the end-to-end test."""

from __future__ import annotations

import os
import sys

import pytest
from fake_openai_server import FakeOpenAIServer, write_dataset
from gsm8k_helpers import (
    FAKE_SERVER,
    free_port,
    gsm8k_cli,
    isolate_hf_cache,
    only_run,
    read_json,
    write_config,
)

from nopebench.commands import gsm8k
from nopebench.commands.options import Gsm8kOptions
from nopebench.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE
from nopebench.gsm8k.backend import BackendCheckFailed, check_backend, selections

SM120 = "FLASHINFER_MLA_SPARSE_SM120"
# The forms vLLM's platform code logs (process prefix, level, time, file:line as it prints them).
AUTO = (
    "(EngineCore_DP0 pid=4121) INFO 12-01 10:02:03 [cuda.py:507] "
    "Using FLASHINFER_MLA_SPARSE_SM120 attention backend out of potential backends: "
    "['FLASHINFER_MLA_SPARSE_SM120', 'FLASHMLA_SPARSE']."
)
FORCED = (
    "(Worker_TP0 pid=4188) INFO 12-01 10:02:03 [cuda.py:446] Using "
    "AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120 backend."
)
FORCED_PLAIN = (
    "(Worker_TP1 pid=4189) INFO 12-01 10:02:03 [cuda.py:446] "
    "Using FLASHINFER_MLA_SPARSE_SM120 backend."
)
OTHER_AUTO = (
    "(Worker_TP2 pid=4190) INFO 12-01 10:02:04 [cuda.py:507] "
    "Using FLASHMLA_SPARSE attention backend out of potential backends: ['FLASHMLA_SPARSE']."
)
OTHER_FORCED = (
    "(Worker pid=77) INFO 12-01 10:02:04 [cuda.py:446] "
    "Using AttentionBackendEnum.TRITON_MLA backend."
)
ROCM_AUTO = (
    "INFO [rocm.py:850] Using ROCM_AITER_MLA_SPARSE backend out of potential backends: "
    "['ROCM_AITER_MLA_SPARSE']."
)
ROCM_FORCED = "INFO [rocm.py:750] Using ROCM_AITER_MLA backend (selected via --attention-backend)."
# Lines that mention a backend but are not the attention selection.
PREFIX = "(Worker pid=7) INFO 12-01 10:02:03 "
NOT_SELECTIONS = [
    PREFIX + "[selector.py:106] Using FLASHINFER MLA prefill backend.",
    PREFIX
    + "[cpu.py:178] Cannot use AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120 backend on CPU.",
    PREFIX + "[mxfp8.py:139] Using 'FLASHINFER_CUTLASS' MxFp8 MoE backend.",
    PREFIX + "[base.py:123] Using Transformers modeling backend.",
    PREFIX
    + "[api_utils.py:286] non-default args: {'attention_backend': 'FLASHINFER_MLA_SPARSE_SM120'}",
]


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


def _log(tmp_path, *lines: str):
    path = tmp_path / "vllm.log"
    path.write_text("INFO starting\n" + "\n".join(lines) + "\nINFO ready\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("line", "name", "forced"),
    [
        (AUTO, SM120, False),
        (FORCED, SM120, True),
        (FORCED_PLAIN, SM120, True),
        (OTHER_AUTO, "FLASHMLA_SPARSE", False),
        (OTHER_FORCED, "TRITON_MLA", True),
        (ROCM_AUTO, "ROCM_AITER_MLA_SPARSE", False),
        (ROCM_FORCED, "ROCM_AITER_MLA", True),
    ],
)
def test_both_forms_of_the_selection_line_are_read(line, name, forced):
    [found] = selections(f"noise\n{line}\nmore noise")
    assert (found.backend, found.forced) == (name, forced)


def test_lines_that_are_not_the_attention_selection_are_not_read():
    assert selections("\n".join(NOT_SELECTIONS)) == []


@pytest.mark.parametrize(
    "lines",
    [[AUTO], [FORCED], [FORCED, FORCED_PLAIN, *NOT_SELECTIONS]],
    ids=["auto", "forced", "forced-on-two-ranks"],
)
def test_the_required_backend_passes_and_is_recorded(tmp_path, lines):
    record = check_backend(SM120, _log(tmp_path, *lines))
    assert record["required"] == record["selected"] == SM120
    assert record["lines"] == len([line for line in lines if line not in NOT_SELECTIONS])
    assert record["forced"] == (lines != [AUTO])


@pytest.mark.parametrize(
    ("lines", "named"),
    [
        ([OTHER_AUTO], "FLASHMLA_SPARSE"),
        ([OTHER_FORCED], "TRITON_MLA"),
        ([FORCED, OTHER_AUTO], "FLASHMLA_SPARSE"),  # one rank on another backend is enough to fail
    ],
    ids=["auto-other", "forced-other", "mixed"],
)
def test_another_backend_fails_in_one_line_naming_it(tmp_path, lines, named):
    with pytest.raises(BackendCheckFailed) as err:
        check_backend(SM120, _log(tmp_path, *lines))
    message = err.value.message
    assert "\n" not in message
    assert f"shows vLLM using {named}, not {SM120}" in message and "no question was sent" in message


def test_no_selection_line_fails_saying_the_log_names_none(tmp_path):
    with pytest.raises(BackendCheckFailed) as err:
        check_backend(SM120, _log(tmp_path, *NOT_SELECTIONS))
    message = err.value.message
    assert "\n" not in message
    assert (
        "names no attention backend" in message
        and f"nothing shows that {SM120} served the run" in message
    )
    # vLLM's CPU platform says why it ignored --attention-backend: the line is quoted.
    assert (
        "the log says: Cannot use AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120 backend on CPU."
        in message
    )
    assert err.value.record["selected"] is None and err.value.record["lines"] == 0


def test_an_unreadable_log_fails(tmp_path):
    with pytest.raises(BackendCheckFailed, match="cannot read the server log"):
        check_backend(SM120, tmp_path / "missing.log")


# ---------------------------------------------------------------- through the command


def _launch(tmp_path, say: list[str], **fields):
    write_dataset(tmp_path / "data", n_test=3)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        str(FAKE_SERVER),
        "--port",
        str(port),
        "--data",
        str(tmp_path / "data"),
    ]
    for line in say:
        command += ["--say", line]
    return write_config(
        tmp_path / "cfg.yaml",
        base_url,
        attention_backend=SM120,
        server={"base_url": base_url, "launch": {"command": command}},
        **fields,
    )


def test_launched_server_gets_the_flag_and_a_matching_log_passes(tmp_path):
    cfg = _launch(tmp_path, [FORCED])
    assert (
        gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
        )
        == EXIT_OK
    )
    run = only_run(tmp_path / "results")
    log = (run / "server.log").read_text()
    assert f"attention backend argument: {SM120}" in log  # the harness passed --attention-backend
    summary = read_json(run / "run.json")["summary"]
    assert (
        summary["attention_backend"]["selected"] == SM120 and summary["attention_backend"]["forced"]
    )
    assert read_json(run / "config.json")["fingerprint"]["attention_backend"] == SM120
    assert read_json(run / "server.json")["command"][-2:] == ["--attention-backend", SM120]


@pytest.mark.parametrize(
    ("say", "expected"),
    [
        ([OTHER_FORCED], f"shows vLLM using TRITON_MLA, not {SM120}"),
        ([], "names no attention backend"),
    ],
    ids=["other", "none"],
)
def test_launched_server_with_another_or_no_backend_fails_before_any_question(
    tmp_path, capsys, say, expected
):
    cfg = _launch(tmp_path, say)
    code = gsm8k.execute(
        Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
    )
    assert code == EXIT_CHECK_FAILED
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and expected in err[0]
    run = only_run(tmp_path / "results")
    record = read_json(run / "run.json")
    assert record["status"] == "failed" and expected in record["summary"]["error"]
    assert "request for:" not in (run / "server.log").read_text()  # the server was asked nothing
    assert not (run / "requests_rank0.db").exists()


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


def test_attach_mode_reads_the_named_log_and_fails_with_exit_1(tmp_path, env):
    problems = write_dataset(tmp_path / "data", n_test=3)
    log = _log(tmp_path, OTHER_AUTO)
    with FakeOpenAIServer(problems) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            server.base_url,
            attention_backend=SM120,
            server={"base_url": server.base_url, "log_file": str(log)},
        )
        proc = gsm8k_cli(cfg, tmp_path / "data", tmp_path / "results", env=env)
        received, _ = server.snapshot()
    assert proc.returncode == EXIT_CHECK_FAILED
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"shows vLLM using FLASHMLA_SPARSE, not {SM120}" in lines[0], (
        proc.stderr
    )
    assert sum(received.values()) == 0


def test_attach_mode_with_the_right_log_passes_and_v1_base_url_is_taken(tmp_path):
    problems = write_dataset(tmp_path / "data", n_test=3)
    log = _log(tmp_path, AUTO)
    with FakeOpenAIServer(problems) as server:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            "http://127.0.0.1:9",
            attention_backend=SM120,
            server={"base_url": "http://127.0.0.1:9", "log_file": str(log)},
        )
        code = gsm8k.execute(
            Gsm8kOptions(
                str(cfg),
                server.base_url + "/v1",
                None,
                tmp_path / "data",
                None,
                tmp_path / "results",
            )
        )
        received, _ = server.snapshot()
    assert code == EXIT_OK
    summary = read_json(only_run(tmp_path / "results") / "run.json")["summary"]
    assert summary["attention_backend"]["selected"] == SM120 and summary["attention_backend"][
        "log"
    ] == str(log)
    assert sum(received.values()) == 3


def test_attach_mode_without_a_log_is_refused_in_one_line(tmp_path, env):
    write_dataset(tmp_path / "data", n_test=1)
    with FakeOpenAIServer([]) as server:
        no_key = write_config(tmp_path / "a.yaml", server.base_url, attention_backend=SM120)
        no_file = write_config(
            tmp_path / "b.yaml",
            server.base_url,
            attention_backend=SM120,
            server={"base_url": server.base_url, "log_file": str(tmp_path / "gone.log")},
        )
        procs = [
            gsm8k_cli(c, tmp_path / "data", tmp_path / "results", env=env)
            for c in (no_key, no_file)
        ]
    assert [p.returncode for p in procs] == [EXIT_USAGE, EXIT_USAGE]
    assert "set server.log_file to that server's log" in procs[0].stderr
    assert "gone.log: no such file" in procs[1].stderr
    assert not (tmp_path / "results").exists()
