"""Launch mode: the harness starts the server in its own process group, waits for /health and
/v1/models, streams its log to the run directory, explains an early death by its log, and
always stops the whole group (normal end, failure, timeout, SIGTERM/Ctrl-C)."""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest
from fake_openai_server import FakeOpenAIServer, write_dataset
from gsm8k_helpers import (
    FAKE_SERVER,
    free_port,
    isolate_hf_cache,
    only_run,
    process_gone,
    read_json,
    wait_for,
    write_config,
)

from nopebench.commands import gsm8k
from nopebench.commands.options import Gsm8kOptions
from nopebench.errors import EXIT_OK, SystemFailedError, UsageError
from nopebench.gsm8k.config import LaunchConfig
from nopebench.gsm8k.server import launched_server


@pytest.fixture(autouse=True)
def _hf_cache(monkeypatch, tmp_path_factory):
    isolate_hf_cache(monkeypatch, tmp_path_factory.mktemp("hf"))


def _shell(script: str) -> list[str]:
    return ["sh", "-c", script]


def _pid(path) -> int:
    return int(path.read_text().strip())


def _launch_config(tmp_path, command, **launch):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [part.replace("{port}", str(port)) for part in command]
    return write_config(
        tmp_path / "cfg.yaml",
        base_url,
        server={"base_url": base_url, "launch": {"command": command, **launch}},
    )


def test_launched_server_is_used_then_its_whole_group_stopped(tmp_path):
    write_dataset(tmp_path / "data", n_test=5)
    # The shell records its pid (the group leader, exec'd into the server) and starts a
    # background worker, like vLLM's per-GPU workers: both must be gone after the run.
    script = (
        f"echo $$ > {tmp_path}/leader; sleep 300 & echo $! > {tmp_path}/worker; "
        f"exec {sys.executable} {FAKE_SERVER} --port {{port}} --data {tmp_path / 'data'}"
    )
    cfg = _launch_config(tmp_path, _shell(script))
    assert (
        gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
        )
        == EXIT_OK
    )
    run = only_run(tmp_path / "results")
    assert read_json(run / "run.json")["summary"]["strict_match"] == 1.0
    assert "serving fake-model" in (run / "server.log").read_text()
    assert process_gone(_pid(tmp_path / "leader"))
    assert process_gone(_pid(tmp_path / "worker"))


def test_early_exit_shows_the_log_tail_and_names_the_missing_fix(tmp_path, capsys):
    code = (
        "print('INFO loading weights', flush=True); "
        "print('RuntimeError: concat_and_cache_mla, cache_kernels.cu:866, "
        "pe_dim must be 64 for fp8_ds_mla'); "
        "raise SystemExit(3)"
    )
    cfg = _launch_config(tmp_path, [sys.executable, "-c", code])
    with pytest.raises(SystemFailedError) as err:
        gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, _data(tmp_path), None, tmp_path / "results")
        )
    message = str(err.value)
    assert "\n" not in message
    assert "exited with code 3 before it was ready" in message
    assert "concat_and_cache_mla accepting pe_dim in {64, 0}" in message
    assert (
        "pe_dim must be 64 for fp8_ds_mla" in capsys.readouterr().err
    )  # the tail, shown above the error
    run = only_run(tmp_path / "results")
    assert read_json(run / "run.json")["status"] == "error"
    assert "INFO loading weights" in (run / "server.log").read_text()


def test_startup_timeout_stops_the_server(tmp_path):
    cfg = _launch_config(
        tmp_path, _shell(f"echo $$ > {tmp_path}/leader; exec sleep 300"), startup_timeout_s=1.0
    )
    with pytest.raises(SystemFailedError, match=r"was not ready after 1 s"):
        gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, _data(tmp_path), None, tmp_path / "results")
        )
    assert process_gone(_pid(tmp_path / "leader"))


def test_server_dying_mid_run_is_explained_and_resumable(tmp_path):
    write_dataset(tmp_path / "data", n_test=8)
    cfg = _launch_config(
        tmp_path,
        [
            sys.executable,
            str(FAKE_SERVER),
            "--port",
            "{port}",
            "--data",
            str(tmp_path / "data"),
            "--crash-after",
            "3",
        ],
    )
    text = cfg.read_text().replace("max_retries: 3", "max_retries: 2")
    cfg.write_text(text)
    with pytest.raises(SystemFailedError) as err:
        gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, tmp_path / "data", None, tmp_path / "results")
        )
    message = str(err.value)
    run = only_run(tmp_path / "results")
    kept = int(re.search(r"with (\d+) of 8 answers kept", message).group(1))
    assert kept <= 3 and kept == read_json(run / "run.json")["summary"]["answers_kept"]
    assert "the server exited with code 1" in message
    assert "sparse page-table capacity fix" in message
    assert f"--resume {run}" in message


def test_sigterm_to_the_harness_still_stops_the_server(tmp_path):
    launch = LaunchConfig(
        command=_shell(
            f"echo $$ > {tmp_path}/leader; sleep 300 & echo $! > {tmp_path}/worker; "
            f"exec {sys.executable} {FAKE_SERVER} --port {{port}} --data {_data(tmp_path)}"
        )
    )
    port = free_port()
    launch = launch.model_copy(
        update={"command": [c.replace("{port}", str(port)) for c in launch.command]}
    )
    with (
        pytest.raises(KeyboardInterrupt),
        launched_server(
            launch,
            f"http://127.0.0.1:{port}",
            "fake-model",
            tmp_path / "server.log",
            dict(os.environ),
        ),
    ):
        wait_for(lambda: (tmp_path / "worker").is_file(), 10, "the worker pid file")
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(
            lambda: False, 10, "SIGTERM to interrupt the harness"
        )  # interrupted before this fails
    assert process_gone(_pid(tmp_path / "leader"))
    assert process_gone(_pid(tmp_path / "worker"))
    assert (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )  # the harness's handler is removed again


def _data(tmp_path):
    if not (tmp_path / "data").is_dir():
        write_dataset(tmp_path / "data", n_test=3)
    return tmp_path / "data"


def test_launch_refuses_a_port_already_in_use(tmp_path):
    with FakeOpenAIServer([]) as other:
        cfg = write_config(
            tmp_path / "cfg.yaml",
            other.base_url,
            server={"base_url": other.base_url, "launch": {"command": ["true"]}},
        )
        with pytest.raises(UsageError, match=f"something already listens at {other.base_url}"):
            gsm8k.execute(
                Gsm8kOptions(str(cfg), None, None, _data(tmp_path), None, tmp_path / "results")
            )
    assert not (tmp_path / "results").exists()


def test_a_launch_command_that_cannot_start_is_one_line(tmp_path):
    cfg = _launch_config(tmp_path, [str(tmp_path / "no-such-vllm"), "serve", "m"])
    with pytest.raises(
        UsageError, match=r"cannot start the server '.*no-such-vllm' \(No such file or directory\)"
    ):
        gsm8k.execute(
            Gsm8kOptions(str(cfg), None, None, _data(tmp_path), None, tmp_path / "results")
        )
