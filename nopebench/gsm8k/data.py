"""GSM8K problems for lm-eval: the hub's dataset or a local train/test jsonl directory.

Either way the task is lm-eval's own `gsm8k.yaml` (prompt, few-shot split, stop sequences,
both answer filters), included by a small task YAML that only renames it and, for local data,
points it at the files. It is loaded with `TaskManager(include_path=..., include_defaults=False)`
because indexing all of lm-eval's default tasks costs ~15 s and would pick up nothing we use.

Local files are checked line by line before lm-eval sees them, so a bad file is one line naming
the file and line rather than a traceback from deep inside `datasets`. With local data the run
is made offline (no model-hub look-up at all); a hub that cannot be reached and has no cached
copy is one line saying to pass `--data DIR`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nopebench import console as out
from nopebench.errors import UsageError
from nopebench.gsm8k.config import DataConfig

TASK_NAME = "nopebench_gsm8k"
SPLITS = ("train", "test")
OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@dataclass(frozen=True)
class LocalData:
    """A checked local dataset: absolute file paths and problem counts."""

    dir: Path
    files: dict[str, Path]
    counts: dict[str, int]


def _check_jsonl(path: Path) -> int:
    """Problems in one GSM8K jsonl file; any malformed line is a one-line `UsageError`."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"GSM8K data: cannot read {path} ({exc.__class__.__name__}: {exc})"
        ) from None
    count = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"GSM8K data: {path} line {number}: not JSON ({exc.msg})") from None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("question"), str)
            or not isinstance(row.get("answer"), str)
        ):
            raise UsageError(
                f"GSM8K data: {path} line {number}: needs string fields 'question' and 'answer'"
            )
        if "#### " not in row["answer"]:
            raise UsageError(
                f"GSM8K data: {path} line {number}: the answer does not end in '#### N'"
            )
        count += 1
    if count == 0:
        raise UsageError(f"GSM8K data: {path} holds no problems")
    return count


def check_local_data(directory: str | Path) -> LocalData:
    """train.jsonl and test.jsonl in `directory`, both well formed."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise UsageError(
            f"GSM8K data: {root} is not a directory (expected train.jsonl and test.jsonl in it)"
        )
    files = {split: root / f"{split}.jsonl" for split in SPLITS}
    missing = [p.name for p in files.values() if not p.is_file()]
    if missing:
        raise UsageError(
            f"GSM8K data: {root} has no {' or '.join(missing)} "
            "(expected train.jsonl and test.jsonl)"
        )
    return LocalData(root, files, {split: _check_jsonl(path) for split, path in files.items()})


def lm_eval_gsm8k_yaml() -> Path:
    """lm-eval's own task definition, which ours includes unchanged."""
    import lm_eval.tasks

    path = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml"
    if not path.is_file():
        raise UsageError(f"lm-eval has no gsm8k task at {path}; install lm-eval[api]==0.4.13")
    return path


def task_yaml(data: DataConfig, local: LocalData | None) -> dict[str, Any]:
    """Our task: lm-eval's gsm8k renamed, and for local data pointed at the files."""
    spec: dict[str, Any] = {"include": str(lm_eval_gsm8k_yaml()), "task": TASK_NAME, "tag": []}
    if local is None:
        spec.update(dataset_path=data.hub_path, dataset_name=data.hub_name)
    else:
        spec.update(
            dataset_path="json",
            dataset_name=None,
            dataset_kwargs={
                "data_files": {split: str(path) for split, path in local.files.items()}
            },
        )
    return spec


def write_task_dir(directory: Path, data: DataConfig, local: LocalData | None) -> Path:
    """The include_path lm-eval indexes: a directory holding our one task YAML."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{TASK_NAME}.yaml").write_text(
        yaml.safe_dump(task_yaml(data, local), sort_keys=False), encoding="utf-8"
    )
    return directory


@contextmanager
def offline(enabled: bool) -> Iterator[None]:
    """No model-hub traffic while loading local data.

    `datasets` and `huggingface_hub` read HF_HUB_OFFLINE when first imported, so setting the
    environment only helps a fresh process; when they are already imported (an earlier run in
    the same process) their module-level flags are switched too, and everything is restored after.
    """
    if not enabled:
        yield
        return
    saved_env = {name: os.environ.get(name) for name in OFFLINE_ENV}
    flags = [
        (sys.modules.get("datasets.config"), "HF_HUB_OFFLINE"),
        (sys.modules.get("datasets.config"), "HF_DATASETS_OFFLINE"),
        (sys.modules.get("huggingface_hub.constants"), "HF_HUB_OFFLINE"),
    ]
    saved_flags = [
        (mod, name, getattr(mod, name))
        for mod, name in flags
        if mod is not None and hasattr(mod, name)
    ]
    os.environ.update({name: "1" for name in OFFLINE_ENV})
    for mod, name, _ in saved_flags:
        setattr(mod, name, True)
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for mod, name, value in saved_flags:
            setattr(mod, name, value)


@contextmanager
def _quiet_hub_logs() -> Iterator[None]:
    """The hub client logs every retry of an unreachable host; the one-line error says it all."""
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__


def load_task(task_dir: Path, data: DataConfig, local: LocalData | None):
    """Build the lm-eval Task (this is where the dataset is read or downloaded)."""
    import datasets
    from lm_eval.tasks import TaskManager

    datasets.disable_progress_bars()
    where = local.dir if local is not None else f"{data.hub_path} from the model hub"
    with (
        offline(local is not None),
        _quiet_hub_logs(),
        out.err_console.status(f"loading GSM8K: {where}"),
    ):
        manager = TaskManager(include_path=str(task_dir), include_defaults=False)
        try:
            task = manager.load([TASK_NAME])["tasks"][TASK_NAME]
        except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; each becomes one line
            if local is not None:
                raise UsageError(
                    f"GSM8K data: cannot load {local.dir} ({_first_line(exc)})"
                ) from None
            raise UsageError(
                f"GSM8K data: cannot load {data.hub_path} ({data.hub_name}) "
                f"from the model hub or its cache ({_first_line(exc)}); "
                "pass --data DIR with train.jsonl and test.jsonl to run offline"
            ) from None
    return manager, task


def problem_count(task: Any) -> int:
    """Problems in the test split (before --limit)."""
    return len(task.test_docs())
